"""The tokenized training set: trace conversations -> token ids, loss masks and lengths, built
once per (traces, tokenizer, template, cutoff) and memory-mapped by every rank and every resume.

    build_tokenized_set(traces, tokenizer, template, cutoff_len, out) -> counts
    TokenizedSet(out)  # read it: lengths, supervised counts, one sequence at a time

`out` is a directory:
  tokens.arrow  Arrow IPC file, uncompressed (memory-mapped, zero-copy): one row per kept trace,
                in input order: trace (int64, its row in the inputs), input_ids (list<int32>),
                mask (list<uint8>, 1 = supervised), length (int32), supervised (int32: targets,
                the first token never is one)
  meta.json     written last (a dir without it is not complete): the key it was built for and
                the counts: traces, dropped by reason, truncated, tokens cut, tokens, ...

The build streams: `batch_rows` traces at a time (OTBUILD_TOKENIZE_BATCH, default 32) are read,
rendered, tokenized in one batched call of the fast tokenizer and appended, so memory is
bounded by the batch, not by the set. With `workers` > 1 (default `auto`: one per CPU this
process may run on, at most one per batch) the batches are tokenized in that many spawned
worker processes, each a whole batch at a time, at most 2 batches per worker in flight (memory:
~2 x workers x the batch), and appended in input order: the file is byte for byte the one a
single process writes.
A trace's offered tools (its `tools` column, where the table has one) are rendered with its
conversation (otbuild/train/chat.py); a `tools` value that is not a JSON array of tool
definitions fails the build naming its row.
Dropped traces are counted by reason: `empty_conversation`, `template_mismatch` (the chat
template rewrote an assistant turn, or a tool call's arguments are not a JSON object),
`too_long` (truncation: drop) and `no_assistant_tokens` (nothing supervised left, e.g. after
truncation: right). A set already built for the same key is reused as it is.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from otbuild.fsio import atomic_path, write_json
from otbuild.harness.protocol import conversations_of, trace_batches
from otbuild.hashing import file_sha256
from otbuild.settings.recipe import PROMPTS
from otbuild.train.chat import TemplateMismatch, byte_lengths, ensure_template, parse_tools, tokenize_batch

TOKENS, META = "tokens.arrow", "meta.json"
FORMAT = 2  # bump when the layout or the tokenization changes: old sets are rebuilt (2: the `tools` column read)
# traces per tokenizer call, tokenized in parallel on every core: memory ~ BATCH_ROWS x the
# largest trace x ~80 (its text, encodings and arrays: ~9 MB for a 110 KB trace)
BATCH_ROWS = int(os.environ.get("OTBUILD_TOKENIZE_BATCH", "32"))
COUNTS = ("traces", "sequences", "truncated", "tokens_cut", "tokens", "supervised_tokens")  # summed over batches
DROP_REASONS = ("empty_conversation", "template_mismatch", "too_long", "no_assistant_tokens")
SCHEMA = pa.schema(
    [
        ("trace", pa.int64()),
        ("input_ids", pa.list_(pa.int32())),
        ("mask", pa.list_(pa.uint8())),
        ("length", pa.int32()),
        ("supervised", pa.int32()),
    ]
)


def tokenizer_fingerprint(tokenizer) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    body = backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True)
    return hashlib.sha256((body + (tokenizer.chat_template or "")).encode()).hexdigest()


def build_tokenized_set(
    traces,
    tokenizer,
    template: str,
    cutoff_len: int,
    out: Path,
    *,
    truncation: str = "right",
    train_on_prompt: bool = False,
    prompt: str = PROMPTS[0],
    batch_rows: int = BATCH_ROWS,
    workers: int | str = "auto",
    log=None,
) -> dict:
    """Tokenize the trace parquet(s) `traces` once into `out`; return its counts (meta.json's
    `stats`). `tokenizer`: a tokenizer or a model dir; `template`: auto | qwen3 | qwen3_thinking;
    `workers`: processes that tokenize (auto: one per available CPU; the output is the same)."""
    if isinstance(tokenizer, (str, Path)):
        from otbuild.train.model import load_tokenizer

        tokenizer, source = load_tokenizer(tokenizer, template)
    else:
        source = ensure_template(tokenizer, template)
    out = Path(out)
    paths = [Path(traces)] if isinstance(traces, (str, Path)) else [Path(p) for p in traces]
    key = {
        "format": FORMAT,
        "traces": [file_sha256(p) for p in paths],
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "template": source,
        "cutoff_len": cutoff_len,
        "truncation": truncation,
        "train_on_prompt": train_on_prompt,
        "prompt": prompt,
    }
    if (out / META).exists():
        meta = json.loads((out / META).read_text())
        if meta.get("key") == key:
            if log:
                log(f"sft: reusing the tokenized set in {out} ({meta['stats']['sequences']} sequences)")
            return meta["stats"]
    out.mkdir(parents=True, exist_ok=True)
    (out / META).unlink(missing_ok=True)  # a rebuild is not complete until its meta is back
    stats = {
        "traces": 0,
        "sequences": 0,
        "dropped": dict.fromkeys(DROP_REASONS, 0),
        "truncated": 0,
        "tokens_cut": 0,
        "tokens": 0,
        "supervised_tokens": 0,
        "cutoff_len": cutoff_len,
        "truncation": truncation,
        "chat_template": source,
    }
    opts = {
        "source": source,
        "prompt": prompt,
        "cutoff_len": cutoff_len,
        "truncation": truncation,
        "train_on_prompt": train_on_prompt,
    }
    n_workers = worker_count(paths, batch_rows, workers)
    with atomic_path(out / TOKENS) as tmp, pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, SCHEMA) as writer:
        for batch, counts in _tokenized_batches(tokenizer, paths, batch_rows, n_workers, opts):
            _add_counts(stats, counts)
            if batch is not None:
                writer.write_batch(batch)
    write_json(out / META, {"key": key, "stats": stats})
    if log:
        dropped = {k: v for k, v in stats["dropped"].items() if v}
        log(
            f"sft: tokenized {stats['traces']} traces into {stats['sequences']} sequences, "
            f"{stats['tokens']} tokens (dropped: {dropped or 'none'}, truncated: {stats['truncated']}; "
            f"{max(n_workers, 1)} process{'es' if n_workers > 1 else ''})"
        )
    return stats


def worker_count(paths: list[Path], batch_rows: int, workers: int | str) -> int:
    """The worker processes a build uses: `workers` resolved, at most one per input batch
    (0 or 1: the batches are tokenized in the calling process)."""
    n_batches = sum(math.ceil(pq.ParquetFile(p).metadata.num_rows / batch_rows) for p in paths)
    return min(resolve_workers(workers), n_batches)


def resolve_workers(workers: int | str) -> int:
    """`auto`: the CPUs this process may run on (its affinity: what Slurm or a cgroup grants)."""
    if workers == "auto":
        try:
            return len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            return os.cpu_count() or 1
    if int(workers) < 1:
        raise ValueError(f"tokenize workers must be >= 1 or 'auto', not {workers!r}")
    return int(workers)


def _tokenized_batches(tokenizer, paths: list[Path], batch_rows: int, n_workers: int, opts: dict):
    """(record batch or None, counts) per input batch of `batch_rows` traces, in input order:
    here, or (n_workers > 1) in spawned worker processes (not forked: the trainer's process has
    threads), at most 2 batches per worker in flight."""
    lengths = byte_lengths(tokenizer)
    batches = (b for p in paths for b in trace_batches(p, batch_rows))
    first = 0
    if n_workers <= 1:
        for b in batches:
            yield _tokenize(tokenizer, lengths, b, first, **opts)
            first += b.num_rows
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # each worker's tokenizer gets the CPUs the workers leave (its Rust threads), at least one
    threads = max(1, resolve_workers("auto") // n_workers)
    payload = pickle.dumps((tokenizer, lengths, opts))
    pool = ProcessPoolExecutor(
        n_workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_worker_init,
        initargs=(payload, threads),
    )
    try:
        pending: deque = deque()
        for b in batches:
            pending.append(pool.submit(_worker_tokenize, b, first))
            first += b.num_rows
            if len(pending) >= 2 * n_workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


_WORKER: dict = {}


def _worker_init(payload: bytes, threads: int) -> None:
    os.environ["RAYON_NUM_THREADS"] = str(threads)  # read when the tokenizer first runs in parallel
    tokenizer, lengths, opts = pickle.loads(payload)
    _WORKER.update(tokenizer=tokenizer, lengths=lengths, opts=opts)


def _worker_tokenize(batch: pa.RecordBatch, first: int) -> tuple[pa.RecordBatch | None, dict]:
    return _tokenize(_WORKER["tokenizer"], _WORKER["lengths"], batch, first, **_WORKER["opts"])


def _add_counts(stats: dict, counts: dict) -> None:
    for k in COUNTS:
        stats[k] += counts[k]
    for k in DROP_REASONS:
        stats["dropped"][k] += counts["dropped"][k]


def _tokenize(
    tokenizer,
    lengths,
    batch: pa.RecordBatch,
    first: int,
    *,
    source: str,
    prompt: str,
    cutoff_len: int,
    truncation: str,
    train_on_prompt: bool,
) -> tuple[pa.RecordBatch | None, dict]:
    """One input batch (its `conversations` column; its first trace is row `first` of the
    inputs) -> the record batch of its kept sequences (None: none kept) and its counts."""
    pairs = conversations_of(batch, prompt)  # a multi-step trial: one sequence per step
    stats: dict[str, Any] = {**dict.fromkeys(COUNTS, 0), "dropped": dict.fromkeys(DROP_REASONS, 0)}
    stats["traces"] = batch.num_rows
    present = [(i, c) for i, c in pairs if c]
    stats["dropped"]["empty_conversation"] += sum(1 for _, c in pairs if not c)
    tools = _offered_tools(batch, [i for i, _ in present], first)
    cols: dict[str, list] = {name: [] for name in SCHEMA.names}
    results = tokenize_batch(tokenizer, [c for _, c in present], source, lengths, tools)
    for (i, _), res in zip(present, results, strict=True):
        if isinstance(res, TemplateMismatch):
            stats["dropped"]["template_mismatch"] += 1
            continue
        ids, mask = res
        if train_on_prompt:
            mask = np.arange(len(ids)) > 0
        if len(ids) > cutoff_len:
            if truncation == "drop":
                stats["dropped"]["too_long"] += 1
                continue
            stats["truncated"] += 1
            stats["tokens_cut"] += len(ids) - cutoff_len
            ids, mask = ids[:cutoff_len], mask[:cutoff_len]
        supervised = int(mask[1:].sum())  # the first token is never a target
        if not supervised:
            stats["dropped"]["no_assistant_tokens"] += 1
            continue
        for name, value in (
            ("trace", first + i),
            ("input_ids", ids),
            ("mask", mask.astype(np.uint8)),
            ("length", len(ids)),
            ("supervised", supervised),
        ):
            cols[name].append(value)
        stats["sequences"] += 1
        stats["tokens"] += len(ids)
        stats["supervised_tokens"] += supervised
    if not cols["trace"]:
        return None, stats
    return pa.RecordBatch.from_arrays(
        [
            pa.array(cols["trace"], pa.int64()),
            _lists(cols["input_ids"], pa.int32()),
            _lists(cols["mask"], pa.uint8()),
            pa.array(cols["length"], pa.int32()),
            pa.array(cols["supervised"], pa.int32()),
        ],
        schema=SCHEMA,
    ), stats


def _offered_tools(batch: pa.RecordBatch, rows: list[int], first: int) -> list | None:
    """Per row of `rows`, the tools its trace was offered (its `tools` column); None: a table
    without the column, or no trace of the batch offered any."""
    if "tools" not in batch.schema.names or not batch.column("tools").null_count < batch.num_rows:
        return None
    column = batch.column("tools").to_pylist()
    out = []
    for i in rows:
        try:
            out.append(parse_tools(column[i]))
        except ValueError as e:
            raise ValueError(f"trace row {first + i}: its `tools` column is not a JSON array of tools: {e}") from e
    return out


def _lists(arrays: list[np.ndarray], type_) -> pa.ListArray:
    offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
    np.cumsum([len(a) for a in arrays], out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.concatenate(arrays), type_))


class TokenizedSet:
    """A built set, memory-mapped: `lengths`/`supervised` per sequence, `seq(i)` its arrays.
    Reading a sequence touches only its own pages, so each rank reads the rows it trains on."""

    def __init__(self, out: Path):
        out = Path(out)
        if not (out / META).exists():
            raise FileNotFoundError(f"{out}: no complete tokenized set ({META} missing)")
        self.dir = out
        self.meta = json.loads((out / META).read_text())
        reader = pa.ipc.open_file(pa.memory_map(str(out / TOKENS)))
        self._batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        sizes = [b.num_rows for b in self._batches]
        self._starts = np.cumsum([0, *sizes])
        self.lengths = self._column("length")
        self.supervised = self._column("supervised")

    def _column(self, name: str) -> np.ndarray:
        parts = [b.column(name).to_numpy() for b in self._batches]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)

    def __len__(self) -> int:
        return int(self._starts[-1])

    @property
    def stats(self) -> dict:
        return self.meta["stats"]

    def seq(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(input_ids int32, supervised bool) of sequence `i`."""
        b = int(np.searchsorted(self._starts, i, side="right")) - 1
        batch, j = self._batches[b], i - int(self._starts[b])
        ids = batch.column("input_ids")[j].values.to_numpy()
        mask = batch.column("mask")[j].values.to_numpy().astype(bool)
        return ids, mask


def remove_tokenized_set(out: Path) -> None:
    for name in (META, TOKENS):  # the record first: a half-removed set never looks complete
        (Path(out) / name).unlink(missing_ok=True)
    if Path(out).is_dir() and not os.listdir(out):
        Path(out).rmdir()
