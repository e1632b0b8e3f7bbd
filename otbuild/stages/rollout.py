"""Teacher rollouts: the recipe's tasks x `samples_per_task` trials through the harness, in
shards that are separate Snakemake jobs (otbuild/stagekit/trials.py: resume, failures, the
merge), merged into traces.parquet with the run's counts."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from otbuild import duck, usage
from otbuild.settings.recipe import AgentModel
from otbuild.settings.stages import RolloutSettings
from otbuild.span import ZERO
from otbuild.stagekit import Inputs, StageDef, run_health, stage_run, stage_run_shard
from otbuild.stagekit.failures import outcome_stats
from otbuild.stagekit.trials import TRACES, merge_calls, merge_shards, run_trials_shard


@stage_run_shard
def run_shard(cfg: RolloutSettings, inputs: Inputs, outdir: Path, shard: int) -> None:
    run_trials_shard(cfg, inputs, outdir, shard)


@stage_run
def run(cfg: RolloutSettings, inputs: Inputs, outdir: Path) -> dict:
    """Merge the shards into traces.parquet; the summary reads 5 narrow columns back. A broken
    run (otbuild/stagekit/run_health.py) fails here, or warns."""
    shards = merge_shards(cfg.shards, outdir)
    health = run_health.check(cfg, outdir / "traces.parquet", "rollout")
    con = duck.connect()
    outcomes = outcome_stats(con, outdir / "traces.parquet")
    trials, subagents, passed, exceptions, timed_out = cast(
        tuple,
        con.execute(  # aggregates: one row
            "SELECT count(*) FILTER (NOT sub), count(*) FILTER (sub), count(*) FILTER (NOT sub AND reward >= 1.0),"
            " count(*) FILTER (NOT sub AND coalesce(exception, '') <> ''),"
            " count(*) FILTER (NOT sub AND coalesce(timed_out, false))"
            " FROM (SELECT coalesce(is_subagent, false) AS sub, reward, exception, timed_out"
            f" FROM read_parquet({duck.sql_literal(outdir / 'traces.parquet')}))"
        ).fetchone(),
    )
    return {
        "trials": trials,
        "subagent_traces": subagents,
        "shards": shards,
        "passed": passed,
        "exceptions": exceptions,
        "timed_out": timed_out,
        **outcomes,
        **health,
        "llm_usage": usage.of_traces(outdir / "traces.parquet"),
        "engines": usage.engines_of_traces(outdir / "traces.parquet"),
        **merge_calls(cfg, outdir),
    }


def estimate(m, n, e) -> None:
    """The rollouts a task filter planned, else tasks x samples_per_task trials (an oracle's
    samples of a task are one conversation)."""
    cfg = n.config
    tasks = m.rows_in(n)
    planned = [m.rollouts[i.id] for i in n.inputs if i.id in m.rollouts]
    trials = sum(planned, ZERO) if planned else tasks * cfg.samples_per_task
    e.counts["tasks"] = tasks
    m.trials(n, e, trials, f"{cfg.engine}:{cfg.model or cfg.engine}", cfg.engine == "vllm")
    m.rows[n.id] = trials
    if cfg.engine == "oracle":  # it replays the same solution: a task's samples are one trace
        m.distinct[n.id] = tasks


STAGE = StageDef(
    "rollout",
    3,
    ("traces.parquet",),
    __name__,
    RolloutSettings,
    section="teacher",
    consumes=("tasks",),
    produces="traces",
    sharded=True,
    gpu=True,
    trials=True,
    llm=True,
    traces=True,
    volatile=TRACES,
    counts={"trials": "trials"},
    recipe_field=(AgentModel | None, None),
    estimate=estimate,
)
