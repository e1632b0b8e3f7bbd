"""Write a task parquet back out as Harbor task dirs (`dest/<name>/`)."""

from __future__ import annotations

from pathlib import Path

from otbuild.tasks.harbor_meta import is_safe_name, iter_task_rows
from otbuild.tasks.redact import Redactor
from otbuild.tasks.taskdir import TaskDir


def export_names(parquet: Path) -> list[str]:
    """The dir name of each row: its `path`, except that a path seen in an earlier row (an
    upsampled copy in a mix, or two sources naming a task alike) gets the first free `-2`,
    `-3`, ... suffix. Raises ValueError on an unsafe path."""
    paths = [row["path"] for row in iter_task_rows(parquet, columns=("path",))]
    taken, used, names = set(paths), set(), []
    for name in paths:
        if not is_safe_name(name):
            raise ValueError(f"{parquet}: unsafe task path {name!r}")
        if name in used:
            k = 2
            while f"{name}-{k}" in taken:
                k += 1
            name = f"{name}-{k}"
            taken.add(name)
        used.add(name)
        names.append(name)
    return names


def export_tasks(parquet: Path, dest: Path, redactor: Redactor | None = None) -> int:
    """Unpack every row of `parquet` (a file or folder of them) to `dest/<name>/` (names:
    `export_names`); return the count. `redactor`: each task's text files redacted (a handoff
    out of otbuild; a task dir Harbor runs here is left as it is). Raises ValueError, before
    writing anything, on an unsafe `path` or an existing non-empty task dir; a corrupt
    task_binary raises TaskFormatError (a ValueError)."""
    dest = Path(dest)
    names = export_names(parquet)
    for name in names:
        target = dest / name
        if target.exists() and (not target.is_dir() or any(target.iterdir())):
            raise ValueError(f"refusing to overwrite existing task dir {target}")
    for name, row in zip(names, iter_task_rows(parquet)):
        task = TaskDir.unpack(name, row["task_binary"] or b"")
        (redactor.task(task) if redactor else task).write(dest / name)
    return len(names)
