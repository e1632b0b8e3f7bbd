"""The SFT training set: trace conversations -> token ids + assistant mask -> batches.

Policies (recorded in the checkpoint manifest):
- truncation (`cutoff_len`): "right" keeps a trace's first cutoff_len tokens (later turns are
  cut; a trace with no supervised token left is dropped), "drop" skips traces that are longer.
- token_budget: traces are put in a seeded order (the same for the same seed) and taken whole
  while the running total of their tokens (after truncation) stays within the budget; the
  rest are left out. The budget counts every token of a sequence (prompt and completion).
- packing: sequences are packed first-fit, in order, into rows of cutoff_len tokens; each keeps
  its own positions (position_ids restart), which transformers turns into a block-diagonal
  mask, so packed traces never attend to each other.
- batches: each epoch visits the rows in a seeded order; the last global batch of an epoch is
  filled up from the start of that order, so every step has exactly global_batch rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow.parquet as pq

from otbuild.train.chat import TemplateMismatch, tokenize_conversation


@dataclass
class Row:
    input_ids: np.ndarray  # int32
    mask: np.ndarray  # bool: supervised (assistant) tokens
    position_ids: np.ndarray | None = None  # packed rows only


@dataclass
class Dataset:
    rows: list[Row]
    stats: dict = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return int(sum(len(r.input_ids) for r in self.rows))


def read_conversations(paths) -> list[list[dict]]:
    out = []
    for path in paths:
        table = pq.read_table(path, columns=["conversations"])
        out += [c for c in table.column("conversations").to_pylist() if c]
    return out


def build(tokenizer, conversations, *, cutoff_len: int, truncation: str = "right",
          packing: bool = False, token_budget: int | None = None, seed: int = 0,
          train_on_prompt: bool = False) -> Dataset:
    """Tokenised rows with their loss masks: assistant tokens, or (`train_on_prompt`) every
    token but each trace's first."""
    stats = {"traces": len(conversations), "template_mismatch": 0, "no_assistant_tokens": 0,
             "truncated": 0, "dropped_too_long": 0, "tokens_cut": 0, "over_budget": 0,
             "truncation": truncation, "cutoff_len": cutoff_len, "token_budget": token_budget}
    seqs: list[Row] = []
    for conv in conversations:
        try:
            ids, mask = tokenize_conversation(tokenizer, conv)
        except TemplateMismatch:
            stats["template_mismatch"] += 1
            continue
        if train_on_prompt:
            mask = np.arange(len(ids)) > 0
        if len(ids) > cutoff_len:
            if truncation == "drop":
                stats["dropped_too_long"] += 1
                continue
            stats["truncated"] += 1
            stats["tokens_cut"] += len(ids) - cutoff_len
            ids, mask = ids[:cutoff_len], mask[:cutoff_len]
        if not mask[1:].any():  # the first token is never a target
            stats["no_assistant_tokens"] += 1
            continue
        seqs.append(Row(ids, mask))
    if token_budget is not None:
        order = np.random.default_rng(seed).permutation(len(seqs))
        kept, total = [], 0
        for i in order:
            n = len(seqs[i].input_ids)
            if total + n > token_budget:
                continue  # a shorter trace later in the order may still fit
            kept.append(i)
            total += n
        stats["over_budget"] = len(seqs) - len(kept)
        seqs = [seqs[i] for i in sorted(kept)]
    stats["sequences"] = len(seqs)
    stats["tokens"] = int(sum(len(s.input_ids) for s in seqs))
    stats["supervised_tokens"] = int(sum(int(s.mask[1:].sum()) for s in seqs))
    rows = pack(seqs, cutoff_len) if packing else seqs
    stats["rows"] = len(rows)
    return Dataset(rows, stats)


def pack(seqs: list[Row], cutoff_len: int) -> list[Row]:
    """First-fit packing, in order, into rows of at most cutoff_len tokens."""
    bins: list[list[Row]] = []
    room: list[int] = []
    for s in seqs:
        n = len(s.input_ids)
        for b, left in enumerate(room):
            if n <= left:
                bins[b].append(s)
                room[b] -= n
                break
        else:
            bins.append([s])
            room.append(cutoff_len - n)
    out = []
    for group in bins:
        masks = []
        for s in group:
            m = s.mask.copy()
            m[0] = False  # never predict a trace's first token from the previous trace
            masks.append(m)
        out.append(Row(np.concatenate([s.input_ids for s in group]), np.concatenate(masks),
                       np.concatenate([np.arange(len(s.input_ids), dtype=np.int64) for s in group])))
    return out


def epoch_order(n_rows: int, epoch: int, seed: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n_rows)


def steps_per_epoch(n_rows: int, global_batch: int) -> int:
    return -(-n_rows // global_batch)


def global_batch_rows(n_rows: int, step: int, global_batch: int, seed: int) -> list[int]:
    """Row indices of optimizer step `step` (0-based, across epochs)."""
    spe = steps_per_epoch(n_rows, global_batch)
    epoch, k = divmod(step, spe)
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
        if packed:
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
