"""Rows of record files (JSON, JSONL, CSV, parquet) for the row-based source adapters and
the trace importers.

`iter_rows(path)` yields `Row(where, data)` for every record of a file or of the sorted
record files of a folder. A row that cannot be used on its own (a line that is not valid
UTF-8, a JSON value that is not an object) comes back as `Row(where, None, reason, detail)`
so the adapter can quarantine it; a file that is malformed as a whole (not JSON, a
truncated line, a parquet without footer, an unreadable row group) raises
`SourceFormatError`, whose message names the file and the position (line, byte offset,
row group).
"""

from __future__ import annotations

import csv
import json
import math
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

EXTENSIONS = (".jsonl", ".ndjson", ".json", ".csv", ".parquet")


class SourceFormatError(ValueError):
    """A source file that cannot be read; the message names the file and the position."""


@dataclass
class Row:
    where: str  # "file.jsonl:12", "file.json[3]", "file.csv:7", "file.parquet:rg0:5"
    data: dict | None
    reason: str = ""  # set when data is None
    detail: str = ""


def record_files(path: Path, extensions: tuple[str, ...] = EXTENSIONS) -> list[Path]:
    """`path` itself, or the sorted files under it (recursively) with a known extension."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"source path does not exist: {path}")
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and p.name.lower().endswith(extensions))


def iter_rows(path: Path, extensions: tuple[str, ...] = EXTENSIONS) -> Iterator[Row]:
    for f in record_files(path, extensions):
        yield from iter_file(f)


def iter_file(f: Path) -> Iterator[Row]:
    name = f.name.lower()
    if name.endswith(".parquet"):
        yield from _parquet(f)
    elif name.endswith(".csv"):
        yield from _csv(f)
    elif name.endswith(".json"):
        yield from _json(f)
    else:
        yield from _jsonl(f)


def _obj(where: str, value) -> Row:
    if isinstance(value, dict):
        return Row(where, value)
    return Row(where, None, "not an object", f"{where}: a JSON {type(value).__name__}, not an object")


def _jsonl(f: Path) -> Iterator[Row]:
    offset = 0
    with open(f, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            start, offset = offset, offset + len(raw)
            where = f"{f.name}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield Row(where, None, "bad encoding", f"{f}: line {lineno}: not UTF-8 ({e})")
                continue
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as e:
                truncated = " (truncated last line?)" if not raw.endswith(b"\n") else ""
                raise SourceFormatError(
                    f"{f}: line {lineno} (byte offset {start + e.pos}): not valid JSON{truncated}: {e.msg}"
                ) from None
            yield _obj(where, value)


def load_json(f: Path, error: type[ValueError] | None = None) -> object:
    """A whole JSON file; a malformed one raises `error` naming the file and the position."""
    error = error or SourceFormatError
    try:
        return json.loads(f.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise error(f"{f}: byte offset {e.start}: not UTF-8") from None
    except json.JSONDecodeError as e:
        raise error(f"{f}: line {e.lineno} column {e.colno} (char offset {e.pos}): not valid JSON: {e.msg}") from None


def _json(f: Path) -> Iterator[Row]:
    value = load_json(f)
    if isinstance(value, dict):
        # a single record, or a wrapper such as {"instances": [...]} / {"data": [...]}
        lists = [k for k, v in value.items() if isinstance(v, list) and v and all(isinstance(x, dict) for x in v)]
        if len(value) == 1 and lists:
            value = value[lists[0]]
        else:
            yield Row(f.name, value)
            return
    if not isinstance(value, list):
        raise SourceFormatError(f"{f}: expected a JSON object or a list of objects, found {type(value).__name__}")
    for i, item in enumerate(value):
        yield _obj(f"{f.name}[{i}]", item)


_SURROGATE = re.compile("[\udc80-\udcff]")


def _csv(f: Path) -> Iterator[Row]:
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    with open(f, encoding="utf-8", errors="surrogateescape", newline="") as fh:
        reader = csv.DictReader(fh)
        try:
            if not reader.fieldnames:
                return
            for row in reader:
                where = f"{f.name}:{reader.line_num}"
                bad = [k for k, v in row.items() if isinstance(v, str) and _SURROGATE.search(v)]
                if bad:
                    yield Row(
                        where,
                        None,
                        "bad encoding",
                        f"{f}: line {reader.line_num}: column(s) {bad} not UTF-8",
                    )
                elif None in row:
                    yield Row(
                        where,
                        None,
                        "bad row",
                        f"{f}: line {reader.line_num}: more fields than the header",
                    )
                else:
                    yield Row(where, row)
        except csv.Error as e:
            raise SourceFormatError(f"{f}: line {reader.line_num}: not valid CSV: {e}") from None


def _parquet(f: Path) -> Iterator[Row]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    size = f.stat().st_size
    try:
        pf = pq.ParquetFile(f)
    except (pa.ArrowException, OSError) as e:
        raise SourceFormatError(
            f"{f}: not a readable parquet file (footer at byte offset {max(size - 8, 0)} of {size}): {e}"
        ) from None
    for g in range(pf.num_row_groups):
        try:
            table = pf.read_row_group(g)
        except (pa.ArrowException, OSError) as e:
            raise SourceFormatError(f"{f}: row group {g} of {pf.num_row_groups} is unreadable: {e}") from None
        for i, row in enumerate(table.to_pylist()):
            yield Row(f"{f.name}:rg{g}:{i}", row)


# -- helpers shared by adapters ----------------------------------------------------
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def task_name(*parts: object) -> str:
    """A safe Harbor `path` from id parts (runs of other characters become '-')."""
    name = "-".join(_UNSAFE.sub("-", str(p)).strip("-.") for p in parts if str(p).strip())
    return name[:200] or "task"


def as_text(value) -> str | None:
    """A string field, or None when missing/blank (NaN from CSV/pandas exports too)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    text = value if isinstance(value, str) else str(value)
    return text if text.strip() else None


def first_text(row: dict, keys) -> str | None:
    """The first of `keys` that holds text (`as_text`): adapters accept several names for a field."""
    return next((text for k in keys if (text := as_text(row.get(k))) is not None), None)


def as_list(value, field: str) -> list:
    """A list field given as a list, a JSON-encoded list or a Python-literal list string."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    if hasattr(value, "tolist"):  # numpy arrays from parquet readers
        return list(value.tolist())
    if isinstance(value, str):
        s = value.strip()
        if not s:
            return []
        try:
            parsed = json.loads(s)
        except json.JSONDecodeError:
            import ast

            try:
                parsed = ast.literal_eval(s)
            except (ValueError, SyntaxError):
                raise ValueError(f"{field} is not a list: {s[:80]!r}") from None
        if isinstance(parsed, (list, tuple)):
            return list(parsed)
    raise ValueError(f"{field} is not a list: {str(value)[:80]!r}")


def heredoc(body: str, tag: str = "OTBUILD_EOF") -> tuple[str, str]:
    """A quoted-heredoc delimiter that does not occur as a line of `body`, and the body
    ending with a newline."""
    lines = set(body.splitlines())
    n, delim = 0, tag
    while delim in lines:
        n += 1
        delim = f"{tag}_{n}"
    return delim, body if body.endswith("\n") else body + "\n"


class Dedup:
    """Task names seen so far: the second row with a name is quarantined, not overwritten."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}

    def first(self, name: str, where: str) -> str | None:
        """None if `name` is new; else where it was first seen."""
        if name in self.seen:
            return self.seen[name]
        self.seen[name] = where
        return None
