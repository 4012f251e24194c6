"""Tiny dependency-free SVG charts for the self-contained HTML report (works offline, no CDN)."""

from __future__ import annotations

import math
from html import escape
from typing import Any

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
W, H = 560, 300
MAX_POINTS = 2000  # above this a chart summarises (quantiles, bands, envelopes) and says so under the plot
MAX_MARKED = 50  # spikes circled on a summarised scatter: the most extreme
L, R, T, B = 64, 16, 34, 46


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values inside [lo, hi] (never left of the axis, where a label would be cut)."""
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=raw)
    start = math.ceil(lo / step - 1e-9) * step
    return [start + i * step for i in range(int((hi - start) / step) + 2) if start + i * step <= hi + 1e-9]


def color_map(names: list[str]) -> dict[str, str]:
    """One colour per name (a variant), the same in every chart of a report."""
    return {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(dict.fromkeys(names))}


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


class Chart:
    """A chart whose legend sits in its own band between the title and the plot area, so it never
    covers data."""

    def __init__(self, title: str, xlabel: str, ylabel: str, xs: list[float], ys: list[float],
                 ylim: tuple[float, float] | None = None, legend_items: int = 0) -> None:
        self.title, self.xlabel, self.ylabel = title, xlabel, ylabel
        self.top = T + 14 * math.ceil(legend_items / 4)
        xs = [x for x in xs if x is not None and math.isfinite(x)] or [0, 1]
        ys = [y for y in ys if y is not None and math.isfinite(y)] or [0, 1]
        self.x0, self.x1 = min(xs), max(xs)
        self.y0, self.y1 = ylim or (min(0.0, min(ys)), max(ys))
        if self.x1 == self.x0:
            self.x1 = self.x0 + 1
        if self.y1 == self.y0:
            self.y1 = self.y0 + 1
        self.parts: list[str] = []
        self.footnote: str | None = None

    def px(self, x: float) -> float:
        return L + (x - self.x0) / (self.x1 - self.x0) * (W - L - R)

    def py(self, y: float) -> float:
        return H - B - (y - self.y0) / (self.y1 - self.y0) * (H - self.top - B)

    def axes(self, xticks: bool = True) -> None:
        p = self.parts
        for t in _ticks(self.y0, self.y1):
            y = self.py(t)
            p.append(f'<line x1="{L}" y1="{y:.1f}" x2="{W - R}" y2="{y:.1f}" stroke="#e5e5e5"/>'
                     f'<text x="{L - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
        for t in _ticks(self.x0, self.x1) if xticks else []:
            x = self.px(t)
            p.append(f'<line x1="{x:.1f}" y1="{H - B}" x2="{x:.1f}" y2="{H - B + 4}" stroke="#333"/>'
                     f'<text x="{x:.1f}" y="{H - B + 16}" text-anchor="middle">{_fmt(t)}</text>')
        p.append(f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="#333"/>'
                 f'<line x1="{L}" y1="{self.top}" x2="{L}" y2="{H - B}" stroke="#333"/>'
                 f'<text x="{(L + W - R) / 2}" y="{H - 8}" text-anchor="middle">{escape(self.xlabel)}</text>'
                 f'<text transform="translate(14,{(self.top + H - B) / 2}) rotate(-90)" text-anchor="middle">'
                 f'{escape(self.ylabel)}</text>'
                 f'<text x="{W / 2}" y="20" text-anchor="middle" font-weight="bold">{escape(self.title)}</text>')

    def legend(self, names: list[str], colors: dict[str, str] | None = None) -> None:
        """In the band above the plot area (reserved by ``legend_items``)."""
        for i, n in enumerate(names):
            x = L + 8 + (i % 4) * 125
            y = T - 6 + (i // 4) * 14
            col = (colors or {}).get(n, PALETTE[i % len(PALETTE)])
            self.parts.append(f'<rect x="{x}" y="{y}" width="10" height="10" fill="{col}"/>'
                              f'<text x="{x + 14}" y="{y + 9}">{escape(n)}</text>')

    def note(self, text: str) -> None:
        """A line under the chart: how a large data set was drawn (quantiles, bands), never hidden."""
        self.footnote = text

    def svg(self) -> str:
        note = self.footnote
        h = H + (16 if note else 0)
        tail = (f'<text x="{L}" y="{H + 10}" font-size="10" fill="#555">{escape(note)}</text>' if note else "")
        return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {h}" width="{W}" height="{h}" '
                f'font-family="sans-serif" font-size="11" role="img" aria-label="{escape(self.title)}">'
                f'<rect width="{W}" height="{h}" fill="white"/>' + "".join(self.parts) + tail + "</svg>")


def envelope(s: list[tuple[float, float]], n: int = MAX_POINTS) -> list[tuple[float, float]]:
    """A long series (in x order) cut to about n points: in each of n/2 runs of it, its lowest and
    highest point in their own order, so a peak or a dip drawn at this width is never lost."""
    if len(s) <= n:
        return s
    size = math.ceil(len(s) / (n // 2))
    out: list[tuple[float, float]] = []
    for i in range(0, len(s), size):
        run = s[i:i + size]
        lo = min(range(len(run)), key=lambda j: run[j][1])
        hi = max(range(len(run)), key=lambda j: run[j][1])
        out += [run[j] for j in sorted({lo, hi})]
    return out


def lines(title: str, xlabel: str, ylabel: str, series: dict[str, list[tuple[float, float]]],
          step: bool = False, ylim: tuple[float, float] | None = None,
          hlines: list[tuple[float, str]] | None = None, colors: dict[str, str] | None = None,
          vlines: list[tuple[float, str, str | None]] | None = None, note: str | None = None) -> str:
    """Line per series. ``hlines``: dashed horizontal references (value, label), e.g. an SLO;
    ``vlines``: dotted vertical ones (x, label, series whose colour it takes), e.g. a predicted
    capacity. A series longer than MAX_POINTS is drawn as its envelope (`envelope`), said under the plot."""
    longest = max((len(x) for x in series.values()), default=0)
    if longest > MAX_POINTS:
        series = {k: envelope(v) for k, v in series.items()}
        note = note or f"{longest:,} points: each run of them drawn as its lowest and highest"
    pts = [p for s in series.values() for p in s]
    ys = [p[1] for p in pts] + [v for v, _ in hlines or []]
    xs = [p[0] for p in pts] + [x for x, _, _ in vlines or []]
    c = Chart(title, xlabel, ylabel, xs, ys, ylim, legend_items=len(series))
    cols = colors or color_map(list(series))
    c.axes()
    for v, label in hlines or []:
        c.parts.append(f'<line x1="{c.px(c.x0):.1f}" x2="{c.px(c.x1):.1f}" '
                       f'y1="{c.py(v):.1f}" y2="{c.py(v):.1f}" stroke="#c00" stroke-dasharray="5,4"/>'
                       f'<text x="{c.px(c.x0) + 4:.1f}" y="{c.py(v) - 4:.1f}" font-size="10" '
                       f'fill="#c00">{escape(label)}</text>')
    for k, (x, label, owner) in enumerate(vlines or []):
        col = cols.get(owner or "", "#555")
        c.parts.append(f'<line x1="{c.px(x):.1f}" x2="{c.px(x):.1f}" y1="{c.top}" y2="{H - B}" stroke="{col}" '
                       f'stroke-dasharray="2,3" stroke-width="1.5"/>'
                       f'<text x="{c.px(x) + 3:.1f}" y="{c.top + 10 + 12 * k:.1f}" font-size="10" '
                       f'fill="{col}">{escape(label)}</text>')
    for name, s in series.items():
        if not s:
            continue
        coords = []
        prev = None
        for x, y in s:
            if step and prev is not None:
                coords.append(f"{c.px(x):.1f},{c.py(prev):.1f}")
            coords.append(f"{c.px(x):.1f},{c.py(y):.1f}")
            prev = y
        c.parts.append(f'<polyline fill="none" stroke="{cols.get(name, PALETTE[0])}" stroke-width="2" '
                       f'points="{" ".join(coords)}"/>')
        if len(s) <= 12:  # few points (load levels): mark each
            c.parts += [f'<circle cx="{c.px(x):.1f}" cy="{c.py(y):.1f}" r="3" fill="{cols.get(name, PALETTE[0])}"/>'
                        for x, y in s]
    c.legend(list(series), cols)
    if note:
        c.note(note)
    return c.svg()


def cdf(title: str, xlabel: str, ranked: dict[str, tuple[int, list[tuple[int, float]]]],
        colors: dict[str, str] | None = None) -> str:
    """The empirical CDF of each sample, from its values ranked (`ChartSeries.cdf`: (how many,
    [(0-based rank, value)])): every value up to MAX_POINTS, else its exact quantiles at MAX_POINTS
    evenly spaced fractions (and its extremes), said under the plot."""
    series = {name: [(x, (i + 1) / n) for i, x in pts] for name, (n, pts) in ranked.items()}
    big = max((n for n, _ in ranked.values() if n > MAX_POINTS), default=0)
    note = f"{big:,} requests per line at most: drawn through {MAX_POINTS:,} exact quantiles" if big else None
    return lines(title, xlabel, "fraction of requests", series, step=True, ylim=(0, 1), colors=colors, note=note)


def scatter(title: str, xlabel: str, ylabel: str, series: dict[str, list[tuple[float, float]]],
            marked: list[tuple[float, float]] | None = None, colors: dict[str, str] | None = None,
            labels: list[tuple[float, float, str]] | None = None) -> str:
    """Points per series (MAX_POINTS at most in all: past that the caller draws `bands`); ``marked``
    circled (spikes); ``labels``: text next to a point."""
    pts = [p for s in series.values() for p in s] + (marked or [])
    names = list(series) + (["○ spike"] if marked else [])
    c = Chart(title, xlabel, ylabel, [p[0] for p in pts], [p[1] for p in pts], legend_items=len(names))
    cols = colors or color_map(list(series))
    c.axes()
    for name, s in series.items():
        col = cols.get(name, PALETTE[0])
        c.parts += [f'<circle cx="{c.px(x):.1f}" cy="{c.py(y):.1f}" r="3.5" fill="{col}" fill-opacity="0.7"/>'
                    for x, y in s]
    for x, y in marked or []:
        c.parts.append(f'<circle cx="{c.px(x):.1f}" cy="{c.py(y):.1f}" r="8" fill="none" stroke="black" '
                       f'stroke-width="2"><title>spike</title></circle>')
    for x, y, text in labels or []:
        c.parts.append(f'<text x="{c.px(x) + 6:.1f}" y="{c.py(y) - 6:.1f}" font-size="10">{escape(text)}</text>')
    c.legend(names, cols)
    return c.svg()


def bands(title: str, xlabel: str, ylabel: str, b: Any, marked: list[tuple[float, float]] | None,
          colors: dict[str, str] | None, bins: int = 40) -> str:
    """A large scatter summarised (`chart_reads.Bands`: per series and bin of x, the median of y (a
    line) and its 10th-90th percentile band (shaded)); the most extreme marked points circled."""
    shown = sorted(marked or [], key=lambda p: -p[1])[:MAX_MARKED]
    names = list(b.rows) + (["○ spike"] if shown else [])
    ys = [v for rows in b.rows.values() for _, lo, _, hi in rows for v in (lo, hi)] + [p[1] for p in shown]
    c = Chart(title, xlabel, ylabel, [b.lo, b.hi], ys, legend_items=len(names))
    cols = colors or color_map(list(b.rows))
    c.axes()
    for name, rows in b.rows.items():
        if not rows:
            continue
        col = cols.get(name, PALETTE[0])
        band = [f"{c.px(x):.1f},{c.py(hi):.1f}" for x, _, _, hi in rows] + \
            [f"{c.px(x):.1f},{c.py(lo):.1f}" for x, lo, _, _ in reversed(rows)]
        c.parts.append(f'<polygon points="{" ".join(band)}" fill="{col}" fill-opacity="0.2" stroke="none"/>')
        c.parts.append(f'<polyline fill="none" stroke="{col}" stroke-width="2" '
                       f'points="{" ".join(f"{c.px(x):.1f},{c.py(m):.1f}" for x, _, m, _ in rows)}"/>')
    for x, y in shown:
        c.parts.append(f'<circle cx="{c.px(x):.1f}" cy="{c.py(y):.1f}" r="8" fill="none" stroke="black" '
                       f'stroke-width="2"><title>spike</title></circle>')
    c.legend(names, cols)
    more = f"; the {len(shown)} largest of {len(marked or []):,} spikes circled" if len(marked or []) > len(shown) else ""
    per = "per value of x" if b.values else f"per {bins} bins of x"
    c.note(f"{b.n:,} points: median line and 10th-90th percentile band {per}{more}")
    return c.svg()


def boxes(title: str, ylabel: str, groups: dict[str, Any], n_vals: int, colors: dict[str, str] | None = None,
          owner: dict[str, str] | None = None) -> str:
    """Box plot (p10-p90 whiskers, p25-p75 box, median line) plus the points themselves while there
    are at most MAX_POINTS (``n_vals`` in all). ``groups``: name -> its `chart_reads.Box` (None: no
    value). A box takes the colour of its ``owner`` (its variant), so one variant is one colour in
    every chart."""
    fin = [v for g in groups.values() if g is not None for v in (g.lo, g.hi) if v is not None]
    vals = [min(fin), max(fin)] if fin else []
    owners = owner or {g: g for g in groups}
    cols = colors or color_map(list(dict.fromkeys(owners.values())))
    legend = list(dict.fromkeys(owners.values()))
    c = Chart(title, "", ylabel, [0, max(1, len(groups))], vals or [0, 1], legend_items=len(legend))
    c.x0, c.x1 = 0, max(1, len(groups))
    c.axes(xticks=False)
    for i, (name, g) in enumerate(groups.items()):
        x = c.px(i + 0.5)
        col = cols.get(owners.get(name, name), PALETTE[0])
        c.parts.append(f'<text x="{x:.1f}" y="{H - B + 30}" text-anchor="middle">{escape(name)}</text>')
        if g is None or g.q is None:
            continue
        q = g.q
        w = 18
        c.parts.append(
            f'<line x1="{x:.1f}" y1="{c.py(q[10]):.1f}" x2="{x:.1f}" y2="{c.py(q[90]):.1f}" stroke="{col}"/>'
            f'<rect x="{x - w:.1f}" y="{c.py(q[75]):.1f}" width="{2 * w}" height="{max(1, c.py(q[25]) - c.py(q[75])):.1f}" '
            f'fill="{col}" fill-opacity="0.25" stroke="{col}"/>'
            f'<line x1="{x - w:.1f}" y1="{c.py(q[50]):.1f}" x2="{x + w:.1f}" y2="{c.py(q[50]):.1f}" stroke="{col}" '
            f'stroke-width="2"/>')
        if n_vals <= MAX_POINTS:  # the points themselves, while they can be told apart
            c.parts += [f'<circle cx="{x + 26 + (j % 5) * 3:.1f}" cy="{c.py(v):.1f}" r="2" fill="{col}"/>'
                        for j, v in enumerate(g.points)]
    c.legend(legend, cols)
    if n_vals > MAX_POINTS:
        c.note(f"{n_vals:,} values: boxes only (p10-p90 whiskers, p25-p75 box, median), no points")
    return c.svg()


def bars(title: str, ylabel: str, groups: dict[str, float | None], errors: dict[str, tuple[float, float]] | None = None,
         refs: dict[str, float | None] | None = None, colors: dict[str, str] | None = None) -> str:
    vals = [v for v in groups.values() if v is not None] + [v for v in (refs or {}).values() if v is not None]
    vals += [e for pair in (errors or {}).values() for e in pair]
    c = Chart(title, "", ylabel, [0, max(1, len(groups))], vals or [0, 1])
    c.x0, c.x1 = 0, max(1, len(groups))
    cols = colors or color_map(list(groups))
    c.axes(xticks=False)
    for i, (name, v) in enumerate(groups.items()):
        x = c.px(i + 0.5)
        col = cols.get(name, PALETTE[i % len(PALETTE)])
        c.parts.append(f'<text x="{x:.1f}" y="{H - B + 30}" text-anchor="middle">{escape(name)}</text>')
        if v is not None:
            y0, y1 = c.py(max(0, c.y0)), c.py(v)
            c.parts.append(f'<rect x="{x - 22:.1f}" y="{min(y0, y1):.1f}" width="44" height="{max(1, abs(y0 - y1)):.1f}" '
                           f'fill="{col}" fill-opacity="0.6"/>')
        if errors and name in errors:
            lo, hi = errors[name]
            c.parts.append(f'<line x1="{x:.1f}" y1="{c.py(lo):.1f}" x2="{x:.1f}" y2="{c.py(hi):.1f}" stroke="black" '
                           f'stroke-width="2"/>')
        if refs and refs.get(name) is not None:
            y = c.py(refs[name])
            c.parts.append(f'<line x1="{x - 30:.1f}" y1="{y:.1f}" x2="{x + 30:.1f}" y2="{y:.1f}" stroke="black" '
                           f'stroke-dasharray="4 3"><title>noise floor</title></line>')
    return c.svg()
