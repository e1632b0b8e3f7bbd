"""Source: one task parquet per recipe source, plus the items it had to quarantine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from otbuild.fsio import atomic_path
from otbuild.sources import read_source
from otbuild.tasks.table import Quarantined, TaskRecord, write_tasks

QUARANTINE_SCHEMA = pa.schema(
    [("name", pa.string()), ("source", pa.string()), ("reason", pa.string()), ("detail", pa.string())]
)


def run(settings: dict, inputs: list[Path], outdir: Path) -> None:
    name = settings["name"]
    quarantined: list[Quarantined] = []

    def tasks() -> Iterator[TaskRecord]:
        for item in read_source(settings):
            if isinstance(item, Quarantined):
                quarantined.append(item)
            else:
                yield item

    write_tasks(outdir / "tasks.parquet", tasks(), source=name)
    rows = [{"name": q.name, "source": name, "reason": q.reason, "detail": q.detail} for q in quarantined]
    with atomic_path(outdir / "quarantine.parquet") as tmp:
        pq.write_table(pa.Table.from_pylist(rows, QUARANTINE_SCHEMA), tmp)
