"""Trace import: existing trajectories as trace rows, beside the rollouts, for the trace filter."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from otbuild.sources import HUB_KEYS, hub_files, where
from otbuild.tasks.table import Quarantined, check_not_empty, write_quarantine
from otbuild.traces.imports import PATH_FORMS, read_traces
from otbuild.traces.table import write_traces

NOT_OPTIONS = {"name", "kind", "path", "allow_empty", "format", *HUB_KEYS}


def run(settings: dict, inputs: list[Path], outdir: Path) -> dict:
    options = {k: v for k, v in settings.items() if k not in NOT_OPTIONS}
    stats = {}
    if settings["kind"] == "hf-dataset":  # files of a Hub dataset, each read by the importer of its format
        found = hub_files(settings, PATH_FORMS[settings["format"]])
        kind, files, stats["hub"] = settings["format"], found.paths, found.identity()
    else:
        kind, files = settings["kind"], [Path(settings["path"])]
    quarantined: list[Quarantined] = []  # small records; the traces are streamed to parquet

    def traces():
        for f in files:
            for item in read_traces(kind, f, **options):
                if isinstance(item, Quarantined):
                    quarantined.append(item)
                else:
                    yield item

    written = write_traces(outdir / "traces.parquet", traces())
    check_not_empty(f"trace_imports.{settings['name']}", where(settings), written, quarantined,
                    settings.get("allow_empty", False))
    name = f"import:{settings['name']}"
    return {"traces": written,
            "quarantined": write_quarantine(outdir / "quarantine.parquet", quarantined, name),
            "quarantined_by_reason": dict(Counter(q.reason for q in quarantined)), **stats}
