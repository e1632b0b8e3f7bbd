"""What a build made, said when it ends: the Snakefile's success handler prints it for every
recipe target of the run (`snakemake NAME`, `otbuild build NAME`). Where the results and the
report are, and the report's headline (otbuild/report/headline.py: tasks kept, traces kept,
pass@1 ± standard error per benchmark, with `eval.base` the student's beside its untrained base's,
tokens and cost, job time), with its warnings."""

from __future__ import annotations

from pathlib import Path

from otbuild.plan import RESULTS, Plan
from otbuild.progress import duration
from otbuild.report import HTML
from otbuild.report import costs as costs_mod
from otbuild.report.charts import num
from otbuild.report.data import artifacts
from otbuild.report.headline import Headline, Part, headline
from otbuild.report.page import amount
from otbuild.stages import STAGES


def recipe_headline(plan: Plan, root: Path = Path(".")) -> Headline:
    """The headline of a planned recipe from what is built (the report stage computes the same)."""
    cfg = plan.nodes[-1].config  # the report's settings: every node, and the prices
    arts = artifacts(cfg.nodes, root)
    ranking = []
    rank = next((a for a in arts if STAGES[a.stage].ranks), None)
    if rank and rank.main_output.exists():
        import pyarrow.parquet as pq

        ranking = sorted(pq.read_table(rank.main_output).to_pylist(), key=lambda r: (r["rank"], r["candidate"]))
    return headline(cfg.recipe, arts, costs_mod.collect(arts, cfg.prices, root), ranking)


def summary(plan: Plan, root: Path = Path("."), wall: float | None = None) -> str:
    """The lines a build ends with for one recipe; `wall`: the run's wall-clock seconds."""
    name = plan.recipe.name
    head = recipe_headline(plan, root)
    t = head.total
    took = f" in {duration(wall)}" if wall is not None else ""
    lines = [
        f"otbuild: {name} is built{took}.",
        f"  results      {RESULTS / name}/  (manifest.json names every artifact, its id and rows)",
        f"  report       {RESULTS / name / 'report' / HTML}",
    ]
    if plan.search:
        from otbuild.search import WINNER, search_lines

        lines += [f"  {line}" for line in search_lines(plan)]
        lines.append(f"  winner       {RESULTS / name / WINNER}  (a plain recipe: build it by itself)")
    elif head.best:
        lines.append(f"  best         {head.best} (by mean cross-benchmark z-score)")
    for p in head.parts:
        lines += _part_lines(p, indent="  " if p.name is None else "    ")
    cost = amount(t["cost"]) if t["cost"] is not None else "– (no prices: set `prices:` in the recipe)"
    lines.append(
        f"  tokens       {num(t['input_tokens'])} in, {num(t['output_tokens'])} out "
        f"({num(t['requests'])} requests); cost {cost}"
    )
    lines.append(
        f"  job time     {duration(t['seconds']) if t['seconds'] else '–'} summed over jobs, "
        f"{amount(t['gpu_hours'])} GPU-hours"
    )
    lines += [f"  warning: {w}" for w in head.warnings]
    return "\n".join(lines)


def _part_lines(p: Part, indent: str) -> list[str]:
    out = [f"  candidate {p.name}:"] if p.name is not None else []
    if p.tasks:
        out.append(f"{indent}tasks kept   {num(p.tasks[1])} ({p.tasks[0]})")
    if p.traces:
        out.append(f"{indent}traces kept  {num(p.traces[1])} ({p.traces[0]})")
    for s in p.scores:
        extra = "".join((f", {s.failed} failed" if s.failed else "", f", {s.excluded} left out" if s.excluded else ""))
        score = f"{num(s.mean)} ± {num(s.stderr)}"
        if s.base:  # eval.base: the same model and tokenizer after 0 training steps, the same eval
            score = f"student {score} vs base {num(s.base.mean)} ± {num(s.base.stderr)}"
        out.append(f"{indent}pass@1       {s.benchmark} {score} ({s.repeats} repeats x {s.tasks} tasks{extra})")
    return out
