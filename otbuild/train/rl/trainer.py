"""The RL trainer: a step's rollouts through the harness (in process or on the policy server),
their advantages and one DeepSpeed update, in the loop SFT shares (otbuild/train/loop.py)."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from otbuild import usage
from otbuild.errors import ConfigError
from otbuild.settings.stages import RlSettings
from otbuild.settings.train import Rl
from otbuild.traces.outcome import EXCLUDED_FROM_SCORES, outcome
from otbuild.train.checkpoint import LOG
from otbuild.train.data import global_batch_rows
from otbuild.train.loop import Trainer, run
from otbuild.train.rl.loss import Turn, masked_rloo_advantages, sequences, update
from otbuild.train.rl.policy import Policy
from otbuild.train.rl.server import PolicyServer

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor


@dataclass
class Trajectory:
    task_index: int
    reward: float
    error: str | None
    outcome: str = ""  # otbuild/traces/outcome.py
    turns: list[Turn] = field(default_factory=list)
    usage: dict = field(default_factory=dict)  # the trial's requests, errors and tokens (otbuild/usage.py)
    weight_version: int | None = None  # rollout: vllm: the optimizer step whose weights answered
    prompt_mismatches: int = 0  # rollout: vllm: turns whose served prompt ids are not the trainer's render


def read_tasks(path: Path) -> list[tuple[str, object]]:
    import pyarrow.parquet as pq

    from otbuild.tasks.taskdir import TaskDir

    t = pq.read_table(path, columns=["path", "task_binary", "task_id"]).to_pylist()
    return [(r["task_id"], TaskDir.unpack(r["path"], r["task_binary"])) for r in t]


def rollout_engine(cfg: RlSettings) -> str:
    """`rl.rollout` on this machine: `auto` is vllm where it is installed, else transformers."""
    from otbuild.engines import LLM, resolve_auto

    return (
        resolve_auto(LLM(engine=cfg.rollout, model="policy", engine_args=cfg.vllm_args)).engine
        if cfg.rollout == "auto"
        else cfg.rollout
    )


@dataclass(frozen=True)
class StepTrials:
    """One step's trials on a rank: the task rows (`(task_id, TaskDir)`), the rows it runs (each
    `samples_per_task` times, a group that shares a baseline), the folder its trials work in and
    the run id their traces carry."""

    tasks: list
    indices: list[int]
    workroot: Path
    run_id: str


async def served_rollout(policy: Policy, trials: StepTrials, cfg: RlSettings, server: PolicyServer) -> list[Trajectory]:
    """rollout: vllm: the step's trials against the live server (PolicyServer, synced already)."""
    client = server.client()
    try:
        trajs = await rollout(policy, trials, cfg, server=client)
    finally:
        await client.aclose()
    for t in trajs:
        t.weight_version = server.version
    return trajs


async def rollout(policy: Policy, trials: StepTrials, cfg: RlSettings, server=None) -> list[Trajectory]:
    from otbuild.harness.config import TrialConfig
    from otbuild.harness.trial import run_trial

    trial_config = TrialConfig(cfg.sandbox, cfg.prompt, protocol=cfg.protocol)
    sem = asyncio.Semaphore(cfg.concurrency)

    async def one(pos: int, ti: int, s: int) -> Trajectory:
        task_id, task = trials.tasks[ti]
        engine = policy.session(server)
        async with sem:
            row = await run_trial(
                task,
                task_id,
                engine,
                trial_config,
                trials.workroot / f"{pos}-{s}",
                sample_idx=s,
                run_id=trials.run_id,
                source="rl",
            )
        reward = row["reward"] if row["reward"] is not None else 0.0
        return Trajectory(
            ti,
            float(reward),
            row["exception"],
            outcome(row),
            engine.turns,
            usage.of_trial(row),
            prompt_mismatches=getattr(engine, "prompt_mismatches", 0),
        )

    jobs = [one(pos, ti, s) for pos, ti in enumerate(trials.indices) for s in range(cfg.samples_per_task)]
    return list(await asyncio.gather(*jobs))


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
    conf = ds_config(
        cfg, global_batch=world, per_device=1, world_size=world, on_gpu=on_gpu, client_optimizer=client_opt
    )
    conf["managed_gradient_accumulation"] = False
    if conf["zero_optimization"]["stage"] == 1:
        conf["zero_optimization"]["overlap_comm"] = False  # DeepSpeed: only stage 2 overlaps then
    model = load_model(model_dir, dtype=torch.bfloat16 if conf["bf16"]["enabled"] else torch.float32)
    opt = client_adamw(model.parameters(), cfg) if client_opt else None
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=opt, config=conf, model_parameters=None if client_opt else model.parameters()
    )
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
            raise ConfigError(
                f"rl: rollout: vllm serves the policy from one trainer process, but {world} "
                "were started; use gpus_per_node: 1 on one node, or rollout: transformers"
            )
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
            log(
                f"rl: world {world}, zero {conf['zero_optimization']['stage']}, "
                f"{'bf16' if conf['bf16']['enabled'] else 'fp32'}, on {engine.device}"
            )
        self.policy = Policy(
            model,
            self.tok,
            temperature=cfg.temperature,
            max_tokens=cfg.max_tokens,
            max_context=cfg.max_context,
            name=str(sft_dir),
        )
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
            group = trajs[g * k : (g + 1) * k]
            adv = masked_rloo_advantages([t.reward for t in group], masked[g * k : (g + 1) * k], cfg.std_eps)
            groups_zero += all(not a for a in adv)
            for t, a in zip(group, adv, strict=True):
                if a is None:  # masked: no sequences
                    continue
                for s in sequences(t.turns):
                    s.advantage, s.stale = a, t.weight_version is not None and t.weight_version < step
                    seqs.append(s)
        st = update(self.engine, seqs, cfg, self.tok.pad_token_id, self.ref)
        parts: list[Any] = [None] * world  # each rank's stats, gathered
        dist.all_gather_object(
            parts,
            {
                **st,
                "rewards": [t.reward for t in trajs],
                "sequences": len(seqs),
                "zero": groups_zero,
                "versions": [t.weight_version for t in trajs],
                "stale": sum(s.stale for s in seqs),
                "errors": sum(1 for t in trajs if t.error),
                "masked": sum(masked),
                "prompt_mismatches": sum(t.prompt_mismatches for t in trajs),
                "rollout_seconds": t1 - t0,
                **{f"rollout_{key}": sum(t.usage.get(key, 0) for t in trajs) for key in usage.KEYS},
            },
        )
        rewards = [r for p in parts for r in p["rewards"]]
        total = {
            key: sum(p[key] for p in parts)
            for key in (
                "loss",
                "kl",
                "clipped_tokens",
                "assistant_tokens",
                "sequences",
                "zero",
                "errors",
                "masked",
                "prompt_mismatches",
            )
        }
        shutil.rmtree(self.workroot / f"step-{step}", ignore_errors=True)
        return {
            "step": step + 1,
            "reward_mean": sum(rewards) / len(rewards),
            "pass_rate": sum(r >= 1.0 for r in rewards) / len(rewards),
            "loss": total["loss"],
            "grad_norm": st["grad_norm"],
            "kl": total["kl"],
            "clipped_tokens": total["clipped_tokens"],
            "assistant_tokens": total["assistant_tokens"],
            "trajectories": len(rewards),
            "sequences": total["sequences"],
            "zero_advantage_tasks": total["zero"],
            "errors": total["errors"],
            "rollout_infra_masked": total["masked"],
            "lr": self.engine.get_lr()[0],
            "rollout_engine": self.server.engine if self.server else "transformers",
            **({"prompt_mismatch_turns": total["prompt_mismatches"]} if self.server else {}),
            **sync,
            "rollout_seconds": round(max(p["rollout_seconds"] for p in parts) - sync.get("sync_seconds", 0), 3),
            "update_seconds": round(time.monotonic() - t2, 3),
            "tokens_per_second": round(total["assistant_tokens"] / max(time.monotonic() - t0, 1e-9), 1),
            **{f"rollout_{key}": sum(p[f"rollout_{key}"] for p in parts) for key in usage.KEYS},
            **(self._staleness(step, parts) if cfg.max_staleness else {}),
        }

    def _mine(self, step: int) -> list[int]:
        """This rank's tasks of `step`: whole tasks, so a task's k samples share a baseline."""
        indices = global_batch_rows(len(self.tasks), step, min(self.cfg.batch_size, len(self.tasks)), self.cfg.seed)
        return indices[self.rank :: self.world]

    def _rollouts(self, step: int, policy: Policy, version: int) -> tuple[list[Trajectory], dict]:
        """`step`'s trials on `policy`, whose weights are those after `version` updates."""
        cfg, t0 = self.cfg, time.monotonic()
        trials = StepTrials(self.tasks, self._mine(step), self.workroot / f"step-{step}", f"{self.outdir.name}-{step}")
        if self.rollout != "vllm":
            trajs = asyncio.run(rollout(policy, trials, cfg))
            for t in trajs:
                t.weight_version = version
            return trajs, {}
        sync = {}
        assert self.server is not None  # rollout: vllm (made in __init__)
        if self.server.version != version or self.server.server is None:  # this step's weights to the server
            sync = {"weight_sync": self.server.sync(policy, version), "sync_seconds": round(time.monotonic() - t0, 3)}
        trajs = asyncio.run(served_rollout(policy, trials, cfg, self.server))
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
            policy = Policy(
                snapshot.eval(),
                self.tok,
                temperature=self.cfg.temperature,
                max_tokens=self.cfg.max_tokens,
                max_context=self.cfg.max_context,
                name=self.policy.name,
            )
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
        return {
            "weight_versions": sorted(set(versions)),
            "staleness": step - min(versions, default=step),
            "off_policy_sequences": sum(p["stale"] for p in parts),
            "behaviour_gap": round(max(p["behaviour_gap"] for p in parts), 6),
        }

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
        return {
            "algorithm": "rloo",
            "base_checkpoint": str(self.sft_dir),
            "chat_template": self.template,
            "deepspeed": self.conf,
            "reward_mean_first": last[0]["reward_mean"] if last else None,
            "reward_mean_last": last[-1]["reward_mean"] if last else None,
        }
