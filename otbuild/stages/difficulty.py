"""Task difficulty by a pilot model's pass@k: each task's `k` trials of the pilot (an agent model
like the teacher's, through the same harness and sandbox) in shards that are separate Snakemake
jobs (otbuild/stagekit/trials.py: resume after kill -9, infrastructure retries), then one merge
job writes the task table with the pilot's verdict (tasks.parquet: every input row, in order,
plus pass_rate, pilot_trials, pilot_errors, band, band_reason) and the pilot's trials beside it
(traces.parquet, in the teacher's trace format).

The bands are OpenThoughts-Agent's (data/difficulty_filtering): impossible (0), very_hard
(0, 25%], hard (25, 50%], medium (50, 75%], easy (75, 100%), trivial (100%). Unlike theirs,
an infrastructure failure (the endpoint, the sandbox) is retried and then counted apart
(`pilot_errors`), never scored as a failed attempt; a task none of whose trials was scored has
no band (NULL) and says why in band_reason. The task filter's `draw` picks tasks by band
(docs/task-filter.md); RL leaves out trivial and impossible tasks (`rl.skip_bands`).
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, model_validator

from otbuild import duck, usage
from otbuild.settings.base import MAX_REPEATS, execution_only
from otbuild.settings.recipe import AgentModel
from otbuild.settings.stages import RolloutSettings
from otbuild.stagekit import Inputs, StageDef, run_health, stage_run, stage_run_shard
from otbuild.stagekit.failures import outcome_stats
from otbuild.stagekit.trials import TRACES, merge_shards, run_trials_shard
from otbuild.tasks.table import BATCH_ROWS
from otbuild.traces import outcome as oc

BANDS = ("impossible", "very_hard", "hard", "medium", "easy", "trivial")
UNSCORED = "unscored"  # the histogram's name for a task without a band
PILOT_COLUMNS = ("pass_rate", "pilot_trials", "pilot_errors", "band", "band_reason")


class Difficulty(AgentModel):
    """A pilot model runs every task `k` times in the teacher's harness and sandbox; each task
    gets its pass rate (passes / scored trials) and band (docs/task-filter.md). Infrastructure
    failures are retried, then counted apart (`pilot_errors`), not scored as failures."""

    k: int = Field(default=8, ge=1, le=MAX_REPEATS, description="pilot trials per task (pass@k)")
    allow_all_impossible: bool = execution_only(
        False,
        description="go on when the pilot solves no task at all (by default that fails: a pilot "
        "that cannot solve anything gives no learning signal to select by)",
    )

    @model_validator(mode="after")
    def _k_not_samples(self):
        if self.samples_per_task != 1:
            raise ValueError("set k (pilot trials per task), not samples_per_task")
        if not self.verify:
            raise ValueError("verify: false leaves every trial without a reward: the pilot needs the verifier")
        return self


class DifficultySettings(Difficulty, RolloutSettings):
    """The difficulty section with the harness's prompt style: what its trial shards run."""


@stage_run_shard
def run_shard(cfg: DifficultySettings, inputs: Inputs, outdir: Path, shard: int) -> None:
    run_trials_shard(cfg, inputs, outdir, shard, samples=cfg.k)


@stage_run
def run(cfg: DifficultySettings, inputs: Inputs, outdir: Path) -> dict:
    """Merge the shards into traces.parquet, then the task table with each task's verdict."""
    shards = merge_shards(cfg.shards, outdir)
    traces, tasks = outdir / "traces.parquet", list(inputs)
    con = duck.connect()
    duck.run_template(
        con,
        "difficulty.sql",
        inputs=[str(p) for p in tasks],
        offsets=duck.input_offsets(tasks),
        traces=str(traces),
        outcome=oc.sql_context(),
        unscored=oc.sql_in((*oc.EXCLUDED_FROM_SCORES, oc.UNVERIFIED)),
    )
    summary = pilot_summary(con)
    check_pilot(cfg, summary)
    # a pilot measures its tasks: its turns and rewards are results; one error of the run's fails
    health = run_health.check(cfg, traces, "difficulty", measures_model=True)
    duck.stream_split(
        con, "dif_decided", tasks, outdir, rejected_by="difficulty", kept_columns=PILOT_COLUMNS, batch_rows=BATCH_ROWS
    )
    os.replace(outdir / "kept.parquet", outdir / "tasks.parquet")  # no row is dropped: one table
    (outdir / "rejected.parquet").unlink()
    return {
        **summary,
        "shards": shards,
        **outcome_stats(con, traces),
        **health,
        "llm_usage": usage.of_traces(traces),
        "engines": usage.engines_of_traces(traces),
    }


def pilot_summary(con) -> dict:
    """The band histogram (every band, then `unscored`), the mean pass rate over the scored
    tasks, and the pilot's trials: scored, passed, infrastructure errors."""
    bands = dict(con.execute("SELECT coalesce(band, ?), count(*) FROM dif_decided GROUP BY ALL", [UNSCORED]).fetchall())
    [(tasks, mean)] = con.execute("SELECT count(*), avg(pass_rate) FROM dif_decided").fetchall()
    [(trials, scored, passed, errors)] = con.execute(
        "SELECT coalesce(sum(trials), 0), coalesce(sum(scored), 0), coalesce(sum(passed), 0),"
        " coalesce(sum(errors), 0) FROM dif_trials"
    ).fetchall()
    return {
        "tasks": tasks,
        "bands": {b: bands.get(b, 0) for b in (*BANDS, UNSCORED)},
        "pass_rate_mean": mean,
        "trials": int(trials),
        "scored_trials": int(scored),
        "passed_trials": int(passed),
        "pilot_errors": int(errors),
    }


def check_pilot(cfg: Difficulty, s: dict) -> None:
    """Fail, naming the numbers, when the pilot's verdict says nothing: none of its trials was
    scored (every one an error), or it solved no task at all (unless allowed)."""
    if s["trials"] and not s["scored_trials"]:
        raise RuntimeError(
            f"difficulty: none of the {s['trials']} pilot trials was scored ({s['pilot_errors']} infrastructure "
            f"errors after their retries; {s['bands'][UNSCORED]} of {s['tasks']} tasks unscored): the pilot's "
            "endpoint or sandbox is broken; see band_reason in the shards' traces (shards/*.parquet)"
        )
    scored_tasks = s["tasks"] - s["bands"][UNSCORED]
    if scored_tasks and s["bands"]["impossible"] == scored_tasks and not cfg.allow_all_impossible:
        raise RuntimeError(
            f"difficulty: the pilot solved none of the {scored_tasks} tasks it was scored on (0 of "
            f"{s['scored_trials']} scored trials passed, {s['pilot_errors']} infrastructure errors): every task "
            "would be `impossible`. Use a stronger pilot (difficulty.engine/model), or set "
            "difficulty.allow_all_impossible: true if that is the measurement you want"
        )


def estimate(m, n, e) -> None:
    """tasks x k trials of the pilot, as the teacher's are counted; its rows are its inputs'."""
    cfg = n.config
    tasks = m.rows_in(n)
    e.counts["tasks"] = tasks
    m.trials(n, e, tasks * cfg.k, f"{cfg.engine}:{cfg.model or cfg.engine}", cfg.engine == "vllm")
    m.rows[n.id] = tasks


STAGE = StageDef(
    "difficulty",
    1,
    ("tasks.parquet", "traces.parquet"),
    __name__,
    DifficultySettings,
    plan="teacher_trials",  # the pilot runs where the teacher's trials will: its sandbox settings where unset here
    consumes=("tasks",),
    produces="tasks",
    sharded=True,
    gpu=True,
    trials=True,
    llm=True,
    tasks=True,
    volatile=TRACES,
    counts={"tasks": "rows", "trials": "trials"},
    recipe_field=(Difficulty | None, None),
    estimate=estimate,
)
