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
from rich.text import Text

from otbuild.errors import ConfigError
from otbuild.tasks.taskdir import TaskDir, TaskFormatError

CELL = 60
WIDE = {"metadata", "conversations"}


def show(
    path: Path, console: Console, row: int | None = None, limit: int = 20, columns: list[str] | None = None
) -> None:
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise ConfigError(f"{path}: not a readable parquet file ({e})") from None
    n = pf.metadata.num_rows
    if row is None:
        _table(path, pf, n, limit, console, columns)
    elif not 0 <= row < n:
        raise ConfigError(f"{path}: --row {row} out of range (the file has {n} rows, 0..{n - 1})")
    else:
        _row(pf, row, console)


def only_parquet(folder: Path) -> Path:
    """The one parquet file of `folder` (an artifact's dir); a ConfigError listing them when
    there are several (or none)."""
    files = sorted(folder.glob("*.parquet"))
    if len(files) == 1:
        return files[0]
    if not files:
        nested = sorted(str(p.relative_to(folder)) for p in folder.rglob("*.parquet"))[:10]
        raise ConfigError(
            f"{folder}: a folder with no parquet file in it" + (f" (below it: {', '.join(nested)})" if nested else "")
        )
    raise ConfigError(
        f"{folder}: a folder with {len(files)} parquet files: {', '.join(p.name for p in files)}; "
        f"show one, e.g. `otbuild show {folder / files[0].name}`"
    )


def _read_rows(pf: pq.ParquetFile, start: int, count: int) -> list[dict]:
    rows: list[dict] = []
    seen = 0
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


def _table(path: Path, pf: pq.ParquetFile, n: int, limit: int, console: Console, columns: list[str] | None) -> None:
    schema = pf.schema_arrow
    if columns:
        unknown = [c for c in columns if c not in schema.names]
        if unknown:
            raise ConfigError(f"{path}: no column(s) {', '.join(unknown)} (columns: {', '.join(schema.names)})")
        names = columns
    else:  # binary and JSON blobs are for --row; the table shows the rest
        names = [f.name for f in schema if f.name not in WIDE and not pa.types.is_binary(f.type)]
    console.print(f"[bold]{path}[/]: {n} rows; columns: {', '.join(schema.names)}", highlight=False)
    table = Table(show_lines=False)
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
            console.print(Text.assemble((key, "bold"), f": {value}"), highlight=False)


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
