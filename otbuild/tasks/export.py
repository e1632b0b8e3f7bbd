"""Write a task parquet back out as Harbor task dirs (`dest/<path>/`)."""

from __future__ import annotations

from pathlib import Path

from otbuild.tasks.harbor_meta import is_safe_name, iter_task_rows
from otbuild.tasks.taskdir import TaskDir


def export_tasks(parquet: Path, dest: Path) -> int:
    """Unpack every row of `parquet` (a file or folder of them) to `dest/<path>/`; return the
    count. Raises ValueError, before writing anything, on an unsafe or duplicate `path` or an
    existing non-empty task dir; a corrupt task_binary raises TaskFormatError (a ValueError)."""
    dest = Path(dest)
    seen: set[str] = set()
    for row in iter_task_rows(parquet, columns=("path",)):
        name = row["path"]
        if not is_safe_name(name):
            raise ValueError(f"{parquet}: unsafe task path {name!r}")
        if name in seen:
            raise ValueError(f"{parquet}: duplicate task path {name!r}")
        seen.add(name)
        target = dest / name
        if target.exists() and (not target.is_dir() or any(target.iterdir())):
            raise ValueError(f"refusing to overwrite existing task dir {target}")
    n = 0
    for row in iter_task_rows(parquet):
        TaskDir.unpack(row["path"], row["task_binary"] or b"").write(dest / row["path"])
        n += 1
    return n
