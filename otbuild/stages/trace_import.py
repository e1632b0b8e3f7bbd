"""Trace import: existing trajectories as trace rows, beside the rollouts, for the trace filter."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from otbuild.settings.stages import TraceImportSettings
from otbuild.sources import hub_files, where
from otbuild.stagekit import Inputs, stage_run
from otbuild.tasks.table import Quarantined, check_not_empty, write_quarantine
from otbuild.traces.imports import PATH_FORMS, read_traces
from otbuild.traces.table import write_traces


@stage_run
def run(cfg: TraceImportSettings, inputs: Inputs, outdir: Path) -> dict:
    stats, files = {}, None
    if cfg.kind == "hf-dataset":  # files of a Hub dataset, each read by the importer of its format
        found = hub_files(cfg, PATH_FORMS[cfg.format])
        files, stats["hub"] = found.paths, found.identity()
    quarantined: list[Quarantined] = []  # small records; the traces are streamed to parquet

    def traces():
        for item in read_traces(cfg, files):
            if isinstance(item, Quarantined):
                quarantined.append(item)
            else:
                yield item

    written = write_traces(outdir / "traces.parquet", traces())
    check_not_empty(f"trace_imports.{cfg.name}", where(cfg), written, quarantined, cfg.allow_empty)
    name = f"import:{cfg.name}"
    return {
        "traces": written,
        "quarantined": write_quarantine(outdir / "quarantine.parquet", quarantined, name),
        "quarantined_by_reason": dict(Counter(q.reason for q in quarantined)),
        **stats,
    }
