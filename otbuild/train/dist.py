"""Distributed plumbing: world size, gradient accumulation, the DeepSpeed config, launchers.

Locally (no Slurm, at most one device) training runs in the calling process: otbuild sets the
env that torch.distributed needs (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and
DeepSpeed uses gloo on the CPU, nccl on a GPU. On a Slurm allocation the rule runs
`launch_command(cfg, env)`: one `srun` task per node, each a torchrun (or deepspeed)
launcher starting one process per GPU, all meeting at a c10d rendezvous on the first node of
the allocation's node list (SLURM_JOB_ID as the rendezvous id).
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from otbuild.errors import ConfigError
from otbuild.settings.train import Launch, Rl, Sft


class BatchSizeError(ConfigError):
    pass


def grad_accum_steps(global_batch: int, world_size: int, per_device: int) -> int:
    """global_batch = world_size x per_device x accumulation, or a clear error."""
    per_step = world_size * per_device
    if global_batch % per_step:
        lo = global_batch // per_step * per_step
        raise BatchSizeError(
            f"global_batch_size {global_batch} is not divisible by world_size {world_size} x "
            f"per_device_batch_size {per_device} = {per_step}; use a global batch of "
            f"{lo or per_step} or {lo + per_step}, or another per_device_batch_size"
        )
    return global_batch // per_step


def expand_hostlist(spec: str) -> list[str]:
    """Slurm's compressed host list ("gpu[01-03,07],login1") -> host names, in order."""
    hosts, parts, depth, cur = [], [], 0, ""
    for ch in spec:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    for part in filter(None, parts):
        m = re.fullmatch(r"([^\[]*)\[([^\]]+)\](.*)", part)
        if not m:
            hosts.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        for r in ranges.split(","):
            a, _, b = r.partition("-")
            for i in range(int(a), int(b or a) + 1):
                hosts.append(f"{prefix}{str(i).zfill(len(a))}{suffix}")
    return hosts


def slurm_hosts(env: dict) -> list[str]:
    """The allocation's nodes, in order. Snakemake's job wrapper drops SLURM_* but the job id
    before it runs a rule, so without SLURM_JOB_NODELIST the list comes from squeue."""
    spec = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not spec:
        spec = subprocess.run(
            ["squeue", "-h", "-j", env["SLURM_JOB_ID"], "-o", "%N"], capture_output=True, text=True, check=True
        ).stdout.strip()
    return expand_hostlist(spec)


def launch_command(cfg: Launch, env: dict, argv: list[str] | None = None) -> list[str]:
    """The command that runs `argv` (default: this training job's entry point) on the resources
    in `env`: one process per GPU across the Slurm allocation, or a single local process.

    On Slurm: one srun task per node, without a GPU option, so each task sees every GPU the job
    holds on its node (`--gres=gpu:MODEL:N` per node in the profile); its launcher starts
    `gpus_per_node` processes, default the node's SLURM_GPUS_ON_NODE, read on that node."""
    argv = argv or [sys.executable, "-m", "otbuild.train", "sft"]
    launcher, gpus, port = cfg.launcher, cfg.gpus_per_node, cfg.master_port
    in_job = "SLURM_JOB_ID" in env and "SLURM_STEP_ID" not in env  # a job step cannot start steps
    if in_job and launcher != "local":
        hosts = slurm_hosts(env)
        n = len(hosts)
        per_node = str(gpus) if gpus else "${SLURM_GPUS_ON_NODE:-1}"
        # --overlap: the rule itself already runs in the job's batch step
        srun = ["srun", "--overlap", f"--nodes={n}", f"--ntasks={n}", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
        if launcher == "deepspeed":
            # the deepspeed launcher's --no_ssh mode: one launcher per node, given its rank
            node = [
                "deepspeed",
                "--no_ssh",
                f"--num_nodes={n}",
                f"--num_gpus={per_node}",
                "--node_rank=$SLURM_NODEID",
                f"--master_addr={hosts[0]}",
                f"--master_port={port}",
                "--module",
                *map(shlex.quote, argv[2:]),
            ]
        else:
            node = [
                shlex.quote(argv[0]),
                "-m",
                "torch.distributed.run",
                f"--nnodes={n}",
                f"--nproc-per-node={per_node}",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint={hosts[0]}:{port}",
                f"--rdzv-id={env['SLURM_JOB_ID']}",
                *map(shlex.quote, argv[1:]),
            ]
        return srun + ["bash", "-c", " ".join(["exec", *node])]
    gpus = gpus or slurm_gpus_per_node(env)
    if launcher in ("torchrun", "auto") and (gpus or 0) > 1:
        return [argv[0], "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}", *argv[1:]]
    return argv


def slurm_gpus_per_node(env: Mapping[str, str]) -> int | None:
    for key in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE"):
        v = env.get(key)
        if v:
            m = re.search(r"(\d+)(?:\(|$)", v.split(",")[0])
            if m:
                return int(m.group(1))
    return None


def placement(device) -> dict:
    """Where this rank runs: its node, the GPUs Slurm gave the node, the device it trains on."""
    env = os.environ
    return {
        "rank": int(env.get("RANK", 0)),
        "local_rank": int(env.get("LOCAL_RANK", 0)),
        "node": env.get("SLURMD_NODENAME") or socket.gethostname(),
        "slurm_job_id": env.get("SLURM_JOB_ID"),
        "gpus_on_node": slurm_gpus_per_node(env),
        "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES"),
        "device": str(device),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# what a process of a torch.distributed group is told of it (ensure_single_process_env sets them
# in a process that trains in itself)
GROUP_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def outside_group(env: dict[str, str]) -> dict[str, str]:
    """`env` for a process that starts a group of its own: without this process's group (whose
    MASTER_PORT its store still listens on)."""
    return {k: v for k, v in env.items() if k not in GROUP_ENV}


def ensure_single_process_env() -> None:
    """What torch.distributed needs when otbuild is its own (only) process."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))


def init_distributed(on_gpu: bool, timeout: timedelta | None = None):
    """DeepSpeed's process group (gloo on the CPU, nccl on GPUs); idempotent. `timeout`: how
    long a collective waits for the slowest rank (default DeepSpeed's 30 minutes)."""
    ensure_single_process_env()
    import sys

    import deepspeed
    import deepspeed.comm.torch

    ds_torch_comm: Any = sys.modules["deepspeed.comm.torch"]  # patched below (DeepSpeed's, untyped)
    if not on_gpu and os.environ.get("OTBUILD_DS_SHM") != "1":
        # DeepSpeed's CPU accelerator JIT-compiles a shared-memory allreduce (~90 s, a C++
        # toolchain) on first use; gloo does the same job, so otbuild skips the build.
        ds_torch_comm.build_shm_op = lambda: None
    kw = {"timeout": timeout} if timeout else {}
    deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo", **kw)
    if on_gpu:  # this rank's GPU
        import torch

        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    return deepspeed


def uses_client_optimizer(cfg: Sft | Rl, on_gpu: bool) -> bool:
    """`optimizer: torch`, or `auto` on the CPU: a torch AdamW instead of DeepSpeed's (whose CPU
    build is a ~90 s JIT compile)."""
    return cfg.optimizer == "torch" or (cfg.optimizer == "auto" and not on_gpu)


def client_adamw(params, cfg: Sft | Rl):
    """The client optimizer: torch AdamW with the recipe's learning rate, betas, eps and decay."""
    import torch

    return torch.optim.AdamW(
        params, lr=cfg.learning_rate, betas=cfg.adam_betas, eps=cfg.adam_eps, weight_decay=cfg.weight_decay
    )


def ds_config(
    cfg: Sft | Rl, *, global_batch: int, per_device: int, world_size: int, on_gpu: bool, client_optimizer: bool
) -> dict:
    """DeepSpeed's config: `global_batch` sequences per optimizer step, `per_device` per micro
    batch, the rest (ZeRO stage, precision, clipping, AdamW) from the section."""
    accum = grad_accum_steps(global_batch, world_size, per_device)
    stage = cfg.zero_stage
    bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and on_gpu)
    zero: dict = {"stage": stage}
    if stage == 3:
        zero.update(
            {
                "overlap_comm": on_gpu,
                "contiguous_gradients": True,
                "reduce_bucket_size": 5e8,
                "stage3_prefetch_bucket_size": 5e8,
                "stage3_param_persistence_threshold": 1e6,
                "stage3_max_live_parameters": 1e9,
                "stage3_max_reuse_distance": 1e9,
                "stage3_gather_16bit_weights_on_model_save": True,
            }
        )
    elif stage in (1, 2):
        zero.update(
            {
                "overlap_comm": on_gpu,
                "contiguous_gradients": True,
                "reduce_bucket_size": 5e8,
                "allgather_bucket_size": 5e8,
            }
        )
    conf = {
        "train_batch_size": global_batch,
        "train_micro_batch_size_per_gpu": per_device,
        "gradient_accumulation_steps": accum,
        "gradient_clipping": cfg.max_grad_norm,
        "zero_optimization": zero,
        "bf16": {"enabled": bf16},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if client_optimizer:
        conf["zero_allow_untested_optimizer"] = True
    else:
        conf["optimizer"] = {
            "type": "AdamW",
            "params": {
                "lr": cfg.learning_rate,
                "betas": list(cfg.adam_betas),
                "eps": cfg.adam_eps,
                "weight_decay": cfg.weight_decay,
            },
        }
    return conf
