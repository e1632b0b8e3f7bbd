"""Partial files of resumable shards: one JSON record per finished unit of work (a trial, an
LLM request), appended, flushed and fsynced as it completes, at shards/K-of-N.partial.jsonl."""

from __future__ import annotations

import json
import os
from pathlib import Path


def drop_torn_tail(path: Path) -> None:
    """Cut a partial file back to its last complete line, so appends start on a fresh line."""
    if not path.exists():
        return
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        keep = size
        while keep > 0:  # find the last newline from the end, a block at a time
            start = max(0, keep - (1 << 20))
            f.seek(start)
            block = f.read(keep - start)
            nl = block.rfind(b"\n")
            if nl >= 0:
                keep = start + nl + 1
                break
            keep = start
        if keep < size:
            print(f"{path.name}: dropped a torn last line ({size - keep} bytes)", flush=True)
            f.truncate(keep)
            os.fsync(f.fileno())


def partial_files(outdir: Path) -> list[Path]:
    return sorted((Path(outdir) / "shards").glob("*.partial.jsonl"))


def append(out, record: dict) -> None:
    """One finished unit, durable before the next starts counting on it."""
    out.write(json.dumps(record) + "\n")
    out.flush()
    os.fsync(out.fileno())
