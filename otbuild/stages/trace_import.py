"""Trace import: existing trajectories as trace rows, beside the rollouts, for the trace filter."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from otbuild.tasks.table import Quarantined, write_quarantine
from otbuild.traces.imports import read_traces
from otbuild.traces.table import write_traces

NOT_OPTIONS = {"name", "kind", "path"}


def run(settings: dict, inputs: list[Path], outdir: Path) -> dict:
    options = {k: v for k, v in settings.items() if k not in NOT_OPTIONS}
    quarantined: list[Quarantined] = []  # small records; the traces are streamed to parquet

    def traces():
        for item in read_traces(settings["kind"], Path(settings["path"]), **options):
            if isinstance(item, Quarantined):
                quarantined.append(item)
            else:
                yield item

    name = f"import:{settings['name']}"
    return {"traces": write_traces(outdir / "traces.parquet", traces()),
            "quarantined": write_quarantine(outdir / "quarantine.parquet", quarantined, name),
            "quarantined_by_reason": dict(Counter(q.reason for q in quarantined))}
