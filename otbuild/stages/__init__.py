"""The stage registry: each stage says what it writes, its implementation version, where its
code is, the settings it receives and what kind of job it is. Everything that treats stages
differently (the Snakemake rules, job sizes, the preflight, the report, costs, rebuilds) asks
this registry.

Bump `version` by hand when a stage's output semantics change: it is part of every id of
that stage, so old artifacts are left alone and new ones are built beside them. Refactors
that keep the semantics do not bump it (the audit reports code drift instead).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from otbuild.settings import stages as s



@dataclass(frozen=True)
class StageDef:
    name: str
    version: int
    outputs: tuple[str, ...]  # files in the artifact dir; the first feeds downstream stages
    module: str  # defines run(cfg, inputs: list[Path], outdir: Path) -> stats dict or None
    settings: Any  # the model of `cfg` (otbuild/settings/stages.py)
    sharded: bool = False  # run_shard(cfg, inputs, outdir, shard) per shard job, then run() merges
    gpu: bool = False  # may serve a model or train: a GPU job on a cluster (profiles/slurm)
    trials: bool = False  # runs agent trials in a sandbox; its settings are (or hold) the trial settings
    llm: bool = False  # asks an LLM: records `llm_usage` (requests, tokens) in its stats
    traces: bool = False  # its main output is a trace table
    training: bool = False  # trains a checkpoint
    # outputs flagged for `snakemake --report`, each with its category there (captions:
    # otbuild/report/captions/STAGE.FILE.rst); not part of any id
    reported: tuple[tuple[str, str], ...] = ()

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

STAGES: dict[str, StageDef] = {
    d.name: d
    for d in (
        StageDef("source", 2, ("tasks.parquet", "quarantine.parquet"), "otbuild.stages.source", s.SourceSettings),
        StageDef("mix", 1, ("tasks.parquet",), "otbuild.stages.mix", s.MixSettings),
        StageDef("augment", 2, ("tasks.parquet", "quarantine.parquet"), "otbuild.stages.augment", s.Augment,
                 sharded=True, gpu=True, llm=True),
        StageDef("task_score", 1, ("tasks.parquet",), "otbuild.stages.task_score", s.TaskScorer,
                 sharded=True, llm=True),
        StageDef("task_filter", 2, ("kept.parquet", "rejected.parquet"), "otbuild.stages.task_filter", s.TaskFilter),
        StageDef("trace_import", 2, ("traces.parquet", "quarantine.parquet"), "otbuild.stages.trace_import",
                 s.TraceImportSettings, traces=True),
        StageDef("rollout", 3, ("traces.parquet",), "otbuild.stages.rollout", s.RolloutSettings,
                 sharded=True, gpu=True, trials=True, llm=True, traces=True),
        StageDef("eval", 4, ("summary.parquet", "scores.parquet", "traces.parquet"), "otbuild.stages.eval",
                 s.EvalSettings, sharded=True, gpu=True, trials=True, llm=True,
                 reported=(("summary.parquet", EVALUATION),)),
        StageDef("rank", 2, ("ranking.parquet", "zscores.parquet"), "otbuild.stages.rank", s.RankSettings,
                 reported=(("ranking.parquet", EVALUATION),)),
        StageDef("sft", 3, TRAINED, "otbuild.stages.sft", s.SftSettings, gpu=True, training=True,
                 reported=(("train_log.jsonl", TRAINING),)),
        StageDef("rl", 4, TRAINED, "otbuild.stages.rl", s.RlSettings, gpu=True, trials=True, llm=True, training=True,
                 reported=(("train_log.jsonl", TRAINING),)),
        StageDef("report", 2, ("report.html", "dataset_card.md"), "otbuild.report", s.ReportSettings,
                 reported=(("report.html", RESULTS), ("dataset_card.md", RESULTS))),
        StageDef("trace_filter", 2, ("kept.parquet", "rejected.parquet"), "otbuild.stages.trace_filter",
                 s.TraceFilter, traces=True),
    )
}


def shard_path(outdir: Path, shards: int, shard: int) -> Path:
    """Where shard K of N of a sharded stage writes its rows (the merge job reads them all)."""
    return Path(outdir) / "shards" / f"{shard}-of-{shards}.parquet"
