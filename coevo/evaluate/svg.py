"""Inline SVG charts for the HTML run report: line charts over steps and grouped bar charts.

No script, no external resource: each chart is one `<svg>` element meant to be pasted into an
HTML page, with every label escaped by `markupsafe.escape` (labels are run names, reason codes
and other dump text) and a `<title>` per point or bar, which browsers show as a tooltip. The
charts are built as f-strings of escaped labels and numbers; each public chart function returns
the finished `<svg>` as `Markup`, so that page templates embed it as is.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from markupsafe import Markup, escape

from coevo.evaluate.report import number

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
DASHES = ("", "6 3", "2 3", "9 3 2 3")
WIDTH, HEIGHT = 440, 260
LEFT, RIGHT, BOTTOM = 48, 12, 34  # plot margins: tick labels left, category labels below
CHAR_W = 6.2  # rough width of an 11px sans-serif character, to lay out legends and labels


def fmt(x: Optional[float]) -> str:
    """A number as charts and tables show it: integers whole, others with 3 decimals."""
    if x is None:
        return "-"
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:.3f}"


def _ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    """About `n` round tick values covering [lo, hi]."""
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    return [round(first + i * step, 10) for i in range(int((hi - first) / step + 1e-9) + 1)]


def _range(values: Sequence[float], fixed: Optional[tuple[float, float]]) -> tuple[float, float]:
    lo, hi = (min([fixed[0], *values]), max([fixed[1], *values])) if fixed else (min(values), max(values))
    if hi - lo < 1e-12:
        lo, hi = lo - 0.5, hi + 0.5
    return lo, hi


def _style(i: int) -> tuple[str, str]:
    """(colour, dash attribute) of the i-th line: colours first, then dashes once they repeat."""
    dash = DASHES[i // len(PALETTE) % len(DASHES)]
    return PALETTE[i % len(PALETTE)], f' stroke-dasharray="{dash}"' if dash else ""


@dataclass
class Frame:
    """A chart's title and legend (wrapped onto as many rows as needed) and its plot area."""

    title: str
    legend: Sequence[str]

    def __post_init__(self) -> None:
        self.items, x, y = [], LEFT, 34
        for i, label in enumerate(self.legend):
            width = 32 + CHAR_W * len(str(label))
            if x > LEFT and x + width > WIDTH - RIGHT:
                x, y = LEFT, y + 14
            color, dash = _style(i)
            self.items.append(f'<line x1="{x}" y1="{y - 4}" x2="{x + 16}" y2="{y - 4}" stroke="{color}" '
                              f'stroke-width="3"{dash}/><text x="{x + 20}" y="{y}" class="lg">{escape(label)}</text>')
            x += width
        self.top = y + 12 if self.legend else 30

    def sy(self, lo: float, hi: float) -> Callable[[float], float]:
        h = HEIGHT - BOTTOM - self.top
        return lambda y: self.top + (hi - y) / (hi - lo) * h

    def axes(self, lo: float, hi: float) -> str:
        sy = self.sy(lo, hi)
        out = [f'<line x1="{LEFT}" y1="{self.top}" x2="{LEFT}" y2="{HEIGHT - BOTTOM}" class="ax"/>',
               f'<line x1="{LEFT}" y1="{HEIGHT - BOTTOM}" x2="{WIDTH - RIGHT}" y2="{HEIGHT - BOTTOM}" class="ax"/>']
        for t in _ticks(lo, hi):
            out.append(f'<line x1="{LEFT}" y1="{sy(t):.1f}" x2="{WIDTH - RIGHT}" y2="{sy(t):.1f}" class="grid"/>'
                       f'<text x="{LEFT - 4}" y="{sy(t) + 4:.1f}" class="yl">{t:g}</text>')
        return "".join(out)

    def svg(self, body: str) -> Markup:
        """The whole chart around `body`, which must be SVG markup whose text is already escaped."""
        title = escape(self.title)
        return Markup(f'<svg class="chart" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" '
                      f'role="img" aria-label="{title}"><rect width="{WIDTH}" height="{HEIGHT}" fill="#fff"/>'
                      f'<text x="{LEFT}" y="16" class="ttl">{title}</text>{"".join(self.items)}{body}</svg>')


def empty_chart(title: str, why: str = "no data") -> Markup:
    return Frame(title, []).svg(f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" class="na">{escape(why)}</text>')


def _segments(xs: Sequence[Any], ys: Sequence[Any]) -> list[list[tuple[float, float]]]:
    """Runs of consecutive numeric points (a missing value ends a run), sorted by step."""
    pairs = sorted(((x, number(y)) for x0, y in zip(xs, ys) if (x := number(x0)) is not None), key=lambda p: p[0])
    segs: list[list[tuple[float, float]]] = [[]]
    for x, y in pairs:
        if y is None:
            segs.append([])
        else:
            segs[-1].append((x, y))
    return [s for s in segs if s]


def line_chart(title: str, lines: Sequence[tuple[str, Sequence[Any], Sequence[Any]]],
               y_range: Optional[tuple[float, float]] = None) -> Markup:
    """One polyline per (label, steps, values); a value that is not a number leaves a gap.

    `y_range` is kept in view (e.g. (0, 1) for shares) and widened when a value lies outside.
    """
    segments = [_segments(xs, ys) for _, xs, ys in lines]
    flat = [p for segs in segments for seg in segs for p in seg]
    if not flat:
        return empty_chart(title, "no data (null every step)")
    frame = Frame(title, [label for label, _, _ in lines])
    x_lo, x_hi = _range([x for x, _ in flat], None)
    y_lo, y_hi = _range([y for _, y in flat], y_range)
    sx = lambda x: LEFT + (x - x_lo) / (x_hi - x_lo) * (WIDTH - LEFT - RIGHT)  # noqa: E731
    sy = frame.sy(y_lo, y_hi)
    body = [frame.axes(y_lo, y_hi)]
    body += [f'<text x="{sx(t):.1f}" y="{HEIGHT - BOTTOM + 14}" class="xl">{t:g}</text>'
             for t in _ticks(x_lo, x_hi, 6) if abs(t - round(t)) < 1e-9]  # steps are integers
    body.append(f'<text x="{WIDTH - RIGHT}" y="{HEIGHT - 4}" class="lg" text-anchor="end">step</text>')
    for i, ((label, _, _), segs) in enumerate(zip(lines, segments)):
        color, dash = _style(i)
        for seg in segs:  # a polyline per run of numbers: a null step leaves a gap
            if len(seg) > 1:
                coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in seg)
                body.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="2"{dash}/>')
            body += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{color}">'
                     f"<title>{escape(label)} step {x:g}: {fmt(y)}</title></circle>" for x, y in seg]
    return frame.svg("".join(body))


def _category_label(x: float, text: str, slot: float) -> str:
    """A category name under its bars, its words on two lines when one line would not fit."""
    words = str(text).split()
    if len(words) < 2 or CHAR_W * len(str(text)) <= slot:
        return f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 14}" class="xl">{escape(text)}</text>'
    half = (len(words) + 1) // 2
    lines = [" ".join(words[:half]), " ".join(words[half:])]
    spans = "".join(f'<tspan x="{x:.1f}" dy="{0 if i == 0 else 12}">{escape(s)}</tspan>'
                    for i, s in enumerate(lines))
    return f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 12}" class="xl">{spans}</text>'


def bar_chart(title: str, categories: Sequence[str], groups: Sequence[tuple[str, Sequence[Any]]]) -> Markup:
    """Grouped vertical bars: one bar per (group, category), its value written above it."""
    if not categories or not groups:
        return empty_chart(title)
    frame = Frame(title, [label for label, _ in groups] if len(groups) > 1 else [])
    y_lo, y_hi = _range([0.0, *(number(v) or 0.0 for _, vs in groups for v in vs)], None)
    y_hi += 0.08 * (y_hi - y_lo)  # room for the value written above the tallest bar
    sy = frame.sy(y_lo, y_hi)
    slot = (WIDTH - LEFT - RIGHT) / len(categories)
    bar = slot * 0.8 / len(groups)
    body = [frame.axes(y_lo, y_hi)]
    for c, cat in enumerate(categories):
        body.append(_category_label(LEFT + slot * (c + 0.5), cat, slot))
        for g, (label, vs) in enumerate(groups):
            v = number(vs[c]) if c < len(vs) else None
            x = LEFT + slot * c + slot * 0.1 + g * bar
            top, base = sy(max(v or 0.0, 0.0)), sy(min(v or 0.0, 0.0))
            body.append(f'<rect x="{x:.1f}" y="{top:.1f}" width="{bar:.1f}" height="{base - top:.1f}" '
                        f'fill="{PALETTE[g % len(PALETTE)]}"><title>{escape(label)} {escape(cat)}: {fmt(v)}'
                        f'</title></rect>'
                        f'<text x="{x + bar / 2:.1f}" y="{top - 3:.1f}" class="bv">{fmt(v)}</text>')
    return frame.svg("".join(body))
