"""Tiny inline-SVG charts for the HTML report: grouped histograms and line charts.

No scripts, no external fonts: plain SVG elements with ``<title>`` tooltips. Every label
goes through ``html.escape``. Sizes are in SVG user units; the charts scale with the page, and
so do their fonts (CSS ``px`` inside an SVG are user units), so labels placed apart here stay
apart at any page width: axis labels are thinned until their estimated widths
(``text_width``) fit between neighbours.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Sequence

from dqa.formatting import human_count

PALETTE = ("#d1495b", "#2e86ab", "#66a182", "#edae49", "#8d6a9f")
W, H = 760, 300
PAD_L, PAD_R, PAD_T, PAD_B = 64, 16, 36, 56
TICK_PX, LEGEND_PX, TITLE_PX, VALUE_PX = 11, 12, 14, 12  # font sizes of the classes tick, lg, ct, val (html.CSS)
VALUE_HEADROOM = 1.15  # with value labels the y axis reaches 15% past the tallest bar: its label stays in the plot
EM_PER_CHAR = 0.62  # an upper bound of the mean advance of digits, letters and unit signs in system sans fonts
LABEL_GAP = 6.0  # least space between two neighbouring labels


def esc(value: object) -> str:
    """HTML/SVG-escaped text (quotes too, so it is safe in attributes)."""
    return html.escape(str(value), quote=True)


def _axis_number(v: float) -> str:
    """An axis label: ``1234`` -> ``1.23K``, ``2500000`` -> ``2.5M``."""
    return human_count(v, trim=True)


def nice_ticks(top: float, n: int = 5) -> list[float]:
    """Round tick values from 0 to at least ``top``."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return [i * step for i in range(int(math.ceil(top / step)) + 1)]


def text_width(text: str, font_px: float) -> float:
    """A generous estimate of the rendered width of ``text`` (user units) at ``font_px``."""
    return EM_PER_CHAR * font_px * len(text)


def label_step(labels: Sequence[str], spacing: float, font_px: float = TICK_PX) -> int:
    """Show every k-th of labels placed ``spacing`` apart so neighbours never overlap: the least k
    with ``k * spacing`` >= the widest label + ``LABEL_GAP``."""
    widest = max((text_width(t, font_px) for t in labels), default=0.0)
    return max(1, math.ceil((widest + LABEL_GAP) / max(spacing, 1e-9)))


def _x_labels(positions: Sequence[float], labels: Sequence[str]) -> list[str]:
    """Tick labels under the x axis, centred at ``positions``: thinned to every k-th (see
    ``label_step``), and any whose box would leave the chart dropped."""
    if not labels:
        return []
    spacing = min((b - a for a, b in zip(positions, positions[1:])), default=float(W))
    step = label_step(labels, spacing)
    parts = []
    for i, (x, label) in enumerate(zip(positions, labels)):
        half = text_width(label, TICK_PX) / 2
        if i % step or x - half < 0 or x + half > W:
            continue
        # 16 below the axis: clear of the lowest y label (baseline 4 below the axis) at the corner.
        parts.append(f'<text x="{x:.1f}" y="{H - PAD_B + 16}" text-anchor="middle" class="tick">{esc(label)}</text>')
    return parts


@dataclass
class Series:
    """One named series of values (bar heights or line y-values) with its colour.

    In a line chart a ``None`` value breaks the line (no data there, e.g. an idle gap)."""

    name: str
    values: Sequence[float | None]
    color: str = ""


def _frame(title: str, y_label: str, x_label: str, ticks: list[float], y_of, fmt) -> list[str]:
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" role="img" aria-label="{esc(title)}" class="chart">',
        f'<text x="{PAD_L}" y="20" class="ct">{esc(title)}</text>',
    ]
    for t in ticks:
        y = y_of(t)
        parts.append(f'<line x1="{PAD_L}" x2="{W - PAD_R}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        parts.append(f'<text x="{PAD_L - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">{esc(fmt(t))}</text>')
    parts.append(f'<text x="14" y="{PAD_T + (H - PAD_T - PAD_B) / 2:.0f}" transform="rotate(-90 14 {PAD_T + (H - PAD_T - PAD_B) / 2:.0f})" '
                 f'text-anchor="middle" class="axl">{esc(y_label)}</text>')
    parts.append(f'<text x="{PAD_L + (W - PAD_L - PAD_R) / 2:.0f}" y="{H - 6}" text-anchor="middle" class="axl">{esc(x_label)}</text>')
    parts.append(f'<line x1="{PAD_L}" x2="{W - PAD_R}" y1="{H - PAD_B}" y2="{H - PAD_B}" class="axis"/>')
    return parts


def _legend(series: Sequence[Series]) -> list[str]:
    parts, x = [], W - PAD_R
    for i, s in enumerate(reversed(series)):
        label = esc(s.name)
        width = 14 + text_width(s.name, LEGEND_PX)
        x -= width + 12
        color = s.color or PALETTE[(len(series) - 1 - i) % len(PALETTE)]
        parts.append(f'<rect x="{x:.0f}" y="10" width="10" height="10" fill="{color}"/>')
        parts.append(f'<text x="{x + 14:.0f}" y="19" class="lg">{label}</text>')
    return parts


def grouped_bars(title: str, bin_labels: Sequence[str], series: Sequence[Series], y_label: str, x_label: str,
                 percent: bool = False, edge_labels: Sequence[str] | None = None, value_labels: bool = False) -> str:
    """A histogram with one bar per series in each bin; returns the ``<svg>`` element as text.

    ``bin_labels`` name the bins (in tooltips, and under the bins); with ``edge_labels`` (one
    more than the bins: each bin's lower bound, then the last bin's upper bound) the axis is
    labelled at the bin boundaries instead, which keeps labels short. ``value_labels`` writes each
    bar's value above it (``1,234``; a zero too, so an empty bar reads as 0, not as missing),
    where the bar is wide enough for it; the y axis then leaves room above the tallest bar.
    """
    top = max((max(s.values) if len(s.values) else 0.0) for s in series) if series else 0.0
    ticks = nice_ticks((top or 1.0) * (VALUE_HEADROOM if value_labels else 1.0))
    ymax = ticks[-1] or 1.0
    plot_h = H - PAD_T - PAD_B

    def y_of(v: float) -> float:
        return PAD_T + plot_h * (1 - v / ymax)

    fmt = (lambda v: f"{v:g}%") if percent else _axis_number
    parts = _frame(title, y_label, x_label, ticks, y_of, fmt)
    nb = max(1, len(bin_labels))
    slot = (W - PAD_L - PAD_R) / nb
    bar_w = max(1.0, (slot * 0.8) / max(1, len(series)))
    for b, label in enumerate(bin_labels):
        x0 = PAD_L + b * slot + slot * 0.1
        for i, s in enumerate(series):
            v = float(s.values[b]) if b < len(s.values) else 0.0
            color = s.color or PALETTE[i % len(PALETTE)]
            y = y_of(v)
            tip = f"{s.name}: {label}: {v:.2f}{'%' if percent else ''}"
            parts.append(f'<rect x="{x0 + i * bar_w:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{max(0.0, H - PAD_B - y):.1f}" '
                         f'fill="{color}"><title>{esc(tip)}</title></rect>')
            text = f"{v:,.1f}%" if percent else f"{v:,.0f}"
            if value_labels and text_width(text, VALUE_PX) + 2 <= bar_w:
                parts.append(f'<text x="{x0 + (i + 0.5) * bar_w:.1f}" y="{y - 5:.1f}" text-anchor="middle" class="val">{esc(text)}</text>')
    if edge_labels is not None and len(edge_labels) == nb + 1:
        parts += _x_labels([PAD_L + b * slot for b in range(nb + 1)], list(edge_labels))
    else:
        parts += _x_labels([PAD_L + (b + 0.5) * slot for b in range(len(bin_labels))], list(bin_labels))
    parts += _legend(series)
    parts.append("</svg>")
    return "".join(parts)


def line_chart(title: str, xs: Sequence[float | None], series: Sequence[Series], y_label: str, x_label: str,
               x_fmt=None, x_min: float | None = None, gaps: Sequence[tuple[float, float]] = (),
               gap_label: str = "idle") -> str:
    """Lines over a shared x axis (e.g. seconds since start); returns the ``<svg>`` element as text.

    ``x_min`` starts the axis there (e.g. 0) instead of at the first point; ``x_fmt`` labels
    the x ticks (default: short numbers such as ``1.5K``). A ``None`` in ``xs`` or in a series
    breaks the line there; ``gaps`` are x ranges without data (e.g. between two runs), shaded and
    labelled ``gap_label`` rather than drawn as zeros.
    """
    x_fmt = x_fmt or _axis_number
    known = [x for x in xs if x is not None]
    top = max((max((v for v in s.values if v is not None), default=0.0)) for s in series) if series else 0.0
    ticks = nice_ticks(top or 1.0)
    ymax = ticks[-1] or 1.0
    plot_h = H - PAD_T - PAD_B
    x_lo = x_min if x_min is not None else (min(known) if known else 0.0)
    x_hi = max([*known, *(b for _, b in gaps)]) if known else 1.0
    span = (x_hi - x_lo) or 1.0

    def y_of(v: float) -> float:
        return PAD_T + plot_h * (1 - v / ymax)

    def x_of(x: float) -> float:
        return PAD_L + (W - PAD_L - PAD_R) * (x - x_lo) / span

    parts = _frame(title, y_label, x_label, ticks, y_of, _axis_number)
    for a, b in gaps:
        x0, x1 = x_of(a), x_of(b)
        tip = f"{gap_label}: {x_fmt(a)} to {x_fmt(b)} ({x_fmt(b - a)})"
        parts.append(f'<rect x="{x0:.1f}" y="{PAD_T}" width="{max(0.0, x1 - x0):.1f}" height="{plot_h:.1f}" class="gap">'
                     f'<title>{esc(tip)}</title></rect>')
        if x1 - x0 >= text_width(gap_label, TICK_PX) + LABEL_GAP:
            parts.append(f'<text x="{(x0 + x1) / 2:.1f}" y="{PAD_T + 14}" text-anchor="middle" class="gapl">{esc(gap_label)}</text>')
    tick_x = [t for t in nice_ticks(span, 6) if t <= span * 1.001]
    parts += _x_labels([x_of(x_lo + t) for t in tick_x], [x_fmt(x_lo + t) for t in tick_x])
    for i, s in enumerate(series):
        color = s.color or PALETTE[i % len(PALETTE)]
        runs: list[list[tuple[float, float]]] = [[]]
        for x, v in zip(xs, s.values):
            if x is None or v is None:
                if runs[-1]:
                    runs.append([])
                continue
            runs[-1].append((x, float(v)))
        for run in (r for r in runs if r):
            pts = " ".join(f"{x_of(x):.1f},{y_of(v):.1f}" for x, v in run)
            parts.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2"><title>{esc(s.name)}</title></polyline>')
        if len(known) <= 60:
            for run in runs:
                for x, v in run:
                    parts.append(f'<circle cx="{x_of(x):.1f}" cy="{y_of(v):.1f}" r="2.5" fill="{color}">'
                                 f'<title>{esc(f"{s.name}: {x_fmt(x)}: {v:,.1f}")}</title></circle>')
    parts += _legend(series)
    parts.append("</svg>")
    return "".join(parts)
