"""Keep secrets out of everything evalkit stores or prints."""

from __future__ import annotations

import os
import re

SECRET_FLAGS = {"--api-key", "--hf-token", "--token"}
# Shapes of common secrets: OpenAI/Anthropic-style keys, HF tokens, bearer headers.
SECRET_PATTERNS = [
    (re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"), "[REDACTED]"),
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}"), "[REDACTED]"),
    (re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]{12,}"), r"\1[REDACTED]"),
]
SECRET_ENV_HINT = re.compile(r"(?i)(key|token|secret|password)")


def _secret_env_values() -> list[str]:
    return [v for k, v in os.environ.items() if SECRET_ENV_HINT.search(k) and len(v) >= 8]


def redact(text: str | None) -> str | None:
    """Replace known secret shapes and the values of secret-looking env variables."""
    if not text:
        return text
    for v in _secret_env_values():
        text = text.replace(v, "[REDACTED]")
    for pat, repl in SECRET_PATTERNS:
        text = pat.sub(repl, text)
    return text


def redact_args(args: list[str]) -> list[str]:
    out: list[str] = []
    hide_next = False
    for a in args:
        if hide_next:
            out.append("[REDACTED]")
            hide_next = False
            continue
        flag, eq, _ = a.partition("=")
        if flag in SECRET_FLAGS:
            if eq:
                out.append(f"{flag}=[REDACTED]")
            else:
                out.append(a)
                hide_next = True
            continue
        out.append(redact(a) or a)
    return out
