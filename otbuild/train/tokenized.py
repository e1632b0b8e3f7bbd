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
rendered, tokenized in one batched call of the fast tokenizer (its threads on every core) and
appended, so memory is bounded by the batch, not by the set.
Dropped traces are counted by reason: `empty_conversation`, `template_mismatch` (the chat
template rewrote an assistant turn), `too_long` (truncation: drop) and `no_assistant_tokens`
(nothing supervised left, e.g. after truncation: right). A set already built for the same key
is reused as it is.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa

from otbuild.fsio import atomic_path, write_json
from otbuild.harness.protocol import PROMPTS
from otbuild.hashing import file_sha256
from otbuild.traces.table import iter_conversations
from otbuild.train.chat import TemplateMismatch, byte_lengths, ensure_template, tokenize_batch

TOKENS, META = "tokens.arrow", "meta.json"
FORMAT = 1  # bump when the layout or the tokenization changes: old sets are rebuilt
# traces per tokenizer call, tokenized in parallel on every core: memory ~ BATCH_ROWS x the
# largest trace x ~80 (its text, encodings and arrays: ~9 MB for a 110 KB trace)
BATCH_ROWS = int(os.environ.get("OTBUILD_TOKENIZE_BATCH", "32"))
DROP_REASONS = ("empty_conversation", "template_mismatch", "too_long", "no_assistant_tokens")
SCHEMA = pa.schema([("trace", pa.int64()), ("input_ids", pa.list_(pa.int32())),
                    ("mask", pa.list_(pa.uint8())), ("length", pa.int32()), ("supervised", pa.int32())])


def tokenizer_fingerprint(tokenizer) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    body = backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True)
    return hashlib.sha256((body + (tokenizer.chat_template or "")).encode()).hexdigest()


def build_tokenized_set(traces, tokenizer, template: str, cutoff_len: int, out: Path, *,
                        truncation: str = "right", train_on_prompt: bool = False,
                        prompt: str = PROMPTS[0], batch_rows: int = BATCH_ROWS, log=None) -> dict:
    """Tokenize the trace parquet(s) `traces` once into `out`; return its counts (meta.json's
    `stats`). `tokenizer`: a tokenizer or a model dir; `template`: auto | qwen3 | qwen3_thinking."""
    if isinstance(tokenizer, (str, Path)):
        from otbuild.train.model import load_tokenizer

        tokenizer, source = load_tokenizer(tokenizer, template)
    else:
        source = ensure_template(tokenizer, template)
    out = Path(out)
    paths = [Path(traces)] if isinstance(traces, (str, Path)) else [Path(p) for p in traces]
    key = {"format": FORMAT, "traces": [file_sha256(p) for p in paths],
           "tokenizer": tokenizer_fingerprint(tokenizer), "template": source, "cutoff_len": cutoff_len,
           "truncation": truncation, "train_on_prompt": train_on_prompt, "prompt": prompt}
    if (out / META).exists():
        meta = json.loads((out / META).read_text())
        if meta.get("key") == key:
            if log:
                log(f"sft: reusing the tokenized set in {out} ({meta['stats']['sequences']} sequences)")
            return meta["stats"]
    out.mkdir(parents=True, exist_ok=True)
    (out / META).unlink(missing_ok=True)  # a rebuild is not complete until its meta is back
    stats = {"traces": 0, "sequences": 0, "dropped": dict.fromkeys(DROP_REASONS, 0), "truncated": 0,
             "tokens_cut": 0, "tokens": 0, "supervised_tokens": 0, "cutoff_len": cutoff_len,
             "truncation": truncation, "chat_template": source}
    lengths = byte_lengths(tokenizer)
    with atomic_path(out / TOKENS) as tmp, pa.OSFile(str(tmp), "wb") as sink, \
            pa.ipc.new_file(sink, SCHEMA) as writer:
        for convs in iter_conversations(paths, batch_rows, prompt):
            batch = _tokenize(tokenizer, lengths, convs, source, stats, cutoff_len=cutoff_len,
                              truncation=truncation, train_on_prompt=train_on_prompt)
            if batch is not None:
                writer.write_batch(batch)
    write_json(out / META, {"key": key, "stats": stats})
    if log:
        dropped = {k: v for k, v in stats["dropped"].items() if v}
        log(f"sft: tokenized {stats['traces']} traces into {stats['sequences']} sequences, "
            f"{stats['tokens']} tokens (dropped: {dropped or 'none'}, truncated: {stats['truncated']})")
    return stats


def _tokenize(tokenizer, lengths, convs: list, source: str, stats: dict, *, cutoff_len: int,
              truncation: str, train_on_prompt: bool) -> pa.RecordBatch | None:
    first = stats["traces"]
    stats["traces"] += len(convs)
    present = [i for i, c in enumerate(convs) if c]
    stats["dropped"]["empty_conversation"] += len(convs) - len(present)
    cols: dict[str, list] = {name: [] for name in SCHEMA.names}
    for i, res in zip(present, tokenize_batch(tokenizer, [convs[i] for i in present], source, lengths),
                      strict=True):
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
        for name, value in (("trace", first + i), ("input_ids", ids), ("mask", mask.astype(np.uint8)),
                            ("length", len(ids)), ("supervised", supervised)):
            cols[name].append(value)
        stats["sequences"] += 1
        stats["tokens"] += len(ids)
        stats["supervised_tokens"] += supervised
    if not cols["trace"]:
        return None
    return pa.RecordBatch.from_arrays([
        pa.array(cols["trace"], pa.int64()), _lists(cols["input_ids"], pa.int32()),
        _lists(cols["mask"], pa.uint8()), pa.array(cols["length"], pa.int32()),
        pa.array(cols["supervised"], pa.int32())], schema=SCHEMA)


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
