"""The headline of a build: what it made and whether it worked, the numbers a newcomer looks
for first. `headline` computes them from the artifacts' records, the eval summaries and the
training logs (no scan of the trace tables, so it is cheap at any scale); the report's top
block (page.py) and the summary a build prints when it ends (otbuild/summary.py) show them.

- tasks kept: rows of the task set the rollouts start from (the task filter's, else the mix's...)
- traces kept: rows of the trace set (the trace filter's, else the rollouts' and imports')
- pass@1 ± standard error per benchmark, with repeats, tasks and failed trials
- tokens and cost (otbuild/report/costs.py), job time and GPU-hours (the jobs' benchmarks)
- with `eval.base`, the untrained base's pass@1 beside the student's on each benchmark
- flags: results that carry no signal, e.g. a run of trials whose health it warned about
  (one-turn trials, one reward, one error: docs/failures.md), an RL run whose loss and grad
  norm are 0 at every step, a benchmark on which every trial failed or scored 0, or a student that does not score
  above its untrained base.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from otbuild.report import costs as costs_mod
from otbuild.report.charts import num
from otbuild.report.data import Artifact, by_candidate, evals, final_tasks, final_traces, is_base, total_rows, train_log
from otbuild.stagekit.training import LOSS_KEYS, REWARD_KEYS
from otbuild.stages import STAGES


@dataclass
class Score:
    """One benchmark of an eval: pass@1 over tasks and repeats, ± its standard error."""

    benchmark: str
    model: str
    mean: float | None  # None: no trial was scored (every one left out)
    stderr: float | None
    repeats: int
    tasks: int
    failed: int  # trials that scored 0 for a failure (verifier errors, task failures)
    excluded: int  # trials left out of the mean (infrastructure failures, tasks not run)
    base: Score | None = None  # `eval.base`: the untrained base's score on the same benchmark


@dataclass
class Flag:
    """A degenerate result, shown at the top of the report, in its section and on the console."""

    section: str  # "traces", "sft", "rl" or "eval": the report's section it belongs to
    label: str  # the artifact's label within its group
    text: str


@dataclass
class Part:
    """The headline of one recipe, or of one candidate of an ablation."""

    name: str | None  # the candidate, None for a plain recipe
    tasks: tuple[str, int | None] | None = None  # (label, rows)
    traces: tuple[str, int | None] | None = None  # (label(s), rows)
    eval_label: str | None = None
    scores: list[Score] = field(default_factory=list)
    flags: list[Flag] = field(default_factory=list)


@dataclass
class Headline:
    recipe: str
    parts: list[Part]
    total: dict  # costs.Costs.total: requests, errors, tokens, cost, seconds (summed job time), gpu_hours
    unpriced: list[str]  # models used without a price
    best: str | None = None  # the best-ranked candidate of an ablation

    @property
    def flags(self) -> list[tuple[str | None, Flag]]:
        return [(p.name, f) for p in self.parts for f in p.flags]

    @property
    def warnings(self) -> list[str]:
        """Each flag as one line: `[candidate: ]label: text`."""
        return [f"{name + ': ' if name else ''}{f.label}: {f.text}" for name, f in self.flags]


def headline(recipe: str, arts: list[Artifact], costs: costs_mod.Costs, ranking: list[dict] | None = None) -> Headline:
    parts = [_part(name, members) for name, members in by_candidate(arts)]
    return Headline(recipe, parts, costs.total, costs.unpriced, best=ranking[0]["candidate"] if ranking else None)


def _part(name: str | None, arts: list[Artifact]) -> Part:
    p = Part(name)
    if tasks := final_tasks(arts):
        p.tasks = (tasks.local, tasks.rows)
    if traces := final_traces(arts):
        rows = [a.rows for a in traces]
        p.traces = (", ".join(a.local for a in traces), total_rows(rows))
    for a in arts:
        if STAGES[a.stage].training and (flag := training_flag(a)):
            p.flags.append(flag)
        p.flags += health_flags(a)
    ev = next((a for a in evals(arts) if not is_base(a)), None)
    if ev and ev.main_output.exists():
        p.eval_label = ev.local
        p.scores = eval_scores(ev)
        base = next((a for a in evals(arts) if is_base(a) and a.main_output.exists()), None)
        by_benchmark = {s.benchmark: s for s in eval_scores(base)} if base else {}
        for s in p.scores:
            s.base = by_benchmark.get(s.benchmark)
        p.flags += [Flag("eval", ev.local, text) for s in p.scores if (text := score_flag(s))]
        if base:  # its scores of 0 are expected; a base that was never scored is not
            p.flags += [Flag("eval", base.local, text) for s in by_benchmark.values() if (text := unscored_flag(s))]
    return p


def eval_scores(ev: Artifact) -> list[Score]:
    """An eval's summary.parquet, one Score per benchmark (and model)."""
    import pyarrow.parquet as pq

    out = []
    for r in pq.read_table(ev.main_output).to_pylist():
        out.append(
            Score(
                r["benchmark"],
                r.get("model") or "",
                r.get("mean"),
                r.get("stderr"),
                int(r.get("repeats") or 0),
                int(r.get("n_tasks") or 0),
                int((r.get("n_exceptions") or 0) + (r.get("n_task_failures") or 0)),
                int(r.get("n_excluded") or 0),
            )
        )
    return out


def unscored_flag(s: Score) -> str | None:
    trials = s.repeats * s.tasks
    if s.mean is None or (trials and s.excluded >= trials):
        return (
            f"{s.benchmark}: no trial was scored: all {trials} were left out as infrastructure "
            "failures or not run (the eval's log says why)."
        )
    return None


def score_flag(s: Score) -> str | None:
    if text := unscored_flag(s):
        return text
    if s.mean == 0:
        why = f"{s.failed} of them failed (verifier errors, task failures)" if s.failed else "none passed its verifier"
        return (
            f"{s.benchmark}: every trial scored 0 ({s.repeats} repeats x {s.tasks} tasks; {why}): "
            "this score says nothing about the model."
        )
    b = s.base
    if b is not None and b.mean is not None and s.mean is not None and s.mean <= b.mean:
        return (
            f"{s.benchmark}: the student ({num(s.mean)} ± {num(s.stderr)}) does not score above its "
            f"untrained base ({num(b.mean)} ± {num(b.stderr)}): training did not help on it."
        )
    return None


def health_flags(a: Artifact) -> list[Flag]:
    """What a run of trials warned about itself (its stats' `health`: one-turn trials, one reward,
    one error; otbuild/stagekit/run_health.py), under `health.on_broken: warn` or as an eval; an
    untrained base's are expected."""
    d = STAGES[a.stage]
    if not d.trials or d.training or is_base(a):
        return []
    section = "traces" if d.traces else "eval"
    return [
        Flag(section, a.local, f"The run looks broken: {w}.") for w in a.stats.get("health", {}).get("warnings", [])
    ]


def training_flag(a: Artifact) -> Flag | None:
    """A training run that learned nothing: RL whose loss and grad norm are 0 at every step (no
    advantage: every sample of a task got the same reward), SFT whose loss is not finite."""
    _, lines = train_log(a)
    if not lines:
        return None
    if STAGES[a.stage].trials:  # trained on its own trials' rewards (RL)
        if not all(r.get(k) == 0 for r in lines for k in ("loss", "grad_norm")):
            return None
        key = next((k for k in REWARD_KEYS if any(k in r for r in lines)), None)
        rewards = {r.get(key) for r in lines}
        why = (
            f"{key} is 0 at every step: no rollout passed"
            if key and rewards == {0}
            else f"{key} is {rewards.pop()} at every step"
            if key and len(rewards) == 1
            else "each task's samples got the same reward"
        )
        return Flag(
            "rl",
            a.local,
            f"No learning signal: loss and grad norm are 0 at all {len(lines)} steps "
            f"({why}, so every advantage is 0): the policy did not change.",
        )
    key = next((k for k in LOSS_KEYS if any(k in r for r in lines)), None)
    if key and not all(isinstance(r[key], int | float) and math.isfinite(r[key]) for r in lines if key in r):
        return Flag("sft", a.local, f"The {key} is not a finite number at some steps: the run diverged.")
    return None
