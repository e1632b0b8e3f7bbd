"""`otbuild show`: preview any parquet artifact, or one task/trace row in full."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table

from otbuild.errors import ConfigError
from otbuild.tasks.taskdir import TaskDir, TaskFormatError

CELL = 60


def show(path: Path, console: Console, row: int | None = None, limit: int = 20) -> None:
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise ConfigError(f"{path}: not a readable parquet file ({e})") from None
    n = pf.metadata.num_rows
    if row is None:
        _table(path, pf, n, limit, console)
    elif not 0 <= row < n:
        raise ConfigError(f"{path}: --row {row} out of range (the file has {n} rows, 0..{n - 1})")
    else:
        _row(pf, row, console)


def _read_rows(pf: pq.ParquetFile, start: int, count: int) -> list[dict]:
    rows, seen = [], 0
    for batch in pf.iter_batches(batch_size=1024):
        if seen + batch.num_rows > start:
            rows += batch.slice(max(0, start - seen), count - len(rows)).to_pylist()
            if len(rows) >= count:
                break
        seen += batch.num_rows
    return rows


def _cell(v) -> str:
    if isinstance(v, bytes):
        return f"<{len(v)} bytes>"
    s = json.dumps(v, default=str) if isinstance(v, (list, dict)) else str(v)
    s = " ".join(s.split())
    return s if len(s) <= CELL else s[: CELL - 1] + "…"


def _table(path: Path, pf: pq.ParquetFile, n: int, limit: int, console: Console) -> None:
    table = Table(title=f"{path} ({n} rows)", show_lines=False)
    names = pf.schema_arrow.names
    for name in names:
        table.add_column(name, overflow="fold", max_width=CELL)
    for r in _read_rows(pf, 0, limit):
        table.add_row(*(_cell(r[c]) for c in names))
    console.print(table)
    if n > limit:
        console.print(f"[dim]… {n - limit} more rows; --row N shows one in full[/]")


def _row(pf: pq.ParquetFile, index: int, console: Console) -> None:
    r = _read_rows(pf, index, 1)[0]
    console.rule(f"row {index}")
    for key, value in r.items():
        if key == "task_binary" and isinstance(value, bytes):
            _task_files(r.get("path") or "task", value, console)
        elif key == "conversations" and isinstance(value, list):
            for turn in value:
                console.print(Panel(str(turn.get("content", "")), title=str(turn.get("role", "?"))))
        elif key == "metadata" and isinstance(value, str):
            console.print(f"[bold]{key}[/]:")
            console.print_json(value)
        else:
            console.print(f"[bold]{key}[/]: {value}", highlight=False, markup=False)


def _task_files(name: str, data: bytes, console: Console) -> None:
    try:
        task = TaskDir.unpack(name, data)
    except TaskFormatError as e:
        console.print(f"[red]task_binary: {e}[/]")
        return
    console.print(f"[bold]task_binary[/]: {len(data)} bytes, {len(task.files)} files")
    for rel, f in sorted(task.files.items()):
        mode = "x" if f.executable else "-"
        text = task.text(rel) if len(f.data) < 20000 else None
        title = f"{rel} ({len(f.data)} bytes, {mode})"
        if text is not None and "\0" not in text:
            lexer = Syntax.guess_lexer(rel, text)
            console.print(Panel(Syntax(text, lexer, word_wrap=True), title=title))
        else:
            console.print(f"  {title}")
