"""Source: one task parquet per recipe source, plus the items it had to quarantine."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from otbuild.sources import read_source
from otbuild.tasks.table import Quarantined, TaskRecord, check_not_empty, write_quarantine, write_tasks


def run(settings: dict, inputs: list[Path], outdir: Path) -> dict:
    name = settings["name"]
    quarantined: list[Quarantined] = []

    def tasks() -> Iterator[TaskRecord]:
        for item in read_source(settings):
            if isinstance(item, Quarantined):
                quarantined.append(item)
            else:
                yield item

    n = write_tasks(outdir / "tasks.parquet", tasks(), source=name)
    if "path" in settings:
        check_not_empty(f"source {name!r}", settings["path"], n, quarantined, settings.get("allow_empty", False))
    return {"tasks": n, "quarantined": write_quarantine(outdir / "quarantine.parquet", quarantined, name),
            "quarantined_by_reason": dict(Counter(q.reason for q in quarantined))}
