"""Record what a real vLLM server answers to teacher-forced scoring requests: the fixture
tests/fixtures/vllm_cpu_0.32_scoring.json that the stub server's scoring is checked against.

Starts one server of the bundled bf16 model (60-110 s on a 2-core CPU), generates a short greedy
answer, scores it with `prompt_logprobs: 3` (`continue_final_message`, `return_token_ids`), asks
`/tokenize` where the answer begins, and records two refusals (k above --max-logprobs, a stream).

    python benchmarks/scoring_probe.py [--out tests/fixtures/vllm_cpu_0.32_scoring.json]
"""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from evalkit.engines.bundled import resolve_model
from evalkit.engines.vllm_server import VLLMServer, engine_version
from evalkit.host import this_host
from evalkit.paths import cache_dir

ARGS = ["--max-model-len", "4096", "--enforce-eager", "--no-enable-prefix-caching", "--dtype", "bfloat16",
        "--kv-cache-memory-bytes", str(400 * 2**20), "--enable-per-request-metrics"]
MESSAGES = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Say hello to Ann."}]


def post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("tests/fixtures/vllm_cpu_0.32_scoring.json"))
    a = ap.parse_args()
    model = resolve_model("bundled:smollm2-135m-instruct")
    with VLLMServer(model, "base", ARGS, cache_dir() / "logs" / "scoring_probe.log", cache_dir=cache_dir()) as s:
        chat, tok = s.base_url + "/v1/chat/completions", s.base_url + "/tokenize"
        gen_req = {"max_tokens": 12, "temperature": 0}
        _, gen = post(chat, {"model": "base", "messages": MESSAGES, **gen_req})
        answer = gen["choices"][0]["message"]["content"]
        full = [*MESSAGES, {"role": "assistant", "content": answer}]
        score_req = {"prompt_logprobs": 3, "continue_final_message": True, "add_generation_prompt": False,
                     "max_tokens": 1, "temperature": 0, "return_token_ids": True}
        _, score = post(chat, {"model": "base", "messages": full, **score_req})
        prefix_req = {"add_generation_prompt": True}
        _, prefix = post(tok, {"model": "base", "messages": MESSAGES, **prefix_req})
        full_req = {"add_generation_prompt": False, "continue_final_message": True, "return_token_strs": True}
        _, tokens = post(tok, {"model": "base", "messages": full, **full_req})
        k_status, k_big = post(chat, {"model": "base", "messages": full, **score_req, "prompt_logprobs": 50})
        s_status, stream = post(chat, {"model": "base", "messages": full, **score_req, "stream": True})
    host = this_host()
    fixture = {
        "about": f"{engine_version()} serving bundled:smollm2-135m-instruct ({' '.join(ARGS)}) on {host.get('cpu_model')}: "
                 "the answers of a real server to teacher-forced scoring requests (benchmarks/scoring_probe.py)",
        "messages": MESSAGES,
        "generation": {"request": gen_req, "response": gen},
        "scoring": {"request": score_req, "response": score},
        "tokenize_prefix": {"request": prefix_req, "response": prefix},
        "tokenize_full": {"request": full_req, "response": tokens},
        "refused_k_above_max_logprobs": {"request": {"prompt_logprobs": 50}, "status": k_status, "response": k_big},
        "refused_stream": {"request": {"stream": True}, "status": s_status, "response": stream},
    }
    a.out.write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
