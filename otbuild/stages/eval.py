"""Eval: model x benchmark x repeat through the harness, then scores and their summary.

Trials run in shards exactly like teacher rollouts (same harness, sandbox and resume); the
merge job writes traces.parquet, scores.parquet (one row per benchmark, repeat and task) and
summary.parquet (mean pass@1 over repeats with its standard error, exceptions apart).
An infrastructure failure is never scored 0: past the recipe's `max_infra_failures` the shard
fails (otbuild/stagekit/failures.py), under it the trial is left out of the mean and counted
(`n_excluded`), as docs/failures.md says.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

from otbuild import duck, usage
from otbuild.settings.stages import EvalSettings
from otbuild.stagekit import Inputs, stage_run, stage_run_shard
from otbuild.stagekit.failures import outcome_stats
from otbuild.stagekit.trials import merge_shards, run_trials_shard
from otbuild.traces import outcome


@stage_run_shard
def run_shard(cfg: EvalSettings, inputs: Inputs, outdir: Path, shard: int) -> None:
    """The benchmarks' trials (a trained checkpoint among the inputs is the model, not tasks)."""
    run_trials_shard(cfg, Inputs.of(tasks=inputs.named("tasks")), outdir, shard)


@stage_run
def run(cfg: EvalSettings, inputs: Inputs, outdir: Path) -> dict:
    shards = merge_shards(cfg.shards, outdir)
    con = duck.connect()
    duck.run_template(
        con, "eval.sql", traces=str(outdir / "traces.parquet"), model=cfg.model_label, outcome=outcome.sql_context()
    )
    duck.copy_to_parquet(con, "SELECT * FROM ev_scores", outdir / "scores.parquet")
    duck.copy_to_parquet(con, "SELECT * FROM ev_summary", outdir / "summary.parquet")
    summary = con.execute("SELECT benchmark, mean, stderr, n_exceptions, n_excluded FROM ev_summary").fetchall()
    trials = cast(
        tuple,
        con.execute(  # an aggregate: one row
            "SELECT count(*) FILTER (NOT coalesce(is_subagent, false)) FROM read_parquet("
            f"{duck.sql_literal(outdir / 'traces.parquet')})"
        ).fetchone(),
    )[0]
    return {
        "trials": trials,
        "shards": shards,
        **outcome_stats(con, outdir / "traces.parquet"),
        "benchmarks": {b: {"mean": m, "stderr": s, "exceptions": e, "excluded": x} for b, m, s, e, x in summary},
        "llm_usage": usage.of_traces(outdir / "traces.parquet"),
        "engines": usage.engines_of_traces(outdir / "traces.parquet"),
    }
