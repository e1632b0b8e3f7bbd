"""Trace import: existing trajectories as trace rows, beside the rollouts, for the trace filter."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from otbuild.tasks.table import Quarantined, check_not_empty, write_quarantine
from otbuild.traces.imports import read_traces
from otbuild.traces.table import write_traces

NOT_OPTIONS = {"name", "kind", "path", "allow_empty"}


def run(settings: dict, inputs: list[Path], outdir: Path) -> dict:
    options = {k: v for k, v in settings.items() if k not in NOT_OPTIONS}
    rows, quarantined = [], []
    for item in read_traces(settings["kind"], Path(settings["path"]), **options):
        (quarantined if isinstance(item, Quarantined) else rows).append(item)
    check_not_empty(f"trace_imports.{settings['name']}", settings["path"], len(rows), quarantined,
                    settings.get("allow_empty", False))
    name = f"import:{settings['name']}"
    return {"traces": write_traces(outdir / "traces.parquet", rows),
            "quarantined": write_quarantine(outdir / "quarantine.parquet", quarantined, name),
            "quarantined_by_reason": dict(Counter(q.reason for q in quarantined))}
