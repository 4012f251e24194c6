"""The order variants are sent in (issue 47): a comparison is paired in time.

Every interval evalkit prints covers sampling noise between cases, none covers the machine
changing between variants. So by default the variants alternate:

- `alternate` (the default where every variant can be up at once): all servers up; on a
  sequential level each case's requests — every variant, every repeat, the baseline's noise-floor
  pass too — are sent next to each other in a randomized, balanced order; on a loaded level
  (concurrency, rate, sweep, trace, replicas) the cases go in chunks, and each chunk is sent to
  every variant in turn as a block of the level's load (A B, then B A, ...), so the two sides of a
  case ran minutes apart at most, never a whole run apart. The cases of a chunk ran under one
  state of the machine, so a chunk is one pair of the level's verdicts (`reporting.pairing`).
- `blocks` (only one variant fits at a time): one server up at a time, chunks of at least
  `MIN_BLOCK` cases a variant in balanced A B B A order; the switch is vLLM's sleep mode where the
  server has it (`--enable-sleep-mode`), else a restart, and its time is recorded.
- `sequential`: one variant after the other, only when asked; every latency verdict then says its
  sides ran at different times.
- `parallel`: Ray's variants run as tasks at the same time (on one node or several).

Balanced: with k items to a group, the groups cycle through all k! orders in a seeded shuffle
(k ≤ 4), so each item is first, second, ... equally often; a position effect is estimated from it.
Each request records its block and position (`requests.order_block`, `requests.order_position`)."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import UsageError

ORDERS = ("alternate", "blocks", "sequential", "parallel")
MIN_BLOCK = 6  # cases a variant sends per block when one server is up at a time (the floor)
T = TypeVar("T")


@dataclass(frozen=True)
class Order:
    """How a run's variants share time: its kind, the cases in a loaded level's chunk (0: chosen
    from the level), the seed of the balanced orders, why this order was chosen, and the fewest
    chunks a level is cut into (the pairs its verdicts need: a chunk is one pair, `reporting.pairing`)."""

    kind: str = "alternate"
    chunk: int = 0
    seed: int = 0
    why: str = ""
    min_blocks: int = 4

    @property
    def alternates(self) -> bool:
        return self.kind in ("alternate", "blocks")

    def record(self) -> dict[str, Any]:
        return {"order": self.kind, "order_chunk": self.chunk, "order_seed": self.seed, "order_why": self.why,
                "order_min_blocks": self.min_blocks}

    @classmethod
    def from_record(cls, d: dict[str, Any]) -> Order:
        kind = d.get("order") or ("alternate" if d.get("interleave") else "sequential")  # a run from before orders
        return cls(kind, int(d.get("order_chunk") or 0), int(d.get("order_seed") or d.get("seed") or 0),
                   d.get("order_why") or "", int(d.get("order_min_blocks") or 4))

    def chunk_for(self, concurrency: int, n_cases: int) -> int:
        """Cases in a chunk of a loaded level: enough to keep the level's load in flight for most of
        the block (four times its concurrency), but few enough that the level makes twice
        `min_blocks` chunks, since each chunk is one pair of the level's verdicts (at the fewest
        pairs that can decide, only the clearest differences are; more chunks decide more often:
        docs/verdicts.md); never fewer than the concurrency."""
        if self.chunk:
            return self.chunk
        return max(concurrency, min(4 * concurrency, n_cases // (2 * max(4, self.min_blocks))))

    def cases_per_pair(self, concurrency: int = 1, sequential: bool = True) -> int:
        """The fewest cases that make one pair of a level's verdicts: one where each case is its own
        group; a chunk where the variants alternate in chunks (a loaded level: its concurrency at
        least; `blocks`: `MIN_BLOCK` cases at least)."""
        if self.kind == "blocks":
            return max(MIN_BLOCK, self.chunk)
        if self.kind in ("alternate", "") and not sequential:  # "": not yet decided, alternation the default
            return max(concurrency, self.chunk, 1)
        return 1


def balanced(items: Sequence[T], seed: int) -> Iterator[list[T]]:
    """Orders of ``items``, one per group, without end: all k! orders in a seeded shuffle, then again
    (k ≤ 4), so over any k! groups each item stands in each position equally often; larger k: a
    seeded shuffle each time, rotated so the first position still cycles through every item."""
    rng = random.Random(seed)
    k = len(items)
    if k <= 1:
        while True:
            yield list(items)
    if k <= 4:
        perms = [list(p) for p in itertools.permutations(items)]
        while True:
            rng.shuffle(perms)
            yield from ([*p] for p in perms)
    turn = 0
    while True:
        p = list(items)
        rng.shuffle(p)
        i = p.index(items[turn % k])
        yield p[i:] + p[:i]
        turn += 1


def chunks(seq: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for i in range(0, len(seq), max(1, size)):
        yield seq[i:i + size]


def host_order(asked: str | None, *, variants: int, launched: int, fit_together: tuple[bool, str], ray: bool,
               adaptive: bool, interleave: bool) -> Order:
    """The order a run takes, and why (said before anything is sent). ``asked``: `--order`;
    ``fit_together``: whether every launched server fits this machine at once, and the memory
    planner's reason; ``adaptive``: a search, whose probes each variant chooses from its own outcomes."""
    if interleave:
        asked = asked or "alternate"
        if asked != "alternate":
            raise UsageError(f"--interleave is --order alternate: it does not combine with --order {asked}")
    if asked is not None and asked not in ORDERS:
        raise UsageError(f"--order must be one of {', '.join(ORDERS)}, not {asked!r}")
    fits, why_fit = fit_together
    if variants < 2:
        return Order("sequential", why="one variant: nothing to alternate")
    if ray:
        if asked not in (None, "parallel"):
            raise UsageError(f"--order {asked}: on Ray each variant runs as its own task, all at once (--order "
                             "parallel); alternate them on one machine without --ray")
        return Order("parallel", why="on Ray each variant is a task of its own, run at the same time as the others")
    if asked == "parallel":
        raise UsageError("--order parallel is Ray's (each variant a task of its own): use it with --ray")
    if adaptive:
        if asked not in (None, "sequential"):
            raise UsageError(f"--order {asked}: a search chooses each variant's probes from that variant's own "
                             "outcomes, so its variants go one after the other (--order sequential)")
        return Order("sequential", why="a search chooses each variant's probes from its own outcomes; its frontier "
                                       "compares no pairs")
    if asked == "sequential":
        return Order("sequential", why="asked (--order sequential): every latency verdict says its sides ran at "
                                       "different times")
    if asked == "alternate" and launched and not fits:
        raise UsageError(f"--order alternate needs every variant up at once, and {why_fit}: use --order blocks")
    if asked == "blocks" or (launched and not fits):
        return Order("blocks", why=why_fit if not fits else "asked (--order blocks)")
    return Order("alternate", why=why_fit if launched else "every variant is an endpoint, all up at once")
