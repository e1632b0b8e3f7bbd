"""The task parquet: Harbor's HF columns (`path`, `task_binary`) plus typed columns."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from otbuild.errors import StageError
from otbuild.fsio import atomic_path, parquet_batches
from otbuild.tasks.taskdir import SOLUTION, TESTS, TaskDir

TASK_SCHEMA = pa.schema(
    [
        ("path", pa.string()),
        ("task_binary", pa.binary()),
        ("task_id", pa.string()),
        ("source", pa.string()),
        ("instruction", pa.string()),
        ("has_solution", pa.bool_()),
        ("has_tests", pa.bool_()),
        ("runnable_locally", pa.bool_()),
        ("metadata", pa.string()),  # JSON object
    ]
)

BATCH_ROWS = 2048


@dataclass
class TaskRecord:
    """What a source adapter yields: a task dir and what the adapter knows about it."""

    task: TaskDir
    runnable_locally: bool
    metadata: dict = field(default_factory=dict)

    def row(self, source: str) -> dict:
        t = self.task
        steps = [t.step(n) for n in t.step_names()] or [t]  # a multi-step task's: each step's
        return {
            "path": t.name,
            "task_binary": t.pack(),
            "task_id": t.task_id(),
            "source": source,
            "instruction": t.instruction,
            "has_solution": all(SOLUTION in s.files for s in steps),
            "has_tests": all(TESTS in s.files for s in steps),
            "runnable_locally": self.runnable_locally,
            "metadata": json.dumps(self.metadata, sort_keys=True, default=str),
        }


def write_tasks(dest: Path, records: Iterable[TaskRecord], source: str) -> int:
    """Stream records into `dest` (atomically) in bounded batches; return the row count."""
    n = 0
    with atomic_path(dest) as tmp, pq.ParquetWriter(tmp, TASK_SCHEMA) as writer:
        batch: list[dict] = []
        for rec in records:
            batch.append(rec.row(source))
            if len(batch) >= BATCH_ROWS:
                writer.write_table(pa.Table.from_pylist(batch, TASK_SCHEMA))
                n += len(batch)
                batch = []
        if batch or n == 0:
            writer.write_table(pa.Table.from_pylist(batch, TASK_SCHEMA))
            n += len(batch)
    return n


@dataclass
class Quarantined:
    """A source item an adapter could not turn into a task, kept with the reason."""

    name: str
    reason: str
    detail: str = ""


def check_not_empty(what: str, path: str, kept: int, quarantined: list[Quarantined], allow_empty: bool) -> None:
    """A source that yields no usable item fails, naming its path and why each kind of item
    was quarantined (the count and a first example per reason)."""
    if kept or allow_empty:
        return
    first: dict[str, Quarantined] = {}
    for q in quarantined:
        first.setdefault(q.reason, q)
    counts = Counter(q.reason for q in quarantined)
    why = "; ".join(
        f"{n} {reason}, e.g. {q.name}" + (f": {q.detail}" if q.detail else "")
        for reason, n in counts.most_common()
        if (q := first[reason])
    )
    raise StageError(
        f"{what}: no usable item in {path}: "
        + (f"{len(quarantined)} quarantined ({why})" if quarantined else "nothing there to read")
        + "; set `allow_empty: true` on it if that is expected"
    )


QUARANTINE_SCHEMA = pa.schema(
    [("name", pa.string()), ("source", pa.string()), ("reason", pa.string()), ("detail", pa.string())]
)


def write_quarantine(dest: Path, items: list[Quarantined], source: str) -> int:
    rows = [{"name": q.name, "source": source, "reason": q.reason, "detail": q.detail} for q in items]
    with atomic_path(dest) as tmp:
        pq.write_table(pa.Table.from_pylist(rows, QUARANTINE_SCHEMA), tmp)
    return len(rows)


def task_rows(
    inputs: list[Path], wanted: set[int], columns=("path", "task_binary", "task_id", "source", "runnable_locally")
) -> dict[int, dict]:
    """The task rows (by position across the inputs) that trials need, streamed."""
    rows: dict[int, dict] = {}
    i = 0
    for path in inputs:
        for batch in parquet_batches(path, 256, list(columns)):
            mine = [k for k in range(batch.num_rows) if i + k in wanted]
            if mine:  # only the wanted rows become Python objects
                rows.update(zip((i + k for k in mine), batch.take(mine).to_pylist()))
            i += batch.num_rows
    return rows
