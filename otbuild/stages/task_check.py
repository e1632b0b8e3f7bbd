"""Task check (`task_check:`): each task is run, twice, in the recipe's sandbox: its reference solution
(the oracle engine replays solution/solve.sh) and a do-nothing agent (the noop engine declares
the task complete at once). A task is kept when its solution passes and doing nothing fails
(OpenThoughts-Agent's validity gate); the others are dropped with why and the tail of what the
deciding verifier printed. Writes kept.parquet and rejected.parquet.

Where it runs: after near_dedup and before task_score (a task filter's `llm`). The text
filters before it are cheap and shrink what it runs; every task it drops is one the paid LLM
scoring after it does not pay for, and one whose traces would teach nothing (a broken
verifier rewards anything, or nothing). It reads the tasks as the mix (and near_dedup) left
them, so a task upsampled twice runs twice: near_dedup, or the task filter's dedup, drops
such copies first.

The trials are stagekit's (otbuild/stagekit/trials.py), one run per engine, each in its own
folder (oracle/, noop/) with its own partial files: a shard job runs the oracle's trials of
its shard, then the noop's, and a rerun after kill -9 skips an engine whose shard is written
and resumes the other from its partial file. Infrastructure failures are retried there; what
still fails is `environment_fails` (otbuild/traces/outcome.py: infrastructure, not_run). The
sandbox settings are the teacher's where this section leaves them unset (the plan copies
them: otbuild/plan/planners.py), so a task image podman builds here is the one the rollouts
use (its tag is the hash of the task's environment/, whoever builds it).

Reasons: `no_solution` (no solution/solve.sh; `no_solution: keep` keeps it, given that doing
nothing fails), `environment_fails`, `solution_fails` (the solution's reward is below 1, or
its trial ended in an error of the task's), `noop_passes` (the verifier passes the untouched
environment).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Field

from otbuild import duck
from otbuild.errors import StageError
from otbuild.fsio import atomic_path
from otbuild.settings.base import MAX_EPISODES, execution_only
from otbuild.settings.recipe import PromptStyle
from otbuild.settings.stages import RolloutSettings
from otbuild.settings.trials import ShardedTrials
from otbuild.span import Span
from otbuild.stagekit import DefaultRate, Inputs, StageDef, shard_path, stage_run, stage_run_shard
from otbuild.stagekit.failures import outcome_stats
from otbuild.stagekit.trials import merge_shards, run_trials_shard
from otbuild.tasks.table import BATCH_ROWS
from otbuild.traces import outcome as oc

ENGINES = ("oracle", "noop")  # the reference solution, then nothing done
REASONS = ("no_solution", "environment_fails", "solution_fails", "noop_passes")
# what a rejected row carries beside its reason
REJECTED_COLUMNS = ("oracle_outcome", "oracle_reward", "noop_outcome", "noop_reward", "verifier_output")


class TaskCheck(ShardedTrials):
    """Run each task's reference solution and a do-nothing agent in the sandbox; keep the tasks
    whose solution passes and whose untouched environment fails (docs/task-filter.md). The
    trial settings left unset here are the teacher's."""

    max_episodes: int = Field(
        default=500,
        ge=1,
        le=MAX_EPISODES,
        description="turns of the solution's replay (one top-level command of solve.sh each)",
    )
    no_solution: Literal["drop", "keep"] = Field(
        default="drop",
        description="a task without solution/solve.sh: drop it (`no_solution`), or keep it when doing nothing fails",
    )
    output_chars: int = Field(
        default=2000,
        ge=0,
        le=100_000,
        description="the last characters of the deciding verifier's output (else its error) a rejected row keeps",
    )
    concurrency: int = execution_only(4, ge=1, le=1024, description="trials in flight per shard")
    max_dropped_fraction: float = execution_only(
        0.5,
        ge=0,
        le=1,
        description="fail when more of the tasks are dropped (a broken source, a sandbox that cannot run them)",
    )


class TaskCheckSettings(TaskCheck, PromptStyle):
    """The task_check section with the harness's prompt style: what its jobs run."""


def trial_settings(cfg: TaskCheckSettings, engine: str) -> RolloutSettings:
    """The settings stagekit's trials take: the section's trial settings, one trial per task,
    run by `engine` (oracle, or noop: set after validation, as the teacher's section does not
    offer a do-nothing engine), with Harbor's own agent for it."""
    trials = cfg.model_dump(include=set(ShardedTrials.model_fields) - {"harbor"})
    harbor = cfg.harbor.model_copy(update={"agent": None})
    oracle = RolloutSettings(
        engine="oracle", concurrency=cfg.concurrency, prompt=cfg.prompt, protocol=cfg.protocol, harbor=harbor, **trials
    )
    return oracle if engine == "oracle" else oracle.model_copy(update={"engine": engine})


def _per_task(cfg: TaskCheckSettings, engine: str) -> str | None:
    """The task column that says which tasks an engine runs: the oracle those with a solution;
    the noop every task, or (no_solution: drop) the same as the oracle."""
    return "has_solution" if engine == "oracle" or cfg.no_solution == "drop" else None


@stage_run_shard
def run_shard(cfg: TaskCheckSettings, inputs: Inputs, outdir: Path, shard: int) -> None:
    """The shard's oracle trials, then its noop trials (each engine's shard is skipped when a
    run before a kill wrote it); then the shard's record: its trials per engine."""
    trials = []
    for engine in ENGINES:
        work = outdir / engine
        done = shard_path(work, cfg.shards, shard)
        if not done.exists():
            run_trials_shard(
                trial_settings(cfg, engine),
                inputs,
                work,
                shard,
                per_task=_per_task(cfg, engine),
                verifier_output=cfg.output_chars,
            )
        trials.append(pq.ParquetFile(done).metadata.num_rows)
    with atomic_path(shard_path(outdir, cfg.shards, shard)) as tmp:
        pq.write_table(pa.table({"engine": list(ENGINES), "trials": trials}), tmp)


@stage_run
def run(cfg: TaskCheckSettings, inputs: Inputs, outdir: Path) -> dict:
    """Merge each engine's shards into ENGINE/traces.parquet, decide each task, write kept and
    rejected (streamed), failing first when most tasks are dropped."""
    tasks = inputs.named("tasks") or list(inputs)
    traces = {}
    for engine in ENGINES:
        merge_shards(cfg.shards, outdir / engine)
        traces[engine] = outdir / engine / "traces.parquet"
    con = duck.connect()
    duck.run_template(
        con,
        "task_check.sql",
        inputs=[str(p) for p in tasks],
        offsets=duck.input_offsets(tasks),
        traces={k: str(v) for k, v in traces.items()},
        noop_all=cfg.no_solution == "keep",
        drop_unsolved=cfg.no_solution == "drop",
        chars=cfg.output_chars,
        outcome=oc.sql_context(),
    )
    _check_matched(con, cfg)
    check_dropped(con, cfg)
    stats = duck.stream_split(
        con, "v_out", tasks, outdir, rejected_by="task_check", rejected_columns=REJECTED_COLUMNS, batch_rows=BATCH_ROWS
    )
    stats["rejected_by_reason"] = {r: stats["rejected_by_reason"].get(r, 0) for r in REASONS}
    runs = {e: outcome_stats(con, traces[e]) for e in ENGINES}
    stats["trials"] = sum(sum(r["outcomes"].values()) for r in runs.values())
    stats["trials_by_engine"] = {e: sum(r["outcomes"].values()) for e, r in runs.items()}
    stats["outcomes_by_engine"] = {e: r["outcomes"] for e, r in runs.items()}
    stats["infra_failures"] = sum(r["infra_failures"] for r in runs.values())
    return stats


def _check_matched(con, cfg: TaskCheckSettings) -> None:
    """Every trial belongs to the task it is matched with (a trace file out of step with its
    tasks is a bug, never a verdict)."""
    ((wrong,),) = con.execute(
        "SELECT count(*) FROM v_decided WHERE (sol AND oracle_task IS DISTINCT FROM task_id) OR "
        f"((sol OR {'false' if cfg.no_solution == 'drop' else 'true'}) AND noop_task IS DISTINCT FROM task_id)"
    ).fetchall()
    if wrong:
        raise RuntimeError(f"task_check: {wrong} task(s) do not match their trials: the trace files are out of step")


def check_dropped(con, cfg: TaskCheckSettings) -> None:
    """Fail, before writing, when more than `max_dropped_fraction` of the tasks would be dropped,
    naming the counts per reason and the sources that lose the most."""
    ((total, dropped),) = con.execute("SELECT count(*), count(reason) FROM v_decided").fetchall()
    if not total:
        raise StageError("task_check: no tasks to check: the stages before it kept none")
    if dropped <= cfg.max_dropped_fraction * total:
        return
    reasons = con.execute(
        "SELECT split_part(reason, ':', 1) AS r, count(*) FROM v_decided WHERE reason IS NOT NULL GROUP BY r ORDER BY r"
    ).fetchall()
    sources = con.execute(
        "SELECT coalesce(source, '?'), count(reason), count(*), mode(split_part(reason, ':', 1)) FROM v_decided "
        "GROUP BY ALL ORDER BY count(reason) DESC, 1 LIMIT 5"
    ).fetchall()
    example = con.execute("SELECT reason FROM v_decided WHERE reason IS NOT NULL ORDER BY _ord LIMIT 1").fetchall()
    raise StageError(
        f"task_check: {dropped} of the {total} tasks ({dropped / total:.1%}) fail their check, more than "
        f"max_dropped_fraction {cfg.max_dropped_fraction} ({', '.join(f'{k}: {n}' for k, n in reasons)}; "
        f"by source: {'; '.join(f'{s}: {d} of {t} dropped, mostly {r}' for s, d, t, r in sources if d)}; "
        f"the first: {example[0][0][:300]!r}). A source whose tasks all fail is broken (its Dockerfiles, "
        "its generator); a sandbox that cannot run them fails them all (environment_fails). Raise "
        "max_dropped_fraction if the pool is meant to lose them"
    )


def estimate(m, n, e) -> None:
    """Two trials per task (the solution's, doing nothing's), each a scripted agent and the
    verifier (no model, no tokens); tasks kept at the keep rate (a pilot's, else assumed)."""
    cfg = n.config
    tasks = m.rows_in(n)
    trials = tasks * len(ENGINES)
    per = m.rate(e, n, "seconds_per_trial")
    over = m.job_rate(e, n, "overhead_s")
    m.job(e, n.stage, cfg.shards, over + trials / cfg.shards * per / cfg.concurrency)
    m.job(e, f"{n.stage}_merge", 1, m.job_rate(e, n, "merge_s", otherwise="merge_s"))
    m.kept_at_rate(n, e, tasks)
    e.counts["trials"] = trials


STAGE = StageDef(
    "task_check",
    1,
    ("kept.parquet", "rejected.parquet"),
    __name__,
    TaskCheckSettings,
    plan="teacher_trials",  # its section, the teacher's trial settings where it leaves them unset
    consumes=("tasks",),
    produces="tasks",
    sharded=True,
    trials=True,
    tasks=True,
    filter=True,
    counts={"tasks_kept": "rows", "trials": "trials"},
    volatile={"rejected.parquet": ("verifier_output",)},  # a verifier's words may hold its clock (pytest's seconds)
    recipe_field=(TaskCheck | None, None),
    estimate=estimate,
    rates={
        "seconds_per_trial": DefaultRate(
            Span(60, 10, 600),
            "s per concurrent slot",
            "a scripted agent (solve.sh, or nothing) and the task's verifier; no model",
        ),
        "keep_rate": DefaultRate(
            Span(0.8, 0.25, 1.0),
            "kept / in",
            "curated tasks mostly pass; OpenThoughts-Agent's synthesized solutions passed for 26% of tasks in "
            "one batch",
        ),
    },
)
