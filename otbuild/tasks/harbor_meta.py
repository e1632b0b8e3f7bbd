"""Helpers shared by the Harbor-dir, HF-parquet and Terminal-Bench-1 source adapters:
loading a task dir safely, validating it into a record (its `task.toml`: task_toml.py), and
streaming task parquet rows."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pyarrow as pa
import pyarrow.parquet as pq

from otbuild.tasks.table import Quarantined, TaskRecord
from otbuild.tasks.task_toml import parse_task_toml, runnable_locally, task_metadata
from otbuild.tasks.taskdir import (
    INSTRUCTION,
    TASK_TOML,
    TESTS,
    TaskDir,
    TaskFormatError,
)


# -- source folders -------------------------------------------------------------
def task_subdirs(path: Path) -> list[Path]:
    """Sorted task entries of a source folder: every non-hidden subdir or symlink.
    Plain files at the top (a LICENSE, a README) are not tasks."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"task source folder does not exist: {path}")
    if not path.is_dir():
        raise NotADirectoryError(f"task source is not a directory: {path}")
    return sorted(
        (p for p in path.iterdir() if not p.name.startswith(".") and (p.is_dir() or p.is_symlink())),
        key=lambda p: p.name,
    )


def load_dir(path: Path) -> TaskDir | Quarantined:
    """Read a task dir into memory, or say why it cannot be used."""
    name = path.name
    if path.is_symlink() or any(p.is_symlink() for p in path.rglob("*")):
        return Quarantined(name, "symlink", f"{path}: symlinks are not allowed in task dirs")
    try:
        return TaskDir.from_dir(path)
    except (TaskFormatError, OSError) as e:
        return Quarantined(name, "unreadable task dir", str(e))


# -- validation and records -------------------------------------------------------
def harbor_record(task: TaskDir, extra_metadata: dict | None = None) -> TaskRecord | Quarantined:
    """Validate a Harbor task dir held in memory and describe it, or quarantine it."""
    name = task.name
    if not is_safe_name(name):
        return Quarantined(name, "bad path", f"task name {name!r} is not a safe relative path")
    if INSTRUCTION not in task.files and not task.step_names():
        return Quarantined(name, "missing instruction.md")
    if TASK_TOML not in task.files:
        return Quarantined(name, "missing task.toml")
    try:
        config = parse_task_toml(task)
    except TaskFormatError as e:
        return Quarantined(name, "bad task.toml", str(e))
    # a multi-step task: each step has its instruction and a test (its own or the task's)
    for step, view in [(f"steps/{s.name}/", task.step(s.name)) for s in config.steps] or [("", task)]:
        if INSTRUCTION not in view.files:
            return Quarantined(name, "missing instruction.md", f"{step}instruction.md")
        if not view.instruction.strip():
            return Quarantined(name, "empty instruction", f"{step}instruction.md")
        if TESTS not in view.files:
            return Quarantined(
                name, "missing tests/test.sh", f"neither {step}tests/test.sh nor tests/test.sh" if step else ""
            )
    meta = task_metadata(config) | (extra_metadata or {})
    return TaskRecord(task, runnable_locally(task, config), meta)


def is_safe_name(name: str | None) -> bool:
    if not name:
        return False
    p = PurePosixPath(name)
    return not p.is_absolute() and ".." not in p.parts and "\\" not in name


# -- TOML writing (tomllib only reads) -------------------------------------------
def dump_toml(tables: dict[str, dict]) -> str:
    """Write `{table: {key: scalar or list}}` as TOML; a "" table holds top-level keys."""
    out = [f"{k} = {_toml_value(v)}" for k, v in tables.get("", {}).items() if v is not None]
    for table, values in tables.items():
        if table:
            out += ["", f"[{table}]"]
            out += [f"{k} = {_toml_value(v)}" for k, v in values.items() if v is not None]
    return "\n".join(out).lstrip("\n") + "\n"


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(float(v)) if isinstance(v, float) else str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v), ensure_ascii=False)  # JSON string escapes are valid TOML


# -- task parquet -------------------------------------------------------------------
def parquet_files(path: Path) -> list[Path]:
    """A .parquet file, or the sorted .parquet files of a folder."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"task parquet does not exist: {path}")
    return sorted(path.glob("*.parquet")) if path.is_dir() else [path]


def iter_task_rows(path: Path, columns=("path", "task_binary")) -> Iterator[dict]:
    """Stream rows (only `columns`) of one or more task parquets in bounded batches."""
    for f in parquet_files(path):
        try:
            pf = pq.ParquetFile(f)
        except (pa.ArrowException, OSError) as e:
            raise ValueError(f"{f}: not a readable parquet file ({e})") from e
        missing = set(columns) - set(pf.schema_arrow.names)
        if missing:
            raise ValueError(f"{f}: missing task parquet columns {sorted(missing)}")
        for batch in pf.iter_batches(batch_size=256, columns=list(columns)):
            yield from batch.to_pylist()
