"""Source adapter: HF task parquet(s) with columns `path` and `task_binary` (gzip tar)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from otbuild.settings.recipe import PathSource
from otbuild.tasks.harbor_meta import harbor_record, iter_task_rows
from otbuild.tasks.table import Quarantined, TaskRecord
from otbuild.tasks.taskdir import TaskDir, TaskFormatError


def read(cfg: PathSource) -> Iterator[TaskRecord | Quarantined]:
    """The tasks of the .parquet file (or folder of them) `cfg.path` names."""
    return read_path(Path(cfg.path))


def read_path(path: Path) -> Iterator[TaskRecord | Quarantined]:
    """Stream tasks from a .parquet file or a folder of them (sorted); other columns ignored.
    Raises ValueError naming a file that is not a task parquet."""
    for i, row in enumerate(iter_task_rows(path)):
        name, data = row["path"], row["task_binary"]
        if not name:
            yield Quarantined(f"<row {i}>", "missing path")
        elif data is None:
            yield Quarantined(name, "missing task_binary")
        else:
            try:
                task = TaskDir.unpack(name, data)
            except TaskFormatError as e:
                yield Quarantined(name, "corrupt task_binary", str(e))
                continue
            yield harbor_record(task)
