"""Suite specs (`instructions,arithmetic,gsm8k:FILE`) into suites, and suites into cases with a
seeded, stratified subset.

A spec is a comma-separated list of `NAME` (a shipped suite: instructions, arithmetic, choice) or
`NAME:FILE` (a standard set read from the user's file: gsm8k, mmlu, arc, ifeval). An unknown
name, a shipped suite given a file, a standard set without one, or a name listed twice is one
SuiteError line that lists the known names.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import SuiteError
from ..spec.dataset import Case
from .arithmetic import shipped_arithmetic
from .choice import shipped_choice
from .instructions import Unknown, shipped_instructions
from .items import Suite
from .readers import READERS, read_ifeval

SHIPPED: dict[str, Callable[[], Suite]] = {"instructions": shipped_instructions, "arithmetic": shipped_arithmetic,
                                           "choice": shipped_choice}
FROM_FILE = tuple(READERS)


def known_names() -> str:
    """`arc:FILE, arithmetic, choice, ...`: what an error lists."""
    return ", ".join(sorted([*SHIPPED, *(f"{n}:FILE" for n in FROM_FILE)]))


@dataclass(frozen=True)
class SuiteSpec:
    name: str
    file: Path | None = None

    def __str__(self) -> str:
        return self.name if self.file is None else f"{self.name}:{self.file}"


def parse_specs(text: str | list[str]) -> list[SuiteSpec]:
    """`instructions,gsm8k:data/test.jsonl` (or a list of such strings) as specs, checked."""
    parts = [p.strip() for t in ([text] if isinstance(text, str) else text) for p in t.split(",")]
    parts = [p for p in parts if p]
    if not parts:
        raise SuiteError(f"no suite named (known: {known_names()})")
    out: list[SuiteSpec] = []
    for part in parts:
        name, sep, file = part.partition(":")
        name, file = name.strip().lower(), file.strip()
        if name in SHIPPED:
            if sep:
                raise SuiteError(f"suite '{name}' is shipped with evalkit and takes no file (got '{part}'; known: "
                                 f"{known_names()})")
            spec = SuiteSpec(name)
        elif name in FROM_FILE:
            if not file:
                raise SuiteError(f"suite '{name}' reads your copy of the set: give it as {name}:FILE (known: "
                                 f"{known_names()})")
            spec = SuiteSpec(name, Path(file))
        else:
            raise SuiteError(f"unknown suite '{name}' (known: {known_names()})")
        if any(s.name == spec.name for s in out):
            raise SuiteError(f"suite '{name}' is listed twice; name it once (a folder holds several files for mmlu and "
                             "arc)")
        out.append(spec)
    return out


def load_suite(spec: SuiteSpec, unknown: Unknown = "error") -> Suite:
    """One suite's items. ``unknown``: what an `ifeval:FILE` does with an instruction id evalkit has
    no checker for ("error", or "skip" it with a note on the suite)."""
    if spec.file is None:
        return SHIPPED[spec.name]()
    if spec.name == "ifeval":
        return read_ifeval(spec.file, unknown)
    return READERS[spec.name](spec.file)


def _specs(specs: str | list[str] | list[SuiteSpec]) -> list[SuiteSpec]:
    if isinstance(specs, list) and specs and all(isinstance(s, SuiteSpec) for s in specs):
        return [s for s in specs if isinstance(s, SuiteSpec)]
    return parse_specs([str(s) for s in specs] if isinstance(specs, list) else specs)


def load_suites(specs: str | list[str] | list[SuiteSpec], unknown: Unknown = "error") -> list[Suite]:
    """The suites a spec string (or parsed specs) names, in order."""
    return [load_suite(s, unknown) for s in _specs(specs)]


def _round_robin(groups: list[list[Case]]) -> list[Case]:
    out: list[Case] = []
    for i in range(max((len(g) for g in groups), default=0)):
        out += [g[i] for g in groups if i < len(g)]
    return out


def stratified(cases: list[Case], limit: int | None, seed: int = 0) -> list[Case]:
    """``limit`` cases spread evenly over suites, and within a suite over its categories, seeded:
    each category's cases in a seeded shuffle, the categories taken in turn (in a seeded order, so
    a small limit favours none by name), then the suites in turn. Any prefix is balanced too."""
    if limit is None:
        return list(cases)
    if limit < 1:
        raise SuiteError(f"limit must be at least 1, got {limit}")
    by: dict[str, dict[str, list[Case]]] = defaultdict(lambda: defaultdict(list))
    for c in sorted(cases, key=lambda c: c.id):
        by[str(c.attributes.get("suite"))][str(c.attributes.get("category"))].append(c)
    rng = random.Random(seed)
    per_suite = []
    for suite in sorted(by):
        cats = sorted(by[suite])
        rng.shuffle(cats)
        for k in cats:
            rng.shuffle(by[suite][k])
        per_suite.append(_round_robin([by[suite][k] for k in cats]))
    return _round_robin(per_suite)[:limit]


def suite_cases(specs: str | list[str] | list[SuiteSpec], limit: int | None = None, seed: int = 0,
                unknown: Unknown = "error") -> list[Case]:
    """Every item of the named suites as a case (`suite/<name>/<item id>`); with ``limit`` a seeded
    subset stratified by suite and category."""
    cases = [c for s in load_suites(specs, unknown) for c in s.cases()]
    return stratified(cases, limit, seed)
