"""A figure with its range: `Span(estimate, low, high)`, and the intervals a pilot's sample gives.

Every rate the estimate uses grows the work with its value (seconds per token, not tokens per
second), so a product or sum of spans takes lows with lows and highs with highs."""

from __future__ import annotations

import math
from dataclasses import dataclass

Z95 = 1.96  # a two-sided 95 % interval


@dataclass(frozen=True)
class Span:
    estimate: float
    low: float
    high: float

    @classmethod
    def of(cls, v: float | Span) -> Span:
        return v if isinstance(v, Span) else cls(float(v), float(v), float(v))

    def __add__(self, o: float | Span) -> Span:
        o = Span.of(o)
        return Span(self.estimate + o.estimate, self.low + o.low, self.high + o.high)

    __radd__ = __add__

    def __mul__(self, o: float | Span) -> Span:
        o = Span.of(o)
        return Span(self.estimate * o.estimate, self.low * o.low, self.high * o.high)

    __rmul__ = __mul__

    def __truediv__(self, d: float) -> Span:
        return Span(self.estimate / d, self.low / d, self.high / d)

    def cap(self, most: float | None) -> Span:
        """At most `most` (None: no cap)."""
        if most is None:
            return self
        return Span(min(self.estimate, most), min(self.low, most), min(self.high, most))

    def ceil(self) -> Span:
        return Span(math.ceil(self.estimate - 1e-9), math.ceil(self.low - 1e-9), math.ceil(self.high - 1e-9))

    def fixed(self) -> bool:
        return self.low == self.high

    def json(self, digits: int = 4) -> dict:
        return {k: _round(getattr(self, k), digits) for k in ("estimate", "low", "high")}


ZERO = Span(0.0, 0.0, 0.0)


def _round(v: float, digits: int) -> float | int:
    if float(v).is_integer():
        return int(v)
    return float(f"{v:.{digits}g}") if abs(v) < 1 else round(v, 2)


def mean_span(values: list[float]) -> Span:
    """The mean of `values` with its 95 % interval (the standard error at the sample's size): what
    the mean over many more items is expected to be."""
    n = len(values)
    m = sum(values) / n
    if n < 2:
        return Span(m, m * 0.5, m * 2.0)  # one item says nothing about the spread: a factor of 2
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    half = Z95 * sd / math.sqrt(n)
    return Span(m, max(m - half, 0.0), m + half)


def ratio_span(amounts: list[float], per: list[float]) -> Span:
    """An amount per unit pooled over items (sum of amounts / sum of units: tokens per request over
    trials of unequal length, whose long ones weigh as many requests as they made) with its 95 %
    interval (the ratio estimator's linearised standard error)."""
    n, total = len(amounts), sum(per)
    r = sum(amounts) / total if total else 0.0
    if n < 2 or not total:
        return Span(r, r * 0.5, r * 2.0)
    resid = [a - r * u for a, u in zip(amounts, per, strict=True)]
    half = Z95 * math.sqrt(sum(e * e for e in resid) / (n * (n - 1))) / (total / n)
    return Span(r, max(r - half, 0.0), r + half)


def rate_span(kept: int, total: int) -> Span:
    """A keep rate measured as kept of total, with its Wilson 95 % interval."""
    if total <= 0:
        return Span(1.0, 1.0, 1.0)
    p, n, z = kept / total, total, Z95
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return Span(p, max(centre - half, 0.0), min(centre + half, 1.0))
