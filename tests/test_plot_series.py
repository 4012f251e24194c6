"""Chart points held compactly (issue 37): packed values read back as they were, a scatter
jittered when drawn is the scatter jittered as read, and bands drawn from the points out of the
rows' order are the bands drawn in it."""

from __future__ import annotations

import random
from array import array
from typing import Any

import pytest

from evalkit.reporting import svgplot
from evalkit.reporting.plot_series import JITTER, Along, Packed, Pairs, jittered


@pytest.mark.parametrize("vals, code", [([1, 2, 5, -3], "b"), ([True, False, 1], "b"), ([1, 2.5, 3], "d"),
                                        ([1, 300, 2], "d"), (["3", "4"], "d")])
def test_packed_values_are_bytes_only_while_small_integers(vals, code):
    p = Packed()
    p.extend(vals)
    assert p.data.typecode == code


@pytest.mark.parametrize("parts", [[[1, 2], [3.5, 4]], [[1.0, 2.0], [3, 4]], [[7], [100000, -2]], [[], [1]]])
def test_packed_values_read_back_as_the_numbers_they_were(parts):
    p = Packed()
    for part in parts:
        p.extend(part)
    assert [float(v) for v in p.data] == [float(v) for part in parts for v in part]


def _jittered_as_read(points: dict[str, list[tuple[Any, Any]]]) -> dict[str, list[tuple[float, float]]]:
    """The scatter as it was made before: each point jittered when it was read, one stream."""
    rng = random.Random(0)
    out: dict[str, list[tuple[float, float]]] = {}
    for v, pts in points.items():
        for x, y in pts:
            px = float(x) + rng.uniform(-JITTER, JITTER)
            out.setdefault(v, []).append((px, y + rng.uniform(-JITTER, JITTER)))
    return out


POINTS = {"base": [(1, 2), (3, 3), (5, 4)], "fp8": [(2, 2.5), (4, 1)], "w8a8": [(1, True), (2, 0)]}


@pytest.mark.parametrize("variant", list(POINTS))
def test_a_scatter_jittered_when_drawn_is_the_scatter_jittered_as_read(variant):
    raw = {}
    for v, pts in POINTS.items():
        xs, ys = Packed(), Packed()
        xs.extend([x for x, _ in pts])
        ys.extend([y for _, y in pts])
        raw[v] = (xs, ys)
    assert list(jittered(raw, list(POINTS))[variant]) == _jittered_as_read(POINTS)[variant]


def test_a_jittered_scatter_drawn_twice_is_the_same_points():
    xs, ys = Packed(), Packed()
    xs.extend([1, 2, 3])
    ys.extend([0.5, 1.5, 2.5])
    series = jittered({"a": (xs, ys)}, ["a"])["a"]
    assert list(series) == list(series)


def _split(points: list[tuple[int, float]], cuts: int) -> list[tuple[array[int], array[float]]]:
    """The points dealt into ``cuts`` parts (as per complexity), prompt tokens 0 where none."""
    parts = [(array("i"), array("d")) for _ in range(cuts)]
    for i, (x, y) in enumerate(points):
        parts[i % cuts][0].append(x)
        parts[i % cuts][1].append(y)
    return parts


def _tok_points(n: int, seed: int) -> list[tuple[int, float]]:
    rng = random.Random(seed)
    return [(0 if rng.random() < 0.05 else rng.randint(20, 900), rng.lognormvariate(4, 1)) for _ in range(n)]


def test_points_along_the_arrays_are_the_points_with_prompt_tokens():
    pts = _tok_points(500, 1)
    assert sorted(Along(_split(pts, 3))) == sorted(p for p in pts if p[0])


def test_points_along_the_arrays_are_counted_without_the_ones_without_prompt_tokens():
    pts = _tok_points(500, 2)
    assert len(Along(_split(pts, 3))) == sum(1 for x, _ in pts if x)


@pytest.mark.parametrize("seed", [3, 4])
def test_bands_from_the_points_out_of_order_are_the_bands_in_order(seed):
    n = svgplot.MAX_POINTS + 1500
    a, b = _tok_points(n, seed), _tok_points(n // 3, seed + 10)
    in_order = {v: Pairs(array("i", [x for x, _ in p if x]), array("d", [y for x, y in p if x])) for v, p in
                (("a", a), ("b", b))}
    along = {"a": Along(_split(a, 3)), "b": Along(_split(b, 2))}
    marked = [(500, 900.0), (30, 2000.0)]
    assert svgplot.scatter("t", "x", "y", along, marked) == svgplot.scatter("t", "x", "y", in_order, marked)


@pytest.mark.parametrize("n", [svgplot.MAX_POINTS + 1, 5 * svgplot.MAX_POINTS + 7])
def test_a_large_cdf_is_drawn_through_its_exact_quantiles(n):
    """The quantiles sorted from an array of doubles equal those of a sorted list of the values."""
    rng = random.Random(n)
    xs = [rng.paretovariate(1.5) for _ in range(n)]
    xs[::10] = [None] * len(xs[::10])
    xs += [rng.paretovariate(1.5) for _ in range(len(xs[::10]))]  # n values besides the missing ones
    got = svgplot.cdf("t", "x", {"a": xs})
    ref = sorted(x for x in xs if x is not None)
    m = len(ref)
    idx = sorted({0, m - 1, *(round(k * (m - 1) / svgplot.MAX_POINTS) for k in range(svgplot.MAX_POINTS + 1))})
    want = svgplot.lines("t", "x", "fraction of requests", {"a": [(ref[i], (i + 1) / m) for i in idx]}, step=True,
                         ylim=(0, 1), note=f"{m:,} requests per line at most: drawn through "
                                            f"{svgplot.MAX_POINTS:,} exact quantiles")
    assert got == want
