"""The stage registry: what each stage writes, its implementation version, where its code is.

Bump `version` by hand when a stage's output semantics change: it is part of every id of
that stage, so old artifacts are left alone and new ones are built beside them. Refactors
that keep the semantics do not bump it (the audit reports code drift instead).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class StageDef:
    name: str
    version: int
    outputs: tuple[str, ...]  # files in the artifact dir; the first feeds downstream stages
    module: str  # defines run(cfg, inputs: list[Path], outdir: Path) -> stats dict or None, where cfg
    # is the stage's settings model (otbuild/settings/stages.py: SETTINGS[name])
    sql: tuple[str, ...] = ()  # templates under otbuild/sql/ that the stage renders
    sharded: bool = False  # run_shard(cfg, inputs, outdir, shard) per shard, run() merges


STAGES: dict[str, StageDef] = {
    s.name: s
    for s in (
        StageDef("source", 2, ("tasks.parquet", "quarantine.parquet"), "otbuild.stages.source", ("source_sample.sql",)),
        StageDef("mix", 1, ("tasks.parquet",), "otbuild.stages.mix", ("mix.sql", "_inputs.sql")),
        StageDef("augment", 2, ("tasks.parquet", "quarantine.parquet"), "otbuild.stages.augment", sharded=True),
        StageDef("task_score", 1, ("tasks.parquet",), "otbuild.stages.task_score", sharded=True),
        StageDef(
            "task_filter", 2, ("kept.parquet", "rejected.parquet"), "otbuild.stages.task_filter",
            ("task_filter.sql", "_inputs.sql"),
        ),
        StageDef("trace_import", 2, ("traces.parquet", "quarantine.parquet"), "otbuild.stages.trace_import"),
        StageDef("rollout", 3, ("traces.parquet",), "otbuild.stages.rollout", sharded=True),
        StageDef("eval", 4, ("summary.parquet", "scores.parquet", "traces.parquet"), "otbuild.stages.eval",
                 ("eval.sql", "eval_summary.sql"), sharded=True),
        StageDef("rank", 2, ("ranking.parquet", "zscores.parquet"), "otbuild.stages.rank", ("rank.sql",)),
        StageDef("sft", 2, ("checkpoint.json", "model.safetensors", "train_log.jsonl"), "otbuild.stages.sft"),
        StageDef("rl", 4, ("checkpoint.json", "model.safetensors", "train_log.jsonl"), "otbuild.stages.rl"),
        StageDef("report", 2, ("report.html", "dataset_card.md"), "otbuild.report"),
        StageDef(
            "trace_filter", 2, ("kept.parquet", "rejected.parquet"), "otbuild.stages.trace_filter",
            ("trace_filter.sql", "_inputs.sql"),
        ),
    )
}

PROVENANCE = "provenance.json"
# the artifact's last `otbuild audit --rebuild` (hidden: not one of its files; otbuild/rebuild.py)
REBUILD = ".rebuild.json"


def shard_path(outdir: Path, shards: int, shard: int) -> Path:
    """Where shard K of N of a sharded stage writes its rows (the merge job reads them all)."""
    return Path(outdir) / "shards" / f"{shard}-of-{shards}.parquet"
