"""Tiny inline-SVG charts for the HTML report: grouped histograms and line charts.

No scripts, no external fonts: plain SVG elements with ``<title>`` tooltips. Every label
goes through ``html.escape``. Sizes are in SVG user units; the charts scale with the page.
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


@dataclass
class Series:
    """One named series of values (bar heights or line y-values) with its colour."""

    name: str
    values: Sequence[float]
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
        width = 14 + 6.4 * len(s.name)
        x -= width + 12
        color = s.color or PALETTE[(len(series) - 1 - i) % len(PALETTE)]
        parts.append(f'<rect x="{x:.0f}" y="10" width="10" height="10" fill="{color}"/>')
        parts.append(f'<text x="{x + 14:.0f}" y="19" class="lg">{label}</text>')
    return parts


def grouped_bars(title: str, bin_labels: Sequence[str], series: Sequence[Series], y_label: str, x_label: str,
                 percent: bool = False) -> str:
    """A histogram with one bar per series in each bin; returns the ``<svg>`` element as text."""
    top = max((max(s.values) if len(s.values) else 0.0) for s in series) if series else 0.0
    ticks = nice_ticks(top or 1.0)
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
        if nb <= 24 or b % max(1, nb // 24) == 0:
            parts.append(f'<text x="{x0 + slot * 0.4:.1f}" y="{H - PAD_B + 14}" text-anchor="middle" class="tick">{esc(label)}</text>')
    parts += _legend(series)
    parts.append("</svg>")
    return "".join(parts)


def line_chart(title: str, xs: Sequence[float], series: Sequence[Series], y_label: str, x_label: str,
               x_fmt=None, x_min: float | None = None) -> str:
    """Lines over a shared x axis (e.g. seconds since start); returns the ``<svg>`` element as text.

    ``x_min`` starts the axis there (e.g. 0) instead of at the first point; ``x_fmt`` labels
    the x ticks (default: short numbers such as ``1.5K``).
    """
    x_fmt = x_fmt or _axis_number
    top = max((max(s.values) if len(s.values) else 0.0) for s in series) if series else 0.0
    ticks = nice_ticks(top or 1.0)
    ymax = ticks[-1] or 1.0
    plot_h = H - PAD_T - PAD_B
    x_lo = x_min if x_min is not None else (min(xs) if len(xs) else 0.0)
    x_hi = max(xs) if len(xs) else 1.0
    span = (x_hi - x_lo) or 1.0

    def y_of(v: float) -> float:
        return PAD_T + plot_h * (1 - v / ymax)

    def x_of(x: float) -> float:
        return PAD_L + (W - PAD_L - PAD_R) * (x - x_lo) / span

    parts = _frame(title, y_label, x_label, ticks, y_of, _axis_number)
    for t in nice_ticks(span, 6):
        if t > span * 1.001:
            break
        parts.append(f'<text x="{x_of(x_lo + t):.1f}" y="{H - PAD_B + 14}" text-anchor="middle" class="tick">{esc(x_fmt(x_lo + t))}</text>')
    for i, s in enumerate(series):
        color = s.color or PALETTE[i % len(PALETTE)]
        pts = " ".join(f"{x_of(x):.1f},{y_of(float(v)):.1f}" for x, v in zip(xs, s.values))
        parts.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2"><title>{esc(s.name)}</title></polyline>')
        if len(xs) <= 60:
            for x, v in zip(xs, s.values):
                parts.append(f'<circle cx="{x_of(x):.1f}" cy="{y_of(float(v)):.1f}" r="2.5" fill="{color}">'
                             f'<title>{esc(f"{s.name}: {x_fmt(x)}: {float(v):,.1f}")}</title></circle>')
    parts += _legend(series)
    parts.append("</svg>")
    return "".join(parts)
