"""Inline SVG charts, generated in Python: horizontal bars (with optional error bars, negative
values drawn left of a zero line), vertical columns (histograms) and lines (training curves).

Every chart is a self-contained `<svg>` string (markupsafe.Markup) with a <title> for screen
readers; every text that comes from data is escaped. No JS, no external fonts: the page's CSS
sets the font and the colours through the `c-*` classes. Sizes are in SVG user units; the page
scales the SVG to its column width (`viewBox`, width 100%).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from markupsafe import Markup, escape

W = 560  # default width of a chart, in user units
CHAR_W = 6.6  # approximate width of one character of the 11px label font
TICK_W = 6.2  # the same for the 10px tick font (digits are wider than the average character)


def num(v: float | None, digits: int = 3) -> str:
    """A readable number: integers with thousands separators, others with `digits` significant."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer() and abs(v) < 1e15):
        return f"{int(v):,}"
    if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e6):
        return f"{v:.{digits - 1}e}"
    return f"{v:.{digits}g}" if abs(v) >= 1 else f"{v:.{digits}f}".rstrip("0").rstrip(".")


def nice_ticks(lo: float, hi: float, n: int = 5, integer: bool = False) -> list[float]:
    """About n round tick values; the first <= lo, the last >= hi (whole numbers if `integer`)."""
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    steps = (1, 2, 5, 10) if integer else (1, 2, 2.5, 5, 10)
    step = next(m * mag for m in steps if m * mag >= raw)
    if integer:
        step = max(1, round(step))
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [round(k * step, 12) for k in range(first, last + 1)]


def _svg(width: float, height: float, title: str, body: list[str]) -> Markup:
    t = escape(title)
    return Markup(
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {width:.0f} {height:.0f}" '
        f'width="{width:.0f}" height="{height:.0f}" role="img" aria-label="{t}"><title>{t}</title>'
        + "".join(body)
        + "</svg>"
    )


def _text(x: float, y: float, s: str, anchor: str = "start", cls: str = "c-label", full: str | None = None) -> str:
    tip = f"<title>{escape(full)}</title>" if full and full != s else ""
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" class="{cls}">{tip}{escape(s)}</text>'


def _clip(s: str, chars: int) -> str:
    return s if len(s) <= chars else s[: max(chars - 1, 1)] + "…"


def bars(
    items: Sequence[tuple[str, float]],
    *,
    title: str,
    errors: Sequence[float | None] | None = None,
    fmt: Callable[[float], str] = num,
    width: float = W,
    domain: tuple[float, float] | None = None,
) -> Markup:
    """Horizontal bars, one per (label, value); `errors` draws ±e whiskers; values below 0
    go left of a zero line. The value is written at the right of each row."""
    items = [(str(k), float(v)) for k, v in items]
    errs = [float(e or 0) for e in (errors or [0] * len(items))]
    row, bar_h, top, bottom = 22, 14, 6, 24
    longest = max((len(k) for k, _ in items), default=4)
    label_w = min(longest * CHAR_W + 12, 230)
    chars = longest if label_w < 230 else int((230 - 12) / CHAR_W)
    value_w = max((len(_value(v, e, fmt)) for (_, v), e in zip(items, errs)), default=4) * CHAR_W + 12
    plot_w = width - label_w - value_w
    lo = min([0.0] + [v - e for (_, v), e in zip(items, errs)])
    hi = max([0.0] + [v + e for (_, v), e in zip(items, errs)])
    if domain:
        lo, hi = min(lo, domain[0]), max(hi, domain[1])
    ticks = nice_ticks(lo, hi, 4)
    lo, hi = min(lo, ticks[0]), max(hi, ticks[-1])

    def x(v: float) -> float:
        return label_w + (v - lo) / (hi - lo) * plot_w

    height = top + row * len(items) + bottom
    body = []
    for t in ticks:
        body.append(f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{top}" y2="{height - bottom}" class="c-grid"/>')
        body.append(_text(x(t), height - bottom + 14, num(t), "middle", "c-tick"))
    for i, ((label, v), e) in enumerate(zip(items, errs)):
        y = top + i * row + (row - bar_h) / 2
        x0, x1 = sorted((x(0), x(v)))
        cls = "c-bar-neg" if v < 0 else "c-bar"
        body.append(
            f'<rect x="{x0:.1f}" y="{y:.1f}" width="{max(x1 - x0, 0.5):.1f}" height="{bar_h}" '
            f'class="{cls}"><title>{escape(label)}: {escape(_value(v, e, fmt))}</title></rect>'
        )
        if e:
            cy = y + bar_h / 2
            body.append(
                f'<path d="M{x(v - e):.1f} {cy:.1f}H{x(v + e):.1f}M{x(v - e):.1f} {cy - 5:.1f}v10'
                f'M{x(v + e):.1f} {cy - 5:.1f}v10" class="c-err"/>'
            )
        body.append(_text(label_w - 6, y + bar_h - 3, _clip(label, chars), "end", full=label))
        body.append(_text(label_w + plot_w + 6, y + bar_h - 3, _value(v, e, fmt), "start", "c-value"))
    if lo < 0 < hi:
        body.append(f'<line x1="{x(0):.1f}" x2="{x(0):.1f}" y1="{top}" y2="{height - bottom}" class="c-axis"/>')
    return _svg(width, height, title, body)


def _value(v: float, e: float, fmt: Callable[[float], str]) -> str:
    return f"{fmt(v)} ± {fmt(e)}" if e else fmt(v)


def columns(
    items: Sequence[tuple[str, float]],
    *,
    title: str,
    xlabel: str = "",
    ylabel: str = "",
    width: float = W,
    height: float = 220,
) -> Markup:
    """Vertical columns (a histogram: one column per bin label), the count above each."""
    items = [(str(k), float(v)) for k, v in items]
    ticks = nice_ticks(0, max([v for _, v in items] + [1]), 4, integer=True)
    left, right, top, bottom = _left(ticks, ylabel), 10, 16, 40
    plot_w, plot_h = width - left - right, height - top - bottom
    hi = ticks[-1]
    n = max(len(items), 1)
    slot = plot_w / n
    every = max(1, math.ceil(n * 7 * max((len(k) for k, _ in items), default=1) / plot_w))

    def y(v: float) -> float:
        return top + plot_h - v / hi * plot_h

    body = []
    for t in ticks:
        body.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y(t):.1f}" y2="{y(t):.1f}" class="c-grid"/>')
        body.append(_text(left - 6, y(t) + 4, num(t), "end", "c-tick"))
    for i, (label, v) in enumerate(items):
        x0 = left + i * slot + slot * 0.1
        body.append(
            f'<rect x="{x0:.1f}" y="{y(v):.1f}" width="{slot * 0.8:.1f}" height="{plot_h - (y(v) - top):.1f}" '
            f'class="c-bar"><title>{escape(label)}: {escape(num(v))}</title></rect>'
        )
        if n <= 30 and v:
            body.append(_text(x0 + slot * 0.4, y(v) - 3, num(v), "middle", "c-value"))
        if i % every == 0:
            body.append(_text(x0 + slot * 0.4, top + plot_h + 14, label, "middle", "c-tick"))
    body.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{top + plot_h}" y2="{top + plot_h}" class="c-axis"/>')
    body += _axis_labels(left, plot_w, top, plot_h, height, xlabel, ylabel)
    return _svg(width, height, title, body)


def line(
    points: Sequence[tuple[float, float]],
    *,
    title: str,
    xlabel: str = "",
    ylabel: str = "",
    width: float = W,
    height: float = 220,
    max_points: int = 1000,
) -> Markup:
    """A line through (x, y) points in x order (thinned to about max_points), with a marker
    on each point when there are few."""
    pts = sorted((float(a), float(b)) for a, b in points if b is not None and not math.isnan(b))
    if len(pts) > max_points:
        k = math.ceil(len(pts) / max_points)
        pts = pts[::k] + ([pts[-1]] if (len(pts) - 1) % k else [])
    xs, ys = [p[0] for p in pts] or [0.0], [p[1] for p in pts] or [0.0]
    xt = nice_ticks(min(xs), max(xs), 5)
    pad = (max(ys) - min(ys)) * 0.05 or abs(max(ys)) * 0.05 or 1
    yt = nice_ticks(min(ys) - pad, max(ys) + pad, 4)
    left, right, top, bottom = _left(yt, ylabel), 12, 12, 40
    plot_w, plot_h = width - left - right, height - top - bottom
    x_lo, x_hi, y_lo, y_hi = xt[0], xt[-1], yt[0], yt[-1]

    def px(v: float) -> float:
        return left + (v - x_lo) / ((x_hi - x_lo) or 1) * plot_w

    def py(v: float) -> float:
        return top + plot_h - (v - y_lo) / ((y_hi - y_lo) or 1) * plot_h

    body = []
    for t in yt:
        body.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{py(t):.1f}" y2="{py(t):.1f}" class="c-grid"/>')
        body.append(_text(left - 6, py(t) + 4, num(t), "end", "c-tick"))
    for t in xt:
        body.append(_text(px(t), top + plot_h + 14, num(t), "middle", "c-tick"))
    body.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{top + plot_h}" y2="{top + plot_h}" class="c-axis"/>')
    if pts:
        path = " ".join(f"{px(a):.1f},{py(b):.1f}" for a, b in pts)
        body.append(f'<polyline points="{path}" class="c-line"/>')
        if len(pts) <= 60:
            body += [
                f'<circle cx="{px(a):.1f}" cy="{py(b):.1f}" r="2.5" class="c-dot">'
                f"<title>{escape(num(a))}: {escape(num(b, 4))}</title></circle>"
                for a, b in pts
            ]
    body += _axis_labels(left, plot_w, top, plot_h, height, xlabel, ylabel)
    return _svg(width, height, title, body)


def _left(ticks: Sequence[float], ylabel: str) -> float:
    """The left margin: the widest y tick label, right-aligned 6 units left of the plot, and the
    rotated y axis label left of it (never over the ticks)."""
    return 6 + max(len(num(t)) for t in ticks) * TICK_W + (24 if ylabel else 6)


def _axis_labels(left, plot_w, top, plot_h, height, xlabel, ylabel) -> list[str]:
    out = []
    if xlabel:
        out.append(_text(left + plot_w / 2, height - 6, xlabel, "middle", "c-axis-label"))
    if ylabel:
        cy = top + plot_h / 2
        out.append(
            f'<text x="12" y="{cy:.1f}" text-anchor="middle" class="c-axis-label" '
            f'transform="rotate(-90 12 {cy:.1f})">{escape(ylabel)}</text>'
        )
    return out
