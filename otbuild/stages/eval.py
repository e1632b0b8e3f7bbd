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
from typing import Any, Literal, cast

from pydantic import Field

from otbuild import duck, usage
from otbuild.settings.base import MAX_REPEATS, engine_args, execution_only, resolved
from otbuild.settings.engines import Sampling
from otbuild.settings.recipe import AgentModel, Name, PromptStyle, RankBy, Source
from otbuild.settings.stages import RolloutSettings
from otbuild.settings.trials import ShardedTrials
from otbuild.span import Span
from otbuild.stagekit import EVALUATION, Inputs, StageDef, run_health, stage_run, stage_run_shard
from otbuild.stagekit.failures import outcome_stats
from otbuild.stagekit.trials import TRACES, merge_calls, merge_shards, run_trials_shard
from otbuild.traces import outcome


class Eval(ShardedTrials, Sampling):
    """model x benchmark x repeat through the harness (paper: n = 3 repeats). Benchmarks are
    task sources; `model` is the recipe's last trained checkpoint (sft, else rl: served by
    `serve_with`) unless an engine section names another (an API model, the oracle ceiling).
    The trial settings are the eval's own, whichever model answers."""

    benchmarks: dict[Name, Source] = Field(min_length=1)
    repeats: int = Field(default=3, ge=1, le=MAX_REPEATS)
    model: AgentModel | None = None
    serve_with: Literal["transformers", "vllm", "auto"] = Field(
        default="transformers",
        description="for the trained checkpoint; auto: vllm where it is installed, "
        "else transformers (decided by the job, named in the stage's provenance)",
    )
    engine_args: dict[str, Any] = engine_args(of="serve_with")  # vllm serve args for the checkpoint
    rank_by: RankBy = Field(
        default="pass_at_1", description="the score an ablation's ranking compares (mean over repeats)"
    )
    base: bool = Field(
        default=False,
        description="also evaluate the untrained base (the sft section with max_steps 0: same "
        "model, tokenizer and traces) with these settings, labelled base/sft and base/eval; the headline says "
        "`student X ± s vs base Y ± s`",
    )
    allow_prompt_mismatch: bool = execution_only(
        False,
        description="evaluate the checkpoint with another "
        "harness prompt than its rollouts' (validate refuses it otherwise)",
    )


class EvalSettings(RolloutSettings):
    """The model's engine settings (an engine section, or the checkpoint served by the eval's
    `serve_with`) with the eval's trial settings; `samples_per_task` is the eval's repeats."""

    # auto: serve_with's, for the checkpoint (pydantic narrows a field by redeclaring it: AgentModel's, with auto)
    engine: Literal["oracle", "openai", "vllm", "transformers", "auto"]  # type: ignore[assignment]
    model_label: str = Field(description="ENGINE:MODEL, as the scores name it")
    serves_checkpoint: bool = resolved(False, description="the model is the recipe's checkpoint (an input)")

    def identity_view(self, ident: dict) -> dict:
        """The eval's id is its recipe section's: `repeats`; the served checkpoint's engine as
        `serve_with` (the checkpoint is an input: its id is in this one), or a named model's
        settings under `model`, apart from the eval's own trial settings."""
        ident = {k: v for k, v in ident.items() if k not in ("model_label", "samples_per_task")}
        if self.samples_per_task != Eval.model_fields["repeats"].default:
            ident["repeats"] = self.samples_per_task
        if self.serves_checkpoint:
            ident.pop("model")
            if (engine := ident.pop("engine")) != Eval.model_fields["serve_with"].default:
                ident["serve_with"] = engine
            return ident
        own = {*ShardedTrials.model_fields, *PromptStyle.model_fields, "repeats"}
        return {
            **{k: v for k, v in ident.items() if k in own},
            "model": {k: v for k, v in ident.items() if k not in own},
        }


@stage_run_shard
def run_shard(cfg: EvalSettings, inputs: Inputs, outdir: Path, shard: int) -> None:
    """The benchmarks' trials (a trained checkpoint among the inputs is the model, not tasks)."""
    # a model under test is scored, not trained on: its server is not asked for token ids and
    # log-probs (vLLM's CPU build spends seconds on its first log-prob request, which an agent's
    # timeout would count against the model)
    run_trials_shard(cfg, Inputs.of(tasks=inputs.named("tasks")), outdir, shard, ask_tokens=False)


@stage_run
def run(cfg: EvalSettings, inputs: Inputs, outdir: Path) -> dict:
    shards = merge_shards(cfg.shards, outdir)
    # the model under test may fail every task in one turn: only the run's own breakage fails an eval
    health = run_health.check(cfg, outdir / "traces.parquet", "eval", measures_model=True)
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
        **health,
        "benchmarks": {b: {"mean": m, "stderr": s, "exceptions": e, "excluded": x} for b, m, s, e, x in summary},
        "llm_usage": usage.of_traces(outdir / "traces.parquet"),
        "engines": usage.engines_of_traces(outdir / "traces.parquet"),
        **merge_calls(cfg, outdir),
    }


def estimate(m, n, e) -> None:
    """Its benchmarks' tasks (the inputs named `tasks`; a trained checkpoint among them is the
    model) x repeats trials; one summary row per benchmark."""
    cfg = n.config
    tasks = m.rows_in(n, "tasks")
    e.counts["benchmark_tasks"] = tasks
    m.trials(n, e, tasks * cfg.samples_per_task, cfg.model_label, cfg.engine == "vllm")
    m.rows[n.id] = Span.of(n.input_names.count("tasks"))


# the eval's model: `eval.model`, else the recipe's checkpoint (recipe/checks.py checks there is one)
STAGE = StageDef(
    "eval",
    4,
    ("summary.parquet", "scores.parquet", "traces.parquet"),
    __name__,
    EvalSettings,
    plan="model_under_test",
    sharded=True,
    gpu=True,
    trials=True,
    llm=True,
    counts={"trials": "trials"},
    # scores.parquet's `duration` is the trial's duration_s
    volatile={**TRACES, "scores.parquet": ("duration",)},
    reported=(("summary.parquet", EVALUATION),),
    recipe_field=(Eval | None, None),
    estimate=estimate,
)
