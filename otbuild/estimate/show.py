"""The estimate on the console: one table of the stages and the total, the rates each used and
where they came from, the assumptions that move the total most, warnings and the profile's flags."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from otbuild.estimate.run import Estimate
from otbuild.progress import duration
from otbuild.report.charts import num
from otbuild.span import Span

SHOWN = 8  # assumptions shown, those that move the total most first


def _n(v: Span | None, money: bool = False) -> str:
    if v is None:
        return "–"
    f = (lambda x: f"{x:,.2f}") if money else (lambda x: num(float(x) if x < 100 else round(x)))
    return f(v.estimate) if v.fixed() else f"{f(v.estimate)}\n[dim]({f(v.low)}–{f(v.high)})[/]"


def _days(seconds: float) -> str:
    """A duration; from two days on, in days."""
    return f"{seconds / 86400:,.1f} days" if seconds >= 2 * 86400 else duration(seconds)


def _t(v: Span | None) -> str:
    if v is None:
        return "–"
    return _days(v.estimate) if v.fixed() else f"{_days(v.estimate)}\n[dim]({_days(v.low)}–{_days(v.high)})[/]"


def show(est: Estimate, out: Console) -> None:
    table = Table(
        title=f"estimate: {est.recipe} (profile {est.profile.name}, {est.profile.parallel} jobs at once, "
        f"pilots: {', '.join(p.name for p in est.pilots) or 'none'})",
        caption="estimate (low–high); built artifacts cost nothing",
    )
    for col in ("stage", "counts", "requests", "tokens in / out", "cost", "GPU-hours", "wall"):
        table.add_column(col, overflow="fold", justify="left" if col in ("stage", "counts") else "right")
    for s in est.stages:
        counts = "\n".join(f"{k.replace('_', ' ')}: {_n(v)}" for k, v in s.counts.items())
        if s.built:
            table.add_row(escape(s.label), counts, "", "", "", "", "[green]built[/]")
            continue
        tokens = f"{_n(s.input_tokens)}\n{_n(s.output_tokens)}" if s.input_tokens.high or s.output_tokens.high else ""
        table.add_row(
            escape(s.label),
            counts,
            _n(s.requests) if s.requests.high else "",
            tokens,
            _n(s.cost, money=True),
            _n(s.gpu_hours) if s.gpu_hours.high else "",
            _t(s.wall_s),
        )
    t = est.total
    table.add_row(
        "[bold]total[/]",
        "",
        _n(t["requests"]),
        f"{_n(t['input_tokens'])}\n{_n(t['output_tokens'])}",
        _n(t["cost"], money=True),
        _n(t["gpu_hours"]),
        _t(t["wall_s"]),
        style="bold",
    )
    if worst := est.worst:
        table.add_row(
            "[bold]worst case[/] (search: no stage's default wins)",
            "",
            _n(worst["requests"]),
            f"{_n(worst['input_tokens'])}\n{_n(worst['output_tokens'])}",
            _n(worst["cost"], money=True),
            _n(worst["gpu_hours"]),
            _t(worst["wall_s"]),
        )
    out.print(table)

    rates = Table(title="rates used (per stage) and where each came from")
    for col in ("stage", "rate", "value", "unit", "source"):
        rates.add_column(col, overflow="fold")
    for s in est.stages:
        for r in s.rates:
            src = ("[yellow]assumed:[/] " if r.assumed else "[green]measured:[/] ") + escape(r.source)
            rates.add_row(escape(s.label), r.name, _n(r.value), r.unit, src)
    out.print(rates)

    if est.sensitivity:
        sens = Table(title="assumed rates, and how far each moves the total (the others at their estimate)")
        for col in ("rate", "value", "GPU-hours at low–high", "cost at low–high", "wall at low–high", "source"):
            sens.add_column(col, overflow="fold")
        for a in est.sensitivity[:SHOWN]:
            lo, hi = a["totals_at_low"], a["totals_at_high"]
            cost = "–" if lo["cost"] is None else f"{lo['cost']:,.2f}–{hi['cost']:,.2f}"
            sens.add_row(
                f"{a['stage']}.{a['rate']}",
                f"{num(a['estimate'])} ({num(a['low'])}–{num(a['high'])}) {a['unit']}",
                f"{lo['gpu_hours']:,.1f}–{hi['gpu_hours']:,.1f}",
                cost,
                f"{duration(lo['wall_s'])}–{duration(hi['wall_s'])}",
                escape(a["source"]),
            )
        out.print(sens)
        if len(est.sensitivity) > SHOWN:
            out.print(
                f"[dim]{len(est.sensitivity) - SHOWN} more assumptions move the total less (all of them: --json)[/]"
            )
    for s in est.stages:
        for note in dict.fromkeys(s.notes):
            if not note.startswith("built"):
                out.print(f"[dim]{escape(s.label)}: {escape(note)}[/]", highlight=False)
    for w in est.warnings:
        out.print(f"[yellow]warning:[/] {escape(w)}", highlight=False, soft_wrap=True)
    for f in est.flags:
        out.print(f"[bold red]profile:[/] {escape(f)}", highlight=False, soft_wrap=True)
    out.print(headline(est), highlight=False, soft_wrap=True)


def headline(est: Estimate) -> str:
    """One sentence: GPU-hours, API cost and wall time with their ranges, and how many rates were assumed."""
    t = est.total
    rates = [r for s in est.stages for r in s.rates]

    def span(v: Span | None, f) -> str:
        if v is None:
            return "–"
        return f(v.estimate) if v.fixed() else f"{f(v.estimate)} ({f(v.low)}-{f(v.high)})"

    cost = "no API cost priced" if t["cost"] is None else f"API cost {span(t['cost'], lambda x: f'{x:,.2f}')}"
    return (
        f"[bold]{est.recipe}[/]: about {span(t['gpu_hours'], lambda x: f'{x:,.0f}')} GPU-hours, {cost}, "
        f"{span(t['wall_s'], _days)} of wall time on profile {est.profile.name}; "
        f"{sum(r.assumed for r in rates)} of {len(rates)} rates assumed"
    )
