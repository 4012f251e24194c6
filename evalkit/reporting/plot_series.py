"""Chart points held compactly and made when drawn (issue 37): the charts of a run of millions
hold a few bytes a point, not a Python pair, and draw the same points as from every row."""

from __future__ import annotations

import random
from array import array
from collections.abc import Iterator
from typing import Any

JITTER = 0.15  # a scatter of levels (1-5 and the like) is jittered this far each way, x and y


class Pairs:
    """(x, y) points kept as two arrays: iterated as tuples, counted without building them."""

    def __init__(self, xs: Any, ys: Any) -> None:
        self.xs, self.ys = xs, ys

    def __len__(self) -> int:
        return len(self.xs)

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        return zip(self.xs, self.ys, strict=True)

    def __bool__(self) -> bool:
        return len(self.xs) > 0


class Packed:
    """Values a byte each while every one is a small integer (a level, a pass), doubles once one
    is not: read back, each is the number it was (an int as that int, a float as that float)."""

    __slots__ = ("data",)

    def __init__(self) -> None:
        self.data: array[Any] = array("b")

    def extend(self, vals: list[Any]) -> None:
        if self.data.typecode == "b":
            try:
                self.data.extend(array("b", vals))
                return
            except (TypeError, OverflowError):  # a float, a string or a large number: doubles from here
                self.data = array("d", self.data)
        self.data.extend(map(float, vals))

    def __len__(self) -> int:
        return len(self.data)


class Jittered:
    """A grader's scatter of one variant: the raw (x, y) values and the jitter stream's state at
    its first point; each pass draws the same jitter again (x's, then y's, point by point), so
    the points are those jittered as they were read, without a pair of doubles held for each."""

    def __init__(self, xs: Packed, ys: Packed, state: Any) -> None:
        self.xs, self.ys, self.state = xs.data, ys.data, state

    def __len__(self) -> int:
        return len(self.xs)

    def __bool__(self) -> bool:
        return len(self.xs) > 0

    def __iter__(self) -> Iterator[tuple[float, float]]:
        rng = random.Random()
        rng.setstate(self.state)
        u = rng.uniform
        for x, y in zip(self.xs, self.ys, strict=True):
            px = float(x) + u(-JITTER, JITTER)
            yield px, y + u(-JITTER, JITTER)


def jittered(raw: dict[str, tuple[Packed, Packed]], fed: list[str], seed: int = 0) -> dict[str, Jittered]:
    """One grader's series per variant: one jitter stream (``seed``) through the variants in the
    order they were read (``fed``), as it ran when each point was jittered as it was read."""
    rng = random.Random(seed)
    out = {}
    for v in fed:
        if v not in raw:
            continue
        xs, ys = raw[v]
        out[v] = Jittered(xs, ys, rng.getstate())
        for _ in range(2 * len(xs)):  # uniform() takes one random() a call
            rng.random()
    return out


class Along:
    """The points (prompt tokens, TTFT) of a variant from its per-complexity arrays, the TTFTs
    and, beside each, its prompt tokens (0: none, not drawn). Not in the rows' order: for a chart
    of bands (percentiles per bin of x), where the order of the points does not count."""

    def __init__(self, parts: list[tuple[array[int], array[float]]]) -> None:
        self.parts = parts
        self.n = sum(len(pt) - pt.count(0) for pt, _ in parts)

    def __len__(self) -> int:
        return self.n

    def __bool__(self) -> bool:
        return self.n > 0

    def __iter__(self) -> Iterator[tuple[int, float]]:
        for pt, ys in self.parts:
            for x, y in zip(pt, ys, strict=True):
                if x:
                    yield x, y
