"""RLOO for multi-turn agents: rollouts through the terminus-2 harness, verifier rewards.

One step:
1. `batch_size` tasks (a seeded order per pass over the task table), `samples_per_task` = k
   trials each, run by `run_trial` in the sandbox with the current policy. The policy is an
   Engine (`PolicyEngine`) over the model being trained: it renders the chat, samples in
   process with transformers, and records each turn's exact prompt and completion token ids
   (no re-tokenisation of what the model said).
2. Reward: the verifier's (no reward counts as 0). A trial whose outcome eval leaves out of
   its scores (infrastructure, not_run: docs/failures.md) is masked: reward 0 in the log,
   counted as `rollout_infra_masked`, left out of its task's baseline and of the loss.
   Advantage (per task, over its unmasked samples): A_i = (r_i - mean_{j != i} r_j) /
   (std_j r_j + eps), std with Bessel's correction; a task whose rewards are all equal, or
   with fewer than 2 unmasked samples, contributes zero.
3. Loss: PPO-clip over assistant tokens only (the recorded completions), ratio
   exp(logp - logp_old) clipped to [1 - clip_low, 1 + clip_high], advantage shared by every
   token of a trajectory, token-mean over all assistant tokens of the step; optional k3 KL to
   the starting model (kl_coef, 0 by default). log-probs use logits / temperature (the
   sampling distribution). logp_old is the policy before the step's update (recomputed here,
   as with a separate rollout engine), so with ppo_epochs 1 the ratio starts at 1.
4. AdamW (lr 5e-6), grad clipping; one line per step in train_log.jsonl (reward, loss, ...),
   also written to TensorBoard event files and a wandb run (`tracking`: otbuild/train/tracking.py);
   checkpoints/step-N (DeepSpeed's: weights, optimizer) every save_steps; a killed run resumes
   from the last one (the loop SFT shares: otbuild/train/loop.py).

Scale-out: one process per GPU (otbuild.train.dist.launch_command: srun + torchrun over the
Slurm allocation), DeepSpeed data parallel with ZeRO 0-2 and bf16 on GPU. Each rank holds a
whole replica of the policy, rolls out its share of the step's tasks (whole tasks: a task's k
samples share their baseline), and the update sums the ranks' gradients (`update`).

A trajectory's turns are joined into one sequence when each prompt extends the previous
prompt + completion token for token (the usual case); otherwise they are separate sequences.

Rollouts on vLLM (`rollout: vllm`, one trainer process): the step's policy is saved and
served (docs/training.md, "Weight sync").
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from otbuild import usage
from otbuild.engines.base import Completion, ContextLengthExceededError
from otbuild.errors import ConfigError
from otbuild.fsio import write_json
from otbuild.settings.stages import RlSettings
from otbuild.settings.train import Rl

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    from otbuild.engines.process import ServerProcess
from otbuild.traces.outcome import EXCLUDED_FROM_SCORES, outcome
from otbuild.train.chat import clean
from otbuild.train.checkpoint import LOG
from otbuild.train.data import global_batch_rows
from otbuild.train.loop import Trainer, run


# -- the math -----------------------------------------------------------------------------------
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


def ppo_clip_loss(logp, old_logp, advantages, mask, *, clip_low: float = 0.2, clip_high: float = 0.2,
                  n_tokens: int | None = None):
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


# -- the policy as an Engine -----------------------------------------------------------------
@dataclass
class Turn:
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float] | None = None  # each completion token's log-prob as sampled (the behaviour policy)


class Policy:
    """The model being trained, shared by every rollout of a step (generation is serialised)."""

    def __init__(self, model, tokenizer, *, temperature: float, max_tokens: int, max_context: int,
                 name: str = "policy"):
        self.model, self.tok = model, tokenizer
        self.temperature, self.max_tokens, self.max_context = temperature, max_tokens, max_context
        self.name = name
        self.lock = threading.Lock()

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        text = self.tok.apply_chat_template(clean(messages), tokenize=False, add_generation_prompt=True)
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def sample(self, prompt_ids: list[int], seed: int | None = None) -> tuple[list[int], list[float]]:
        """Sampled answer tokens and their log-probs under the sampling distribution (logits /
        temperature); with `seed` (the harness's per request), the same whichever of the step's
        concurrent trials asks first (the trainer's own RNG state is left as it was)."""
        import torch

        budget = min(self.max_tokens, self.max_context - len(prompt_ids))
        devices = [self.model.device] if self.model.device.type == "cuda" else []
        with self.lock, torch.no_grad(), torch.random.fork_rng(devices=devices, enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            was_training = self.model.training
            self.model.eval()
            x = torch.tensor([prompt_ids], device=self.model.device)
            out = self.model.generate(
                x, attention_mask=torch.ones_like(x), do_sample=True, temperature=self.temperature,
                top_k=0, top_p=1.0, max_new_tokens=budget, eos_token_id=self.tok.eos_token_id,
                pad_token_id=self.tok.pad_token_id, output_scores=True, return_dict_in_generate=True)
            self.model.train(was_training)
        ids = out.sequences[0, len(prompt_ids):]
        scores = torch.stack(out.scores[:len(ids)])[:, 0].float()  # the sampling step's logits / temperature
        logprobs = torch.log_softmax(scores, -1).gather(-1, ids[:, None])[:, 0]
        return ids.tolist(), logprobs.tolist()

    def session(self, server=None):
        return PolicyEngine(self) if server is None else ServedPolicyEngine(self, server)


class PolicyEngine:
    """One trial's view of the policy: an Engine that records its turns."""

    name = "policy"
    provider = "otbuild"
    seeds_requests = True

    def __init__(self, policy: Policy):
        self.policy = policy
        self.model = policy.name
        self.turns: list[Turn] = []

    async def complete(self, messages: list[dict], seed: int | None = None, **_) -> Completion:
        p = self.policy
        prompt = p.prompt_ids(messages)
        if len(prompt) >= p.max_context:
            raise ContextLengthExceededError(f"prompt of {len(prompt)} tokens >= max_context {p.max_context}")
        ids, logprobs = await asyncio.to_thread(p.sample, prompt, seed)
        self.turns.append(Turn(prompt, ids, logprobs))
        stopped = bool(ids) and ids[-1] == p.tok.eos_token_id
        text = p.tok.decode(ids, skip_special_tokens=True)
        return Completion(text, len(prompt), len(ids), "stop" if stopped else "length")

    async def aclose(self) -> None:
        pass


class ServedPolicyEngine(PolicyEngine):
    """One trial's view of the policy served by vLLM (rollout: vllm): the prompt's token ids as
    the trainer's chat template renders them, the completion's as the server sampled them with
    their sampling log-probs (vLLM's `return_token_ids` and `logprobs`; the server runs with
    `logprobs_mode: processed_logprobs`, after temperature, as the trainer computes them)."""

    provider = "hosted_vllm"
    seeds_requests = False  # vLLM samples as it batches (docs/reproducibility.md)

    def __init__(self, policy: Policy, server):
        super().__init__(policy)
        self.server = server

    async def complete(self, messages: list[dict], seed: int | None = None, **_) -> Completion:  # seed: unused
        p = self.policy
        prompt = p.prompt_ids(messages)
        if len(prompt) >= p.max_context:
            raise ContextLengthExceededError(f"prompt of {len(prompt)} tokens >= max_context {p.max_context}")
        c = await self.server.complete(messages, temperature=p.temperature, logprobs=True, return_token_ids=True,
                                       max_tokens=min(p.max_tokens, p.max_context - len(prompt)))
        ids, logprobs = c.token_ids, c.logprobs
        if ids is None or logprobs is None or len(ids) != len(logprobs):  # not vLLM's answer: re-tokenised
            ids, logprobs = p.tok(c.text, add_special_tokens=False)["input_ids"], None
            if c.finish_reason == "stop":
                ids.append(p.tok.eos_token_id)
        self.turns.append(Turn(prompt, list(ids), logprobs))
        if c.usage_reported:  # the tokens the server counted (its `usage`), for the stage's usage
            return Completion(c.text, c.n_input_tokens, c.n_output_tokens, c.finish_reason)
        return Completion(c.text, len(prompt), len(ids), c.finish_reason)


@dataclass
class TokenSequence:
    ids: list[int]
    mask: list[bool]  # completion tokens
    advantage: float = 0.0
    old_logp: Any = None  # tensor over the sequence's masked positions (torch is imported late)
    ref_logp: Any = None
    behaviour: list[float] | None = None  # the sampling log-probs of its masked tokens (None: not recorded)
    stale: bool = False  # sampled by weights older than the update's: the ratio is against `behaviour`


@dataclass
class Trajectory:
    task_index: int
    reward: float
    error: str | None
    outcome: str = ""  # otbuild/traces/outcome.py
    turns: list[Turn] = field(default_factory=list)
    usage: dict = field(default_factory=dict)  # the trial's requests, errors and tokens (otbuild/usage.py)
    weight_version: int | None = None  # rollout: vllm: the optimizer step whose weights answered


def sequences(turns: list[Turn]) -> list[TokenSequence]:
    """Join turns whose prompt extends the previous prompt + completion; else start anew."""
    out: list[TokenSequence] = []
    for t in turns:
        cur = out[-1] if out else None
        if cur is not None and t.prompt_ids[:len(cur.ids)] == cur.ids:
            extra = t.prompt_ids[len(cur.ids):]
            cur.ids += extra + t.completion_ids
            cur.mask += [False] * len(extra) + [True] * len(t.completion_ids)
            cur.behaviour = None if cur.behaviour is None or t.logprobs is None else cur.behaviour + t.logprobs
        else:
            out.append(TokenSequence(list(t.prompt_ids) + list(t.completion_ids),
                                     [False] * len(t.prompt_ids) + [True] * len(t.completion_ids),
                                     behaviour=None if t.logprobs is None else list(t.logprobs)))
    return [s for s in out if any(s.mask)]


def token_logprobs(model, seqs: list[TokenSequence], temperature: float, pad_id: int):
    """log p(token | prefix) at each sequence's masked positions: a list of 1-D tensors."""
    import torch

    width = max(len(s.ids) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    tmask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, s in enumerate(seqs):
        ids[i, :len(s.ids)] = torch.tensor(s.ids)
        attn[i, :len(s.ids)] = 1
        tmask[i, :len(s.ids)] = torch.tensor(s.mask)
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


def sequence_logprob(model, tokenizer, messages: list[dict], answer: str) -> float:
    """log p(answer + end-of-turn | messages) under `model` (temperature 1): for tests/evals."""
    import torch

    policy = Policy(model, tokenizer, temperature=1.0, max_tokens=1, max_context=10**9)
    prompt = policy.prompt_ids(messages)
    ans = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    with torch.no_grad():
        lp = token_logprobs(model, [TokenSequence(prompt + ans, [False] * len(prompt) + [True] * len(ans))],
                            1.0, tokenizer.pad_token_id)
    return float(lp[0].sum())


# -- rollouts ---------------------------------------------------------------------------------
def read_tasks(path: Path) -> list[tuple[str, object]]:
    import pyarrow.parquet as pq

    from otbuild.tasks.taskdir import TaskDir

    t = pq.read_table(path, columns=["path", "task_binary", "task_id"]).to_pylist()
    return [(r["task_id"], TaskDir.unpack(r["path"], r["task_binary"])) for r in t]


def rollout_engine(cfg: RlSettings) -> str:
    """`rl.rollout` on this machine: `auto` is vllm where it is installed, else transformers."""
    from otbuild.engines import LLM, resolve_auto

    return resolve_auto(LLM(engine=cfg.rollout, model="policy", engine_args=cfg.vllm_args)).engine \
        if cfg.rollout == "auto" else cfg.rollout


def save_served_copy(policy: Policy, dest: Path) -> None:
    """The policy as vLLM serves it: its weights in one safetensors file, its config and
    tokenizer. Untied (the output embedding saved as its own `lm_head.weight`, the config saying
    so): vLLM 0.32 reloads a tied model's embedding in place but leaves its output head at the
    old weights, so a tied copy would serve weights no trainer ever had."""
    import torch
    from safetensors.torch import save_file

    dest.mkdir(parents=True, exist_ok=True)
    model = policy.model
    with torch.no_grad():
        state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
        if getattr(model.config, "tie_word_embeddings", False):
            state["lm_head.weight"] = model.get_input_embeddings().weight.detach().to("cpu").clone()
    tmp = dest / "model.safetensors.tmp"
    save_file(state, str(tmp), metadata={"format": "pt"})
    tmp.replace(dest / "model.safetensors")
    config = model.config.to_dict()
    config["tie_word_embeddings"] = False
    write_json(dest / "config.json", config)
    if not (dest / "tokenizer_config.json").exists():
        policy.tok.save_pretrained(dest)


class PolicyServer:
    """rollout: vllm. One `vllm serve` for the whole run, on a copy of the policy saved in
    `workroot/policy` (tensor/data parallel and the rest from `vllm_args`). `sync(policy,
    version)` before each step's rollouts moves the current weights into it: saved over the
    copy, then reloaded in place while generation is paused (`weight_sync: reload`, vLLM's
    collective RPC: otbuild/engines/vllm.py), or served by a new server (`restart`, and
    whenever the server is gone). Trials ask it through `client()`; `version` is the optimizer
    step whose weights it serves. It listens on no TCP port, as its development endpoints
    (/collective_rpc, /pause) take no API key: on a unix socket in a folder only this user may
    enter (`server.uds`), which its clients here talk over. It takes requests with this run's own
    key only, too (`VLLM_API_KEY`, in its environment, never on its command line), which vLLM
    checks on its /v1 routes alone (docs/security.md)."""

    def __init__(self, cfg: RlSettings, workroot: Path):
        import secrets

        from otbuild.engines import LLM
        from otbuild.engines.vllm import WEIGHT_SYNC_ENV

        self.key = secrets.token_urlsafe(32)
        self.cfg, self.dir = cfg, workroot / "policy"
        args = dict(cfg.vllm_args)
        # log-probs after temperature, as the trainer computes them (the behaviour policy's)
        self.llm = LLM(engine="vllm", model=str(self.dir), concurrency=cfg.concurrency,
                       engine_args={"served_model_name": "policy", "logprobs_mode": "processed_logprobs", **args,
                                    "env": {**args.get("env", {}), **WEIGHT_SYNC_ENV, "VLLM_API_KEY": self.key}})
        self.base_url: str | None = None
        self.server: ServerProcess | None = None
        self.version: int | None = None
        self.release: str | None = None

    def sync(self, policy: Policy, version: int) -> str:
        """Serve `policy`'s weights as `version`; how they got there: reload or start."""
        from otbuild.engines.managed import server_version
        from otbuild.engines.vllm import VLLMEngine, reload_weights

        save_served_copy(policy, self.dir)
        if self.server is not None and self.server.exit_code() is None and self.cfg.weight_sync == "reload":
            reload_weights(cast(str, self.base_url).removesuffix("/v1"), str(self.dir), key=self.key,
                           uds=self.server.uds)
            how = "reload"
        else:
            self.stop()
            self.base_url, self.server = VLLMEngine(self.llm)._launch(private=True)
            self.release = server_version(self.base_url.removesuffix("/v1"), self.server.uds)
            how = "start"
        self.version = version
        return how

    def client(self):
        """An engine over the live server for one event loop (a step's rollouts)."""
        from otbuild.engines.managed import ServerDiedError
        from otbuild.engines.openai import OpenAIEngine
        from otbuild.settings.engines import client_settings

        server = cast("ServerProcess", self.server)

        def alive() -> None:
            if (why := server.gone()) is not None:
                raise ServerDiedError(why)

        return OpenAIEngine(client_settings(self.llm), base_url=self.base_url, api_key=self.key, name="vllm",
                            provider="hosted_vllm", trust_env=False, alive=alive, uds=server.uds)

    @property
    def engine(self) -> str:
        """What serves the rollouts, as the step log names it: "vllm RELEASE"."""
        return f"vllm {self.release}" if self.release else "vllm"

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.server = self.base_url = None


async def served_rollout(policy: Policy, tasks, indices: list[int], k: int, cfg: RlSettings,
                         workroot: Path, run_id: str, server: PolicyServer) -> list[Trajectory]:
    """rollout: vllm: the step's trials against the live server (PolicyServer, synced already)."""
    client = server.client()
    try:
        trajs = await rollout(policy, tasks, indices, k, cfg, workroot, run_id, server=client)
    finally:
        await client.aclose()
    for t in trajs:
        t.weight_version = server.version
    return trajs


async def rollout(policy: Policy, tasks, indices: list[int], k: int, cfg: RlSettings,
                  workroot: Path, run_id: str, server=None) -> list[Trajectory]:
    from otbuild.harness.trial import TrialSettings, run_trial

    trial_settings = TrialSettings(cfg.sandbox, cfg.prompt)
    sem = asyncio.Semaphore(cfg.concurrency)

    async def one(pos: int, ti: int, s: int) -> Trajectory:
        task_id, task = tasks[ti]
        engine = policy.session(server)
        async with sem:
            row = await run_trial(task, task_id, engine, trial_settings, workroot / f"{pos}-{s}", sample_idx=s,
                                  run_id=run_id, source="rl")
        reward = row["reward"] if row["reward"] is not None else 0.0
        return Trajectory(ti, float(reward), row["exception"], outcome(row), engine.turns, usage.of_trial(row))

    jobs = [one(pos, ti, s) for pos, ti in enumerate(indices) for s in range(k)]
    return list(await asyncio.gather(*jobs))


# -- training ---------------------------------------------------------------------------------
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
    stats: dict[str, Any] = {"loss": 0.0, "clipped_tokens": 0, "kl": 0.0, "assistant_tokens": local_tokens,
             "active_sequences": len(active), "grad_norm": 0.0, "behaviour_gap": 0.0}
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
            loss, st = ppo_clip_loss(logp[None], old[None], adv[None], ones[None],
                                     clip_low=cfg.clip_low, clip_high=cfg.clip_high, n_tokens=n_tokens)
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


def make_engine(cfg: Rl, model_dir: Path, *, on_gpu: bool):
    """DeepSpeed over this rank's replica of the model in model_dir: (engine, its config).
    A step has as many micro-batches as its rollouts give, so the accumulation is unmanaged:
    backward() accumulates, step() reduces over the ranks and applies."""
    import deepspeed
    import torch
    import torch.distributed as dist

    from otbuild.train.dist import client_adamw, ds_config, uses_client_optimizer
    from otbuild.train.model import load_model

    world = dist.get_world_size()
    client_opt = uses_client_optimizer(cfg, on_gpu)
    conf = ds_config(cfg, global_batch=world, per_device=1, world_size=world, on_gpu=on_gpu,
                     client_optimizer=client_opt)
    conf["managed_gradient_accumulation"] = False
    if conf["zero_optimization"]["stage"] == 1:
        conf["zero_optimization"]["overlap_comm"] = False  # DeepSpeed: only stage 2 overlaps then
    model = load_model(model_dir, dtype=torch.bfloat16 if conf["bf16"]["enabled"] else torch.float32)
    opt = client_adamw(model.parameters(), cfg) if client_opt else None
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=conf,
                                           model_parameters=None if client_opt else model.parameters())
    return engine, conf


def train(cfg: RlSettings, inputs: list[Path], outdir: Path, *, log=print) -> dict:
    """RLOO on one process or on each of the ranks a launcher started (one per GPU): DeepSpeed
    data parallel, bf16 on GPU, each rank rolling out its share of the step's tasks."""
    import torch.distributed as dist

    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    t = RlTrainer(cfg, inputs, outdir, log)
    return run(t, outdir, log if dist.get_rank() == 0 else (lambda _: None))


class RlTrainer(Trainer):
    """RL's part of the loop (otbuild/train/loop.py): the policy under DeepSpeed, and a step of
    rollouts, advantages and one update."""

    kind = "rl"
    cfg: RlSettings
    log_every = 0  # a step takes minutes: a line each

    def __init__(self, cfg: RlSettings, inputs: list[Path], outdir: Path, log):
        import torch
        import torch.distributed as dist

        from otbuild.train.dist import init_distributed
        from otbuild.train.model import load_model, load_tokenizer

        on_gpu = torch.cuda.is_available()
        # a collective waits for the slowest rank's rollouts (agent timeouts are hours)
        init_distributed(on_gpu, timeout=timedelta(hours=24))
        self.rank, self.world = rank, world = dist.get_rank(), dist.get_world_size()
        self.rollout = rollout_engine(cfg)
        if self.rollout == "vllm" and world > 1:
            raise ConfigError(f"rl: rollout: vllm serves the policy from one trainer process, but {world} "
                              "were started; use gpus_per_node: 1 on one node, or rollout: transformers")
        self.cfg, self.outdir, self.total_steps = cfg, outdir, cfg.steps
        self.sft_dir = sft_dir = Path(inputs[0]).parent if Path(inputs[0]).is_file() else Path(inputs[0])
        self.tasks = read_tasks(Path(inputs[1]))
        if not self.tasks:
            raise ValueError("the task table is empty")
        self.engine, self.conf = engine, conf = make_engine(cfg, sft_dir, on_gpu=on_gpu)
        self.model = model = engine.module
        dtype = next(model.parameters()).dtype
        self.tok, self.template = load_tokenizer(sft_dir)
        self.ref = load_model(sft_dir, dtype=dtype).to(engine.device).eval() if cfg.kl_coef > 0 else None
        if rank == 0:
            log(f"rl: world {world}, zero {conf['zero_optimization']['stage']}, "
                f"{'bf16' if conf['bf16']['enabled'] else 'fp32'}, on {engine.device}")
        self.policy = Policy(model, self.tok, temperature=cfg.temperature, max_tokens=cfg.max_tokens,
                             max_context=cfg.max_context, name=str(sft_dir))
        self.workroot = Path(tempfile.mkdtemp(prefix="otbuild-rl-"))
        self.server = PolicyServer(cfg, self.workroot) if self.rollout == "vllm" else None
        self.ahead: dict = {}  # step -> the future of its rollouts, started early (max_staleness)
        self.pool: ThreadPoolExecutor | None = None

    def step(self, step: int) -> dict:
        import torch
        import torch.distributed as dist

        cfg, rank, world, k = self.cfg, self.rank, self.world, self.cfg.samples_per_task
        t0 = time.monotonic()
        torch.manual_seed(cfg.seed * 1_000_003 + step + rank * 7_919)
        random.seed(cfg.seed * 1_000_003 + step + rank * 7_919)
        mine = self._mine(step)
        if step in self.ahead:  # started while an earlier update ran, on older weights
            trajs, sync = self.ahead.pop(step).result()
        else:
            trajs, sync = self._rollouts(step, self.policy, step)
        t1 = time.monotonic()
        self._run_ahead(step)
        t2 = time.monotonic()
        seqs, groups_zero = [], 0
        masked = [t.outcome in EXCLUDED_FROM_SCORES for t in trajs]
        for g in range(len(mine)):
            group = trajs[g * k:(g + 1) * k]
            adv = masked_rloo_advantages([t.reward for t in group], masked[g * k:(g + 1) * k], cfg.std_eps)
            groups_zero += all(not a for a in adv)
            for t, a in zip(group, adv, strict=True):
                if a is None:  # masked: no sequences
                    continue
                for s in sequences(t.turns):
                    s.advantage, s.stale = a, t.weight_version is not None and t.weight_version < step
                    seqs.append(s)
        st = update(self.engine, seqs, cfg, self.tok.pad_token_id, self.ref)
        parts: list[Any] = [None] * world  # each rank's stats, gathered
        dist.all_gather_object(parts, {
            **st, "rewards": [t.reward for t in trajs], "sequences": len(seqs), "zero": groups_zero,
            "versions": [t.weight_version for t in trajs], "stale": sum(s.stale for s in seqs),
            "errors": sum(1 for t in trajs if t.error), "masked": sum(masked), "rollout_seconds": t1 - t0,
            **{f"rollout_{key}": sum(t.usage.get(key, 0) for t in trajs) for key in usage.KEYS}})
        rewards = [r for p in parts for r in p["rewards"]]
        total = {key: sum(p[key] for p in parts) for key in
                 ("loss", "kl", "clipped_tokens", "assistant_tokens", "sequences", "zero", "errors", "masked")}
        shutil.rmtree(self.workroot / f"step-{step}", ignore_errors=True)
        return {"step": step + 1, "reward_mean": sum(rewards) / len(rewards),
                "pass_rate": sum(r >= 1.0 for r in rewards) / len(rewards),
                "loss": total["loss"], "grad_norm": st["grad_norm"], "kl": total["kl"],
                "clipped_tokens": total["clipped_tokens"], "assistant_tokens": total["assistant_tokens"],
                "trajectories": len(rewards), "sequences": total["sequences"],
                "zero_advantage_tasks": total["zero"], "errors": total["errors"],
                "rollout_infra_masked": total["masked"],
                "lr": self.engine.get_lr()[0], "rollout_engine": self.server.engine if self.server else "transformers",
                **sync,
                "rollout_seconds": round(max(p["rollout_seconds"] for p in parts) - sync.get("sync_seconds", 0), 3),
                "update_seconds": round(time.monotonic() - t2, 3),
                "tokens_per_second": round(total["assistant_tokens"] / max(time.monotonic() - t0, 1e-9), 1),
                **{f"rollout_{key}": sum(p[f"rollout_{key}"] for p in parts) for key in usage.KEYS},
                **(self._staleness(step, parts) if cfg.max_staleness else {})}

    def _mine(self, step: int) -> list[int]:
        """This rank's tasks of `step`: whole tasks, so a task's k samples share a baseline."""
        indices = global_batch_rows(len(self.tasks), step, min(self.cfg.batch_size, len(self.tasks)), self.cfg.seed)
        return indices[self.rank::self.world]

    def _rollouts(self, step: int, policy: Policy, version: int) -> tuple[list[Trajectory], dict]:
        """`step`'s trials on `policy`, whose weights are those after `version` updates."""
        cfg, t0 = self.cfg, time.monotonic()
        work, run_id = self.workroot / f"step-{step}", f"{self.outdir.name}-{step}"
        if self.rollout != "vllm":
            trajs = asyncio.run(rollout(policy, self.tasks, self._mine(step), cfg.samples_per_task, cfg, work,
                                        run_id=run_id))
            for t in trajs:
                t.weight_version = version
            return trajs, {}
        sync = {}
        assert self.server is not None  # rollout: vllm (made in __init__)
        if self.server.version != version or self.server.server is None:  # this step's weights to the server
            sync = {"weight_sync": self.server.sync(policy, version), "sync_seconds": round(time.monotonic() - t0, 3)}
        trajs = asyncio.run(served_rollout(policy, self.tasks, self._mine(step), cfg.samples_per_task, cfg, work,
                                           run_id=run_id, server=self.server))
        return trajs, {**sync, "weight_versions": sorted({t.weight_version for t in trajs})}

    def _run_ahead(self, step: int) -> None:
        """With max_staleness, the next steps' rollouts start now, on the weights before this
        step's update (a copy of the policy; vLLM's server keeps serving them), and run while it
        trains. The server holds one version: with rollout: vllm, one step runs ahead."""
        ahead = min(self.cfg.max_staleness, 1 if self.rollout == "vllm" else self.cfg.max_staleness)
        todo = [j for j in range(step + 1, min(step + 1 + ahead, self.total_steps)) if j not in self.ahead]
        if not todo:
            return
        policy = self.policy
        if self.rollout == "vllm":
            assert self.server is not None  # made in __init__
            if self.server.version != step:  # the weights before the update, served
                self.server.sync(policy, step)
        else:  # a copy of the weights before the update, for the rollouts alone
            snapshot = type(self.model)(self.model.config).to(device=self.model.device, dtype=self.model.dtype)
            snapshot.load_state_dict(self.model.state_dict())
            policy = Policy(snapshot.eval(), self.tok, temperature=self.cfg.temperature, max_tokens=self.cfg.max_tokens,
                            max_context=self.cfg.max_context, name=self.policy.name)
        if self.pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self.pool = ThreadPoolExecutor(1, thread_name_prefix="otbuild-rl-ahead")
        for j in todo:
            self.ahead[j] = self.pool.submit(self._rollouts, j, policy, step)

    def _staleness(self, step: int, parts: list[dict]) -> dict:
        """What max_staleness did this step: the weight versions its trajectories came from, how
        many updates old the oldest was, the sequences corrected off-policy, and the largest gap
        between a sampled token's log-prob and the same weights' recomputed one."""
        versions = [v for p in parts for v in p["versions"] if v is not None]
        return {"weight_versions": sorted(set(versions)), "staleness": step - min(versions, default=step),
                "off_policy_sequences": sum(p["stale"] for p in parts),
                "behaviour_gap": round(max(p["behaviour_gap"] for p in parts), 6)}

    def note(self, rec: dict) -> str:
        return f"reward {rec['reward_mean']:.3f}, loss {rec['loss']:.4g}"

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
        if self.server is not None:
            self.server.stop()
        shutil.rmtree(self.workroot, ignore_errors=True)

    def weights(self):
        return self.model, self.tok, None

    def finish(self, outdir: Path) -> dict:
        last = [json.loads(x) for x in (outdir / LOG).read_text().splitlines()]
        return {"algorithm": "rloo", "base_checkpoint": str(self.sft_dir), "chat_template": self.template,
                "deepspeed": self.conf,
                "reward_mean_first": last[0]["reward_mean"] if last else None,
                "reward_mean_last": last[-1]["reward_mean"] if last else None}
