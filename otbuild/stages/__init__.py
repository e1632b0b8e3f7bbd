"""The stage registry: each stage says what it writes, its implementation version, where its
code is, the settings it receives, what kind of job it is, and what the other parts ask of it
(the report's funnel, the rebuild's volatile fields, the counts an estimate is checked on).
Everything that treats stages differently (the Snakemake rules, job sizes, the preflight, the
estimate, the report, costs, rebuilds) asks this registry; tests/stages/test_registry.py fails
when a stage does not answer one of them.

Bump `version` by hand when a stage's output semantics change: it is part of every id of
that stage, so old artifacts are left alone and new ones are built beside them. Refactors
that keep the semantics do not bump it (the audit reports code drift instead).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from pydantic import TypeAdapter

from otbuild.settings import stages as s
from otbuild.settings.added import ENTRY_POINTS, added_stages
from otbuild.traces.table import VOLATILE_COLUMNS as TRACE_VOLATILE
from otbuild.train.checkpoint import LOG, MANIFEST, VOLATILE_LOG_KEYS, VOLATILE_MANIFEST_KEYS


@dataclass(frozen=True)
class StageDef:
    name: str
    version: int
    outputs: tuple[str, ...]  # files in the artifact dir; the first feeds downstream stages
    module: str  # defines `run` (a `Run`) and, sharded, `run_shard` (a `RunShard`)
    settings: Any  # the model of `cfg` (otbuild/settings/stages.py)
    sharded: bool = False  # run_shard(cfg, inputs, outdir, shard) per shard job, then run() merges
    gpu: bool = False  # may serve a model or train: a GPU job on a cluster (profiles/slurm)
    trials: bool = False  # runs agent trials in a sandbox; its settings are (or hold) the trial settings
    llm: bool = False  # asks an LLM: records `llm_usage` (requests, tokens) in its stats
    tasks: bool = False  # its main output is a task table: a step of the report's funnel
    traces: bool = False  # its main output is a trace table: a step of the report's funnel
    filter: bool = False  # keeps some of its input rows and records why it dropped the others
    training: bool = False  # trains a checkpoint
    checkpoint: bool = False  # what it writes decides what the plan builds next (a Snakemake checkpoint)
    curve: tuple[str, ...] = ()  # training: the log keys the report plots, the first one logged
    # `audit --rebuild`: output file pattern -> its fields (parquet columns, `column.key` of a JSON
    # column, top-level JSON keys) that measure the run (docs/reproducibility.md)
    volatile: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # the estimate's counts a build's record holds, checked in the report: name -> "rows" (of the
    # main output) or a dotted path into the record's stats
    counts: Mapping[str, str] = field(default_factory=dict)
    # the pipeline's shape (otbuild/stages/shape.py): the recipe section that plans it (a dotted key
    # for a subsection; "" = the stage's name), the kinds of data it consumes (in the order its
    # inputs are given) and the kind its main output is
    section: str = ""
    plan: str = ""  # how the plan makes its nodes (otbuild/plan/, PLANNERS): "" = from its section alone
    consumes: tuple[str, ...] = ()
    produces: str | None = None
    # outputs flagged for `snakemake --report`, each with its category there (captions:
    # otbuild/report/captions/STAGE.FILE.rst); not part of any id
    reported: tuple[tuple[str, str], ...] = ()
    # the estimate's method for it (otbuild/estimate/model.py, `Model._NAME`): "" = the stage's
    # own name; a stage added outside otbuild names a generic one (`table`: rows in, rows out)
    estimate: str = ""
    # a stage added outside otbuild (the `otbuild.stages` entry points): the stage it follows in
    # pipeline order
    after: str = ""

    @property
    def brings(self) -> str | None:
        """The kind of data it brings into the pipeline from outside (sources: tasks), if any."""
        return self.produces if self.produces and self.produces not in self.consumes and not self.consumes else None

    @cached_property
    def _adapter(self) -> TypeAdapter:
        return TypeAdapter(self.settings)

    def config(self, settings: dict) -> Any:
        """The typed settings from a spec's plain settings (a ValidationError names the field when a
        spec does not fit: a plan and its stage out of step)."""
        return self._adapter.validate_python(settings)


# the categories of `snakemake --report` (docs/reports.md); the results' manifest is in RESULTS too
RESULTS, EVALUATION, TRAINING = "Results", "Evaluation", "Training"

TRAINED = ("checkpoint.json", "model.safetensors", "train_log.jsonl")
TRACES = {"traces.parquet": tuple(TRACE_VOLATILE)}
TRAIN_FILES = {MANIFEST: tuple(VOLATILE_MANIFEST_KEYS), LOG: tuple(VOLATILE_LOG_KEYS)}
LOSS_KEYS = ("loss", "policy_loss", "train_loss")
REWARD_KEYS = ("reward_mean", "reward", "mean_reward", "rewards/mean")

# In pipeline order: the report's funnel shows its task and trace stages in this order.
STAGES: dict[str, StageDef] = {
    d.name: d
    for d in (
        StageDef(
            "source",
            2,
            ("tasks.parquet", "quarantine.parquet"),
            "otbuild.stages.source",
            s.SourceSettings,
            section="sources",
            plan="named",
            produces="tasks",
            tasks=True,
            counts={"tasks": "rows"},
        ),
        StageDef(
            "augment",
            2,
            ("tasks.parquet", "quarantine.parquet"),
            "otbuild.stages.augment",
            s.AugmentSettings,
            plan="per_source",
            consumes=("tasks",),
            produces="tasks",
            sharded=True,
            gpu=True,
            llm=True,
            tasks=True,
        ),
        StageDef(
            "mix",
            1,
            ("tasks.parquet",),
            "otbuild.stages.mix",
            s.MixSettings,
            plan="top_n",
            consumes=("tasks",),
            produces="tasks",
            tasks=True,
            counts={"tasks": "rows"},
        ),
        StageDef(
            "task_score",
            1,
            ("tasks.parquet",),
            "otbuild.stages.task_score",
            s.TaskScoreSettings,
            section="task_filter.llm",
            consumes=("tasks",),
            produces="tasks",
            sharded=True,
            llm=True,
            tasks=True,
        ),
        StageDef(
            "task_filter",
            2,
            ("kept.parquet", "rejected.parquet"),
            "otbuild.stages.task_filter",
            s.TaskFilterSettings,
            plan="decontaminating",
            consumes=("tasks",),
            produces="tasks",
            tasks=True,
            filter=True,
            counts={"tasks_kept": "rows"},
        ),
        StageDef(
            "trace_import",
            2,
            ("traces.parquet", "quarantine.parquet"),
            "otbuild.stages.trace_import",
            s.TraceImportSettings,
            section="trace_imports",
            plan="named",
            produces="traces",
            traces=True,
        ),
        StageDef(
            "rollout",
            3,
            ("traces.parquet",),
            "otbuild.stages.rollout",
            s.RolloutSettings,
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
        ),
        StageDef(
            "trace_filter",
            2,
            ("kept.parquet", "rejected.parquet"),
            "otbuild.stages.trace_filter",
            s.TraceFilterSettings,
            consumes=("traces",),
            produces="traces",
            traces=True,
            filter=True,
            volatile={"*.parquet": tuple(TRACE_VOLATILE)},
            counts={"traces_kept": "rows"},
        ),
        StageDef(
            "sft",
            3,
            TRAINED,
            "otbuild.stages.sft",
            s.SftSettings,
            plan="training",
            consumes=("traces",),
            produces="checkpoint",
            gpu=True,
            training=True,
            curve=LOSS_KEYS,
            volatile=TRAIN_FILES,
            counts={"traces": "data.traces", "tokens_to_train_on": "tokens_seen"},
            reported=(("train_log.jsonl", TRAINING),),
        ),
        StageDef(
            "rl",
            4,
            TRAINED,
            "otbuild.stages.rl",
            s.RlSettings,
            consumes=("checkpoint", "tasks"),
            produces="checkpoint",
            gpu=True,
            trials=True,
            llm=True,
            training=True,
            curve=REWARD_KEYS,
            volatile=TRAIN_FILES,
            reported=(("train_log.jsonl", TRAINING),),
        ),
        # the eval's model: `eval.model`, else the recipe's checkpoint (recipe/checks.py checks there is one)
        StageDef(
            "eval",
            4,
            ("summary.parquet", "scores.parquet", "traces.parquet"),
            "otbuild.stages.eval",
            s.EvalSettings,
            sharded=True,
            gpu=True,
            trials=True,
            llm=True,
            counts={"trials": "trials"},
            # scores.parquet's `duration` is the trial's duration_s
            volatile={**TRACES, "scores.parquet": ("duration",)},
            reported=(("summary.parquet", EVALUATION),),
        ),
        StageDef(
            "rank",
            2,
            ("ranking.parquet", "zscores.parquet"),
            "otbuild.stages.rank",
            s.RankSettings,
            reported=(("ranking.parquet", EVALUATION),),
        ),
        # a search's stage winner, from its ranking and its candidates' evals (docs/search.md)
        StageDef(
            "decide",
            1,
            ("decision.json",),
            "otbuild.stages.decide",
            s.DecideSettings,
            checkpoint=True,
            estimate="table",
        ),
        StageDef(
            "report",
            2,
            ("report.html", "dataset_card.md"),
            "otbuild.report",
            s.ReportSettings,
            reported=(("report.html", RESULTS), ("dataset_card.md", RESULTS)),
        ),
    )
}


def _with_added(stages: dict[str, StageDef]) -> dict[str, StageDef]:
    """The built-in stages and those installed packages add (entry points in ENTRY_POINTS, each a
    StageDef), each placed after the stage it names."""
    out = dict(stages)
    for d in added_stages():
        if not isinstance(d, StageDef) or d.name in out or d.after not in out:
            raise ImportError(
                f"an entry point of {ENTRY_POINTS} names {d!r}: expected a StageDef with a new name "
                f"that follows a known stage (`after`: one of {', '.join(out)})"
            )
        names = list(out)
        names.insert(names.index(d.after) + 1, d.name)
        out = {n: out.get(n, d) for n in names}
    return out


def input_name(stage: str) -> str:
    """The name an input of `stage` goes by when the plan gives it none: the kind of data it
    produces (tasks, traces, checkpoint), else the stage's name."""
    d = STAGES.get(stage)
    return (d.produces if d else None) or stage


# last: an added stage's module imports what is above
STAGES = _with_added(STAGES)
