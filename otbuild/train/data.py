"""The SFT training set: a tokenized set (otbuild/train/tokenized.py) -> rows -> batches.

Policies (recorded in the checkpoint manifest):
- truncation (`cutoff_len`): applied when the set is tokenized: "right" keeps a trace's first
  cutoff_len tokens (later turns are cut; a trace with no supervised token left is dropped),
  "drop" skips traces that are longer. Both counted there.
- token_budget: sequences are put in a seeded order (the same for the same seed) and taken
  whole while the running total of their tokens (after truncation) stays within the budget;
  the rest are left out. The budget counts every token of a sequence (prompt and completion).
- packing: sequences are packed first-fit decreasing into rows of cutoff_len tokens (the
  longest first, each into the first row with room: O(n log n) with a max-tree over the rows'
  room); each keeps its own positions (position_ids restart), which transformers turns into a
  block-diagonal mask, so packed traces never attend to each other.
- batches: each epoch visits the rows in a seeded order; the last global batch of an epoch is
  filled up from the start of that order, so every step has exactly global_batch rows.

A `Dataset` holds only each row's sequence numbers and sizes; a row's tokens are read from
the memory-mapped set when a rank trains on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow.parquet as pq

from otbuild.train.tokenized import TokenizedSet


@dataclass
class Row:
    input_ids: np.ndarray  # int32
    mask: np.ndarray  # bool: supervised (assistant) tokens
    position_ids: np.ndarray | None = None  # packed rows only


@dataclass
class Dataset:
    seqs: TokenizedSet
    members: list[np.ndarray]  # per row: the sequences it holds (one unless packed)
    tokens: np.ndarray  # per row
    supervised: np.ndarray  # per row: target tokens
    stats: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.members)

    def row(self, i: int) -> Row:
        parts = [self.seqs.seq(int(j)) for j in self.members[i]]
        if len(parts) == 1:
            return Row(*parts[0])
        masks = []
        for _, m in parts:
            m = m.copy()
            m[0] = False  # never predict a trace's first token from the previous trace
            masks.append(m)
        return Row(
            np.concatenate([ids for ids, _ in parts]),
            np.concatenate(masks),
            np.concatenate([np.arange(len(ids), dtype=np.int64) for ids, _ in parts]),
        )


def read_conversations(paths) -> list[list[dict]]:
    out = []
    for path in paths:
        table = pq.read_table(path, columns=["conversations"])
        out += [c for c in table.column("conversations").to_pylist() if c]
    return out


def build(
    seqs: TokenizedSet, *, cutoff_len: int, packing: bool = False, token_budget: int | None = None, seed: int = 0
) -> Dataset:
    """The rows to train on: a token budget's selection of the sequences, packed or one a row."""
    lengths = seqs.lengths
    stats = {**seqs.stats, "over_budget": 0, "token_budget": token_budget}
    keep = np.arange(len(seqs))
    if token_budget is not None:
        order = np.random.default_rng(seed).permutation(len(seqs))
        kept, total = [], 0
        for i in order:
            n = int(lengths[i])
            if total + n > token_budget:
                continue  # a shorter trace later in the order may still fit
            kept.append(i)
            total += n
        stats["over_budget"] = len(seqs) - len(kept)
        keep = np.sort(np.asarray(kept, dtype=np.int64))
    stats["sequences"] = len(keep)
    stats["tokens"] = int(lengths[keep].sum())
    stats["supervised_tokens"] = int(seqs.supervised[keep].sum())
    if packing:
        members = [keep[b] for b in pack(lengths[keep], cutoff_len)]
    else:
        members = [keep[i : i + 1] for i in range(len(keep))]
    tokens = np.asarray([int(lengths[m].sum()) for m in members], dtype=np.int64)
    supervised = np.asarray([int(seqs.supervised[m].sum()) for m in members], dtype=np.int64)
    stats["rows"] = len(members)
    return Dataset(seqs, members, tokens, supervised, stats)


def pack(lengths, capacity: int) -> list[np.ndarray]:
    """First-fit decreasing: bins (lists of positions in `lengths`) of at most `capacity` tokens.
    The longest item first, each into the first bin with room; the first bin with room is found
    in O(log n) by walking down a max-tree of the bins' room (unopened bins have all of it)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    if n and int(lengths.max()) > capacity:
        raise ValueError(f"a sequence of {int(lengths.max())} tokens does not fit a row of {capacity}")
    size = 1
    while size < max(n, 1):
        size *= 2
    room = [capacity] * (2 * size)
    bins: list[list[int]] = []
    for i in np.argsort(-lengths, kind="stable").tolist():
        need = int(lengths[i])
        node = 1
        while node < size:
            node = 2 * node if room[2 * node] >= need else 2 * node + 1
        b = node - size
        if b == len(bins):
            bins.append([])
        bins[b].append(i)
        room[node] -= need
        node //= 2
        while node:
            room[node] = max(room[2 * node], room[2 * node + 1])
            node //= 2
    return [np.asarray(b, dtype=np.int64) for b in bins]


def epoch_order(n_rows: int, epoch: int, seed: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n_rows)


def steps_per_epoch(n_rows: int, global_batch: int) -> int:
    return -(-n_rows // global_batch)


def global_batch_rows(n_rows: int, step: int, global_batch: int, seed: int) -> list[int]:
    """Row indices of optimizer step `step` (0-based, across epochs)."""
    per_epoch = steps_per_epoch(n_rows, global_batch)
    epoch, k = divmod(step, per_epoch)
    order = epoch_order(n_rows, epoch, seed)
    idx = [order[(k * global_batch + j) % n_rows] for j in range(global_batch)]
    return [int(i) for i in idx]


def collate(rows: list[Row], pad_id: int) -> dict:
    """Right-padded tensors: input_ids, attention_mask or position_ids, and the target mask."""
    import torch

    width = max(len(r.input_ids) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    packed = any(r.position_ids is not None for r in rows)
    pos = torch.zeros((len(rows), width), dtype=torch.long) if packed else None
    for i, r in enumerate(rows):
        n = len(r.input_ids)
        ids[i, :n] = torch.from_numpy(r.input_ids.astype(np.int64))
        mask[i, :n] = torch.from_numpy(r.mask)
        attn[i, :n] = 1
        if pos is not None:  # packed
            p = r.position_ids if r.position_ids is not None else np.arange(n)
            pos[i, :n] = torch.from_numpy(p)
            pos[i, n:] = torch.arange(width - n)
    batch = {"input_ids": ids, "target_mask": mask, "n_tokens": int(attn.sum())}
    if packed:
        if len(rows) > 1:
            raise ValueError("packing uses one packed row per micro-batch (per_device_batch_size: 1)")
        # no 2D mask: transformers reads the traces' blocks from the restarting position_ids
        # (with a mask, a packed row's traces would attend across their boundaries)
        batch["position_ids"] = pos
    else:
        batch["attention_mask"] = attn
    return batch
