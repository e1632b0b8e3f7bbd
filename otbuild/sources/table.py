"""Source adapter: any JSON/JSONL/CSV/parquet table with a column mapping from the recipe.

`columns` maps task parts to column names:
- `instruction` (required): instruction.md;
- `id`: the task name (default: `<file stem>-<row number>`, 0-based over the source);
- `solution`: solution/solve.sh (a shell script);
- `tests`: tests/test.sh (a Harbor verifier script writing /logs/verifier/reward.txt);
- `metadata`: columns copied into the task's metadata as they are.

The environment is `FROM <image>` with WORKDIR /app: `image` (default python:3.12-slim, so
tasks are runnable locally); `docker_image` instead names a prebuilt image in task.toml
(`[environment] docker_image`), which makes the tasks not runnable locally. The options and
their defaults are TableSource's (otbuild/settings/recipe.py). A row without the
instruction column, or with a blank one, is quarantined ("missing field" / "empty
instruction"); a non-text solution/tests value is quarantined as "bad field".
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from otbuild.records import Dedup, as_text, iter_rows, task_name
from otbuild.settings.recipe import TableColumns, TableSource
from otbuild.tasks.harbor_meta import dump_toml
from otbuild.tasks.table import Quarantined, TaskRecord
from otbuild.tasks.taskdir import DOCKERFILE, INSTRUCTION, SOLUTION, TASK_TOML, TESTS, TaskDir


def read(cfg: TableSource) -> Iterator[TaskRecord | Quarantined]:
    seen = Dedup()
    n = -1
    for row in iter_rows(Path(cfg.path)):
        n += 1
        if row.data is None:
            yield Quarantined(row.where, row.reason, row.detail)
            continue
        item = convert(row.data, row.where, n, cfg.columns, cfg.image, cfg.docker_image)
        if isinstance(item, TaskRecord) and (first := seen.first(item.task.name, row.where)):
            item = Quarantined(item.task.name, "duplicate id", f"{row.where}: first seen at {first}")
        yield item


def convert(
    d: dict, where: str, n: int, cols: TableColumns, image: str, docker_image: str | None
) -> TaskRecord | Quarantined:
    stem = where.split(":", 1)[0].split("[", 1)[0].rsplit(".", 1)[0]
    id_col = cols.id
    rid = as_text(d.get(id_col)) if id_col else None
    if id_col and rid is None:
        return Quarantined(where, "missing field", f"{where}: id column {id_col!r} is missing or blank")
    name = task_name(rid if rid is not None else f"{stem}-{n}")
    ic = cols.instruction
    if ic not in d:
        return Quarantined(name, "missing field", f"{where}: instruction column {ic!r} is missing")
    text = d[ic]
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            return Quarantined(name, "bad encoding", f"{where}: {ic}: {e}")
    if as_text(text) is None:
        return Quarantined(name, "empty instruction", f"{where}: {ic!r} is blank")
    task = TaskDir(name)
    task.add(INSTRUCTION, text if text.endswith("\n") else text + "\n")
    env = {"docker_image": docker_image} if docker_image else {}
    task.add(TASK_TOML, dump_toml({"": {"version": "1.0"}, "metadata": {"source": "table"},
                                   "environment": env}))  # fmt: skip
    task.add(DOCKERFILE, f"FROM {docker_image or image}\nWORKDIR /app\n")
    for part, rel in (("solution", SOLUTION), ("tests", TESTS)):
        col = getattr(cols, part)
        if not col or d.get(col) is None or as_text(d.get(col)) is None:
            continue
        if not isinstance(d[col], str):
            return Quarantined(name, "bad field", f"{where}: {part} column {col!r} is a {type(d[col]).__name__}")
        task.add(rel, d[col], executable=True)
    meta = {c: d.get(c) for c in cols.metadata if c in d}
    if rid is not None:
        meta["id"] = rid
    meta["where"] = where
    return TaskRecord(task, runnable_locally=not docker_image, metadata=meta)
