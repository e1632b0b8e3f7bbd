"""RLOO's math over a step's trajectories (otbuild/train/rl/__init__.py has the algorithm):
leave-one-out advantages, the turns joined into token sequences, their log-probs under a
model, PPO-clip with an optional k3 KL, and the one update a step makes over all ranks."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from otbuild.settings.train import Rl


def rloo_advantages(rewards: list[float], eps: float = 1e-6) -> list[float]:
    """Leave-one-out advantages of one task's k samples, normalised by their std (ddof=1)."""
    k = len(rewards)
    if k < 2:
        raise ValueError("RLOO needs at least 2 samples per task")
    if max(rewards) == min(rewards):
        return [0.0] * k
    total = sum(rewards)
    mean = total / k
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (k - 1))
    return [(r - (total - r) / (k - 1)) / (std + eps) for r in rewards]


def masked_rloo_advantages(rewards: list[float], masked: list[bool], eps: float = 1e-6) -> list[float | None]:
    """rloo_advantages over a task's unmasked samples; a masked one gets None (no loss, no
    baseline). Under 2 unmasked samples there is no baseline: every advantage is 0."""
    kept = [r for r, m in zip(rewards, masked, strict=True) if not m]
    adv = iter(rloo_advantages(kept, eps) if len(kept) >= 2 else [0.0] * len(kept))
    return [None if m else next(adv) for m in masked]


def ppo_clip_loss(
    logp, old_logp, advantages, mask, *, clip_low: float = 0.2, clip_high: float = 0.2, n_tokens: int | None = None
):
    """PPO-clip, summed over masked tokens and divided by n_tokens (default: the mask's count).

    Tensors are [B, T] (advantages [B] or [B, T]). Returns (loss, stats)."""
    import torch

    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logp)
    mask = mask.to(logp.dtype)
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    denom = n_tokens if n_tokens is not None else mask.sum().clamp(min=1)
    loss = (per_token * mask).sum() / denom
    with torch.no_grad():
        was_clipped = ((clipped < unclipped) & (mask > 0)).sum()
    return loss, {"clipped_tokens": int(was_clipped)}


def k3_kl(logp, ref_logp):
    """Per-token k3 estimator of KL(policy || ref): exp(d) - d - 1, d = ref - logp."""
    import torch

    d = ref_logp - logp
    return torch.exp(d) - d - 1


@dataclass
class Turn:
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float] | None = None  # each completion token's log-prob as sampled (the behaviour policy)


@dataclass
class TokenSequence:
    ids: list[int]
    mask: list[bool]  # completion tokens
    advantage: float = 0.0
    old_logp: Any = None  # tensor over the sequence's masked positions (torch is imported late)
    ref_logp: Any = None
    behaviour: list[float] | None = None  # the sampling log-probs of its masked tokens (None: not recorded)
    stale: bool = False  # sampled by weights older than the update's: the ratio is against `behaviour`


def sequences(turns: list[Turn]) -> list[TokenSequence]:
    """Join turns whose prompt extends the previous prompt + completion; else start anew."""
    out: list[TokenSequence] = []
    for t in turns:
        cur = out[-1] if out else None
        if cur is not None and t.prompt_ids[: len(cur.ids)] == cur.ids:
            extra = t.prompt_ids[len(cur.ids) :]
            cur.ids += extra + t.completion_ids
            cur.mask += [False] * len(extra) + [True] * len(t.completion_ids)
            cur.behaviour = None if cur.behaviour is None or t.logprobs is None else cur.behaviour + t.logprobs
        else:
            out.append(
                TokenSequence(
                    list(t.prompt_ids) + list(t.completion_ids),
                    [False] * len(t.prompt_ids) + [True] * len(t.completion_ids),
                    behaviour=None if t.logprobs is None else list(t.logprobs),
                )
            )
    return [s for s in out if any(s.mask)]


def token_logprobs(model, seqs: list[TokenSequence], temperature: float, pad_id: int):
    """log p(token | prefix) at each sequence's masked positions: a list of 1-D tensors."""
    import torch

    width = max(len(s.ids) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    tmask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, s in enumerate(seqs):
        ids[i, : len(s.ids)] = torch.tensor(s.ids)
        attn[i, : len(s.ids)] = 1
        tmask[i, : len(s.ids)] = torch.tensor(s.mask)
    ids, attn, tmask = (t.to(model.device) for t in (ids, attn, tmask))
    hidden = model.model(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state
    sel = tmask[:, 1:]
    logits = model.lm_head(hidden[:, :-1][sel]).float() / temperature
    lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:][sel][:, None])[:, 0]
    return list(torch.split(lp, sel.sum(1).tolist()))


def old_logprobs(model, seqs: list[TokenSequence], temperature: float, pad_id: int) -> float:
    """Each sequence's `old_logp`, the PPO ratio's denominator: the log-probs of the weights
    about to be updated, or, for a stale sequence (sampled by older weights: max_staleness),
    the log-probs that sampled it (off-policy correction). Returns the largest gap between
    the two over the stale sequences' tokens."""
    import torch

    gap = 0.0
    for s, lp in zip(seqs, token_logprobs(model, seqs, temperature, pad_id), strict=True):
        s.old_logp = lp
        if s.stale and s.behaviour is not None and len(s.behaviour) == len(lp):
            s.old_logp = torch.tensor(s.behaviour, dtype=lp.dtype, device=lp.device)
            gap = max(gap, float((lp - s.old_logp).abs().max()))
    return gap


def _micro_batches(seqs: list[TokenSequence], max_tokens: int) -> list[list[TokenSequence]]:
    seqs = sorted(seqs, key=lambda s: len(s.ids))
    out: list[list[TokenSequence]] = []
    cur: list[TokenSequence] = []
    for s in seqs:
        if cur and len(s.ids) * (len(cur) + 1) > max_tokens:
            out.append(cur)
            cur = []
        cur.append(s)
    if cur:
        out.append(cur)
    return out


def update(engine, seqs: list[TokenSequence], cfg: Rl, pad_id: int, ref_model=None) -> dict:
    """One RLOO/PPO update over a step's sequences; on several ranks each brings its own. The
    loss is normalised by the assistant tokens of every rank and DeepSpeed sums the ranks'
    gradients, so the update is the one a single process would make over all the sequences.
    Every rank runs the same number of micro-batches (padded with zero-loss ones), as the
    collectives need. Returns this rank's loss and diagnostics (the grad norm is global)."""
    import torch
    import torch.distributed as dist

    model, world = engine.module, dist.get_world_size()
    temperature = cfg.temperature
    active = [s for s in seqs if s.advantage != 0.0]
    micro = _micro_batches(active, cfg.micro_batch_tokens)
    local_tokens = sum(sum(s.mask[1:]) for s in seqs)  # every assistant token, zero advantage or not
    counts = torch.tensor([local_tokens, len(micro)], dtype=torch.long, device=engine.device)
    n_tokens = int(_all_reduce(counts[:1], dist.ReduceOp.SUM))
    n_micro = int(_all_reduce(counts[1:], dist.ReduceOp.MAX))
    stats: dict[str, Any] = {
        "loss": 0.0,
        "clipped_tokens": 0,
        "kl": 0.0,
        "assistant_tokens": local_tokens,
        "active_sequences": len(active),
        "grad_norm": 0.0,
        "behaviour_gap": 0.0,
    }
    if n_micro == 0 or n_tokens == 0:
        return stats
    real = len(micro)
    micro += [[TokenSequence([pad_id, pad_id], [False, True])] for _ in range(n_micro - real)]
    kl_coef = cfg.kl_coef
    with torch.no_grad():
        for mb in micro:
            stats["behaviour_gap"] = max(stats["behaviour_gap"], old_logprobs(model, mb, temperature, pad_id))
            if ref_model is not None and kl_coef > 0:
                for s, lp in zip(mb, token_logprobs(ref_model, mb, temperature, pad_id), strict=True):
                    s.ref_logp = lp
    model.train()
    for _ in range(cfg.ppo_epochs):  # one optimizer step per PPO epoch
        total = 0.0
        for i, mb in enumerate(micro):
            lps = token_logprobs(model, mb, temperature, pad_id)
            logp = torch.cat(lps)
            old = torch.cat([s.old_logp for s in mb])
            adv = torch.cat([torch.full_like(lp, s.advantage) for s, lp in zip(mb, lps, strict=True)])
            ones = torch.ones_like(logp)
            loss, st = ppo_clip_loss(
                logp[None],
                old[None],
                adv[None],
                ones[None],
                clip_low=cfg.clip_low,
                clip_high=cfg.clip_high,
                n_tokens=n_tokens,
            )
            if kl_coef > 0:
                kl = (k3_kl(logp, torch.cat([s.ref_logp for s in mb]))).sum() / n_tokens
                loss = loss + kl_coef * kl
                stats["kl"] += float(kl.detach()) if i < real else 0.0
            if i >= real:
                loss = loss * 0.0  # padding: in the graph for the collectives, no gradient
            engine.backward(loss * world)  # DeepSpeed averages the ranks' gradients: sum them
            total += float(loss.detach())
            stats["clipped_tokens"] += st["clipped_tokens"] if i < real else 0
        gn_local = None
        if world == 1 and engine.zero_optimization_stage() == 0:  # DeepSpeed does not report it
            grads = [p.grad.float().norm() for p in model.parameters() if p.grad is not None]
            gn_local = float(torch.stack(grads).norm()) if grads else 0.0
        engine.step()  # unmanaged accumulation: the micro-batches' gradients, reduced, applied
        gn = engine.get_global_grad_norm()
        stats["loss"], stats["grad_norm"] = total, float(gn) if gn is not None else gn_local
    return stats


def _all_reduce(t, op):
    import torch.distributed as dist

    dist.all_reduce(t, op=op)
    return t.item()
