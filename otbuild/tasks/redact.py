"""Secrets taken out of what otbuild hands over (`otbuild publish` and the `otbuild export`
handoffs): a trace may hold a key an agent echoed, a task's text one its author left in.

Each of PATTERNS (PEM private keys, JWTs, AWS access key ids, `sk-...` API keys, Hugging Face
`hf_...` and GitHub `gh[pousr]_...` tokens) is replaced by `[REDACTED:NAME]`; a `Redactor` counts
the replacements per pattern. Tables are redacted batch by batch (Arrow's RE2 kernels over every
string, nested ones in lists and structs included; a `task_binary` column's task files
unpacked, redacted and packed again), so memory stays one batch whatever the table's size.
The patterns are written in the syntax RE2 and Python's `re` share.
"""

from __future__ import annotations

import gzip
import re
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pyarrow is imported where a table is redacted (the recipe loader imports the patterns)
    import pyarrow as pa

PATTERNS: dict[str, str] = {
    "private_key": r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z0-9 ]*PRIVATE KEY-----",
    "jwt": r"\beyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}",
    "aws_access_key": r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",
    "api_key_sk": r"\bsk-[A-Za-z0-9_-]{20,}",
    "hf_token": r"\bhf_[A-Za-z0-9]{30,}",
    "github_token": r"\bgh[pousr]_[A-Za-z0-9]{36,}",
}
COMPILED = {name: re.compile(pattern) for name, pattern in PATTERNS.items()}
# any pattern: one pass over a batch's strings before each pattern's; and over a task binary's
# tar stream, where each file's bytes lie in one piece: a task without a match there has none in
# any of its files (neither unpacked nor redacted)
ANY_PATTERN = "|".join(f"(?:{p})" for p in PATTERNS.values())
TASK_BINARY = "task_binary"


def mark(name: str) -> str:
    return f"[REDACTED:{name}]"


def secret_kind(text: str) -> str | None:
    """The first pattern `text` holds, None when it holds none."""
    return next((name for name, rx in COMPILED.items() if rx.search(text)), None)


def describe(found: dict[str, int]) -> str:
    """A Redactor's `found()` in words, for a command's report."""
    return (
        f"redacted {sum(found.values())} secret(s): " + ", ".join(f"{k} {n}" for k, n in found.items())
        if found
        else "no secrets found to redact"
    )


class Redactor:
    """Replaces what PATTERNS match; `counts` per pattern (every pattern present, 0 or more)."""

    def __init__(self) -> None:
        self.counts: Counter = Counter({name: 0 for name in PATTERNS})

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def found(self) -> dict[str, int]:
        """The patterns that matched, with their counts."""
        return {name: n for name, n in self.counts.items() if n}

    def text(self, text: str) -> str:
        for name, rx in COMPILED.items():
            text, n = rx.subn(mark(name), text)
            self.counts[name] += n
        return text

    def batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """`batch` with every string redacted (and each task_binary's task files)."""
        import pyarrow as pa

        columns = [
            self._task_binaries(col) if name == TASK_BINARY else self._array(col)
            for name, col in zip(batch.schema.names, batch.columns)
        ]
        return pa.RecordBatch.from_arrays(columns, schema=batch.schema)

    def count(self, batch: pa.RecordBatch) -> None:
        """Count what `batch` would have redacted (as `batch` counts it), changing nothing."""
        for name, col in zip(batch.schema.names, batch.columns):
            if name == TASK_BINARY:
                self._task_binaries(col, replace=False)
            else:
                self._array(col, replace=False)

    def task(self, task):
        """A TaskDir with each of its text files redacted (binary files as they are)."""
        from otbuild.tasks.taskdir import TaskDir

        out = TaskDir(task.name)
        for rel, f in task.files.items():
            data = f.data
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                pass
            else:
                if (clean := self.text(text)) != text:
                    data = clean.encode("utf-8")
            out.add(rel, data, f.executable)
        return out

    # -- arrays ---------------------------------------------------------------------------
    def _array(self, arr: pa.Array, replace: bool = True) -> pa.Array:
        import pyarrow as pa

        t = arr.type
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            return self._strings(arr, replace)
        if not replace and (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_struct(t)):
            children = arr.flatten() if pa.types.is_struct(t) else [arr.flatten()]  # the slice's own values
            for child in children:
                self._array(child, replace=False)
            return arr
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            cls = pa.ListArray if pa.types.is_list(t) else pa.LargeListArray
            return cls.from_arrays(arr.offsets, self._array(arr.values), type=t, mask=arr.is_null())
        if pa.types.is_struct(t):
            fields = [self._array(child) for child in arr.flatten()]
            return pa.StructArray.from_arrays(fields, fields=list(t), mask=arr.is_null())
        return arr

    def _strings(self, arr: pa.Array, replace: bool = True) -> pa.Array:
        import pyarrow.compute as pc

        if not pc.any(pc.match_substring_regex(arr, ANY_PATTERN)).as_py():  # one pass, most batches
            return arr
        for name, pattern in PATTERNS.items():
            n = pc.sum(pc.count_substring_regex(arr, pattern)).as_py() or 0
            if n:
                self.counts[name] += n
                if replace:
                    arr = pc.replace_substring_regex(arr, pattern, mark(name))
        return arr

    def _task_binaries(self, arr: pa.Array, replace: bool = True) -> pa.Array:
        import pyarrow as pa

        from otbuild.tasks.taskdir import TaskDir

        out = []
        blobs = arr.to_pylist()
        for blob, maybe in zip(blobs, _may_hold_secrets(blobs), strict=True):
            if blob and maybe:
                before = self.total
                task = self.task(TaskDir.unpack("task", blob))
                blob = task.pack() if replace and self.total != before else blob
            out.append(blob)
        return pa.array(out, type=arr.type) if replace else arr


def _may_hold_secrets(blobs: list[bytes | None], chunk_bytes: int = 64 << 20) -> list[bool]:
    """For each task binary, whether its (gzip) tar stream matches any pattern (Arrow's RE2
    kernel, on at most `chunk_bytes` of unpacked streams at a time): False only when none of
    its files can; a blob of another compression, or one that does not decompress, is looked
    into file by file (True)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    out: list[bool] = []
    raw: list[bytes | None] = []  # None: look into it file by file

    def match() -> None:
        found = pc.match_substring_regex(pa.array(raw, pa.binary()), ANY_PATTERN).to_pylist()
        out.extend(r is None or bool(f) for r, f in zip(raw, found))
        raw.clear()

    size = 0
    for blob in blobs:
        try:
            raw.append(b"" if not blob else gzip.decompress(blob) if blob[:2] == b"\x1f\x8b" else None)
        except (OSError, EOFError):  # unpacking it says what is wrong
            raw.append(None)
        size += len(raw[-1] or b"")
        if size >= chunk_bytes:
            match()
            size = 0
    match()
    return out


def scan(path: Path, batch_rows: int = 1024) -> dict[str, int]:
    """What publishing the table at `path` would redact, per pattern (every pattern, 0 or
    more): read batch by batch, through the same kernels as `Redactor.batch`, nothing written."""
    from otbuild.fsio import parquet_batches

    redactor = Redactor()
    for batch in parquet_batches(path, batch_rows):
        redactor.count(batch)
    return dict(redactor.counts)
