"""File IO: atomic writes (nothing half-written is ever left looking complete) and parquet
read in bounded batches."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(dest: Path | str) -> Iterator[Path]:
    """Yield a temporary sibling of `dest`; rename it onto `dest` only if the block succeeds."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_json(dest: Path | str, obj) -> None:
    with atomic_path(dest) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def parquet_batches(path: Path | str, batch_rows: int, columns: list[str] | None = None) -> Iterator:
    """A parquet file's record batches, `batch_rows` rows at a time, in bounded memory: no
    pre-buffering (pyarrow's default keeps every row group read so far), 1 MB read buffer."""
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path, pre_buffer=False, buffer_size=1 << 20)
    return pf.iter_batches(batch_size=batch_rows, columns=columns)
