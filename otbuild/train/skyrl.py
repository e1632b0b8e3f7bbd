"""`rl.trainer: skyrl`: the RL stage handed to SkyRL (its fully async trainer on Ray, trials in
Harbor), for runs one node cannot hold. docs/training.md, "RL through SkyRL", has the mapping.

The handoff, under `workdir`:
  tasks/          the task table as Harbor task dirs (what SkyRL's HarborTaskDataset reads)
  skyrl.yaml      SkyRL's config from the recipe's `rl` section, nested as SkyRL's dataclasses
  command.sh      SkyRL's Harbor entry point with that config as its `key=value` overrides
The stage runs the command inside the job's GPU allocation, then turns SkyRL's last HF export
(`trainer.export_path/global_step_N/policy`) into the stage's artifact: weights, tokenizer and
checkpoint.json (written last), as otbuild's own trainer lays it out.
tests/contracts/test_skyrl.py checks the handoff with the pinned SkyRL's own code.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from otbuild.artifact import top_files
from otbuild.errors import StageError
from otbuild.fsio import atomic_path, write_json
from otbuild.hashing import file_sha256
from otbuild.settings.train import Rl
from otbuild.tasks.export import export_tasks
from otbuild.tasks.redact import Redactor
from otbuild.train.checkpoint import MANIFEST

# SkyRL's Harbor entry point (fully async trainer), a module of its source tree's examples/
ENTRYPOINT = "examples.train_integrations.harbor.entrypoints.main_harbor_fully_async"
REPO = Path(__file__).resolve().parents[2]
# where `make skyrl-env` puts the pinned SkyRL and its Harbor integration (CPU only: the
# contract test's); a GPU cluster's own install is named by OTBUILD_SKYRL_PYTHON / _SRC
DEFAULT_PYTHON = REPO / ".venv-skyrl" / "bin" / "python"
DEFAULT_SRC = REPO / ".venv-skyrl" / "skyrl-src"
# OT-Agent's fully async setting (hpc/skyrl_yaml/ALCC_ZIH/24GPU_base.yaml) and SkyRL's default
# generation workers, capped by its rule: mini batch <= workers <= mini batch x (staleness + 1)
GENERATION_WORKERS = 768


def placement(gpus_per_node: int, nodes: int) -> dict[str, int]:
    """The allocation split as OT-Agent splits 24 GPUs (6 nodes x 4): a third, in whole nodes
    where it spans nodes, trains the policy; the rest serve it (one vLLM engine per GPU)."""
    total = gpus_per_node * nodes
    if total < 2:
        raise ValueError(f"rl.trainer: skyrl trains and serves on separate GPUs: {total} GPU(s) is too few")
    policy = max(1, total // 3)
    if policy > gpus_per_node:
        policy -= policy % gpus_per_node
    return {
        "policy_num_nodes": max(1, policy // gpus_per_node),
        "policy_num_gpus_per_node": min(policy, gpus_per_node),
        "engines": total - policy,
    }


def overrides(
    rl: Rl, *, model: str, tasks_dir: Path, n_tasks: int, workdir: Path, gpus_per_node: int, nodes: int
) -> dict[str, Any]:
    """SkyRL's config for `rl` as dot keys (SkyRL 0.3.0's HarborSkyRLConfig), in table order."""
    place = placement(gpus_per_node, nodes)
    batch = min(rl.batch_size, n_tasks)  # as otbuild's trainer: a step takes at most every task
    staleness = rl.skyrl.max_staleness_steps
    logger = "wandb" if rl.tracking.wandb else "tensorboard" if rl.tracking.tensorboard else "console"
    agent_kwargs = "harbor_trial_config.agent.kwargs"
    o: dict[str, Any] = {
        "data.train_data": [str(tasks_dir)],
        "data.val_data": [],
        "trainer.policy.model.path": model,
        "generator.inference_engine.served_model_name": "policy",
        # algorithm: RLOO, PPO clip, token-mean loss, KL only when kl_coef > 0
        "trainer.algorithm.advantage_estimator": "rloo",
        "trainer.algorithm.eps_clip_low": rl.clip_low,
        "trainer.algorithm.eps_clip_high": rl.clip_high,
        "trainer.algorithm.use_kl_loss": rl.kl_coef > 0,
        "trainer.algorithm.kl_loss_coef": rl.kl_coef,
        "trainer.algorithm.kl_estimator_type": "k3",
        "trainer.algorithm.loss_reduction": "token_mean",
        "trainer.algorithm.max_seq_len": rl.max_context,
        "trainer.update_epochs_per_batch": rl.ppo_epochs,
        # steps and batches
        "trainer.max_training_steps": rl.steps,
        "trainer.epochs": max(1, math.ceil(rl.steps * batch / n_tasks)),
        "trainer.train_batch_size": batch,
        "trainer.policy_mini_batch_size": batch,
        "generator.n_samples_per_prompt": rl.samples_per_task,
        # optimizer
        "trainer.policy.optimizer_config.lr": rl.learning_rate,
        "trainer.policy.optimizer_config.adam_betas": list(rl.adam_betas),
        "trainer.policy.optimizer_config.weight_decay": rl.weight_decay,
        "trainer.policy.optimizer_config.max_grad_norm": rl.max_grad_norm,
        "trainer.seed": rl.seed,
        "trainer.bf16": rl.precision != "fp32",
        # sampling and context
        "generator.sampling_params.temperature": rl.temperature,
        "generator.sampling_params.max_generate_length": rl.max_tokens,
        "trainer.max_prompt_length": rl.max_context,
        "generator.inference_engine.engine_init_kwargs.max_model_len": rl.max_context,
        "generator.step_wise_trajectories": True,
        "generator.merge_stepwise_output": True,
        # fully async on FSDP, policy and inference on separate GPUs
        "trainer.strategy": "fsdp",
        "trainer.fully_async.enabled": True,
        "trainer.fully_async.max_staleness_steps": staleness,
        "trainer.fully_async.num_parallel_generation_workers": min(GENERATION_WORKERS, batch * (staleness + 1)),
        "trainer.placement.colocate_all": False,
        "trainer.placement.policy_num_nodes": place["policy_num_nodes"],
        "trainer.placement.policy_num_gpus_per_node": place["policy_num_gpus_per_node"],
        "trainer.placement.ref_num_nodes": place["policy_num_nodes"],
        "trainer.placement.ref_num_gpus_per_node": place["policy_num_gpus_per_node"],
        "generator.inference_engine.num_engines": place["engines"],
        "generator.inference_engine.tensor_parallel_size": 1,
        # trials: Harbor's terminus-2 in the recipe's environment, at most `concurrency` at once
        "generator.rate_limit.enabled": True,
        "generator.rate_limit.max_concurrency": rl.concurrency,
        "harbor_trial_config.trials_dir": str(workdir / "trials"),
        "harbor_trial_config.environment.type": rl.skyrl.environment,
        "harbor_trial_config.agent.name": "terminus-2",
        f"{agent_kwargs}.max_turns": rl.sandbox.max_episodes,
        f"{agent_kwargs}.temperature": rl.temperature,
        f"{agent_kwargs}.model_info.max_input_tokens": rl.max_context,
        f"{agent_kwargs}.model_info.max_output_tokens": rl.max_tokens,
        "harbor_trial_config.timeout_multiplier": rl.sandbox.timeout_multiplier,
        # outputs: a resumable checkpoint every save_steps, the HF export at the end
        "trainer.ckpt_path": str(workdir / "ckpts"),
        "trainer.export_path": str(workdir / "exports"),
        "trainer.log_path": str(workdir / "logs"),
        "trainer.ckpt_interval": rl.save_steps,
        "trainer.resume_mode": "latest",
        "trainer.hf_save_interval": rl.steps,
        "trainer.eval_interval": -1,
        "trainer.eval_before_train": False,
        "trainer.logger": logger,
        "trainer.project_name": "otbuild",
        "trainer.run_name": workdir.parent.name or "rl",
    }
    if rl.sandbox.agent_timeout_sec is not None:
        o["harbor_trial_config.agent.override_timeout_sec"] = rl.sandbox.agent_timeout_sec
    o.update(rl.skyrl.overrides)
    return o


def cli_value(v: Any) -> str:
    """One override's value as SkyRL's command line takes it (OmegaConf's CLI grammar)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, list | tuple):
        return "[" + ",".join(f"'{x}'" if isinstance(x, str) else cli_value(x) for x in v) + "]"
    return str(v)


def cli_args(o: dict[str, Any]) -> list[str]:
    return [f"{k}={cli_value(v)}" for k, v in o.items()]


def shell_lines(command: list[str]) -> str:
    """The command for a shell: `python -m MODULE` on the first line, an override a line."""
    q = [shlex.quote(a) for a in command]
    return " \\\n  ".join([" ".join(q[:3]), *q[3:]])


def nested(o: dict[str, Any]) -> dict:
    """Dot keys as the nested mapping SkyRL's config mirrors (skyrl.yaml)."""
    out: dict = {}
    for key, v in o.items():
        *parents, leaf = key.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v
    return out


def notes(rl: Rl, batch: int) -> list[str]:
    """What otbuild's RL does that the handoff does not carry over (skyrl.yaml's header)."""
    out = [
        "SkyRL's rloo: leave-one-out mean baseline, no per-task std normalisation (otbuild's std_eps unused)",
        (
            "trials run by Harbor in SkyRL (rl.sandbox's max_episodes, timeout_multiplier and agent_timeout_sec "
            "carry over; its local sandbox and limits do not)"
        ),
        "a failed trial masks its task's group in that step (SkyRL's Harbor generator: reward 0, no loss)",
    ]
    if batch < rl.batch_size:
        out.append(f"train_batch_size {batch}: the task table has fewer tasks than rl.batch_size {rl.batch_size}")
    return out


def write_handoff(
    rl: Rl,
    tasks: Path,
    model: str,
    workdir: Path,
    gpus_per_node: int,
    nodes: int,
    *,
    python: str = "python",
    header: str = "",
) -> dict:
    """The task set, skyrl.yaml and command.sh under `workdir`; returns {"tasks", "args", "command", ...}."""
    workdir = Path(workdir).resolve()
    tasks_dir = workdir / "tasks"
    if tasks_dir.exists():
        shutil.rmtree(tasks_dir)
    redactor = Redactor()
    n = export_tasks(Path(tasks), tasks_dir, redactor)
    if not n:
        raise ValueError(f"{tasks}: the task table is empty")
    o = overrides(
        rl, model=model, tasks_dir=tasks_dir, n_tasks=n, workdir=workdir, gpus_per_node=gpus_per_node, nodes=nodes
    )
    args = cli_args(o)
    command = [python, "-m", ENTRYPOINT, *args]
    text = "".join(f"# {line}\n" for line in [*header.splitlines(), *notes(rl, o["trainer.train_batch_size"])])
    with atomic_path(workdir / "skyrl.yaml") as tmp:
        tmp.write_text(text + yaml.safe_dump(nested(o), sort_keys=False))
    script = (
        "#!/usr/bin/env bash\n# SkyRL's Harbor entry point, run from a SkyRL source tree (its examples/ "
        "at the pinned release's tag)\nset -euo pipefail\n" + shell_lines(command) + "\n"
    )
    with atomic_path(workdir / "command.sh") as tmp:
        tmp.write_text(script)
    os.chmod(workdir / "command.sh", 0o755)
    return {
        "tasks": n,
        "tasks_dir": str(tasks_dir),
        "overrides": o,
        "args": args,
        "command": command,
        "yaml": str(workdir / "skyrl.yaml"),
        "redacted": redactor.found(),
    }


def missing(python: str, src: Path) -> list[str]:
    """What a SkyRL run lacks here: the source tree, its python, and, in that python, Ray,
    vLLM and a CUDA GPU."""
    gaps = []
    if not (src / ENTRYPOINT.replace(".", "/")).with_suffix(".py").is_file():
        gaps.append(f"SkyRL's Harbor entry point under {src} (set OTBUILD_SKYRL_SRC to a SkyRL checkout)")
    if not shutil.which(python) and not Path(python).is_file():
        return [*gaps, f"SkyRL's python {python} (set OTBUILD_SKYRL_PYTHON)"]
    probe = (
        "import importlib.util as u, sys\n"
        "gaps = [m for m in ('skyrl', 'ray', 'vllm', 'harbor') if u.find_spec(m) is None]\n"
        "import torch\n"
        "gaps += [] if torch.cuda.is_available() else ['a CUDA GPU (torch.cuda.is_available() is False)']\n"
        "print('\\n'.join(gaps))"
    )
    proc = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=False)
    if proc.returncode:
        return [*gaps, f"a working torch in {python}: {proc.stderr.strip().splitlines()[-1:]}"]
    return gaps + [f"{g} in {python}" for g in proc.stdout.split("\n") if g]


def allocation(env: dict) -> tuple[int, int]:
    """(GPUs per node, nodes) of the job: Slurm's, else the GPUs this node shows."""
    from otbuild.train.dist import slurm_gpus_per_node

    gpus = slurm_gpus_per_node(env)
    if gpus is None:
        proc = (
            subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
            if shutil.which("nvidia-smi")
            else None
        )
        gpus = len(proc.stdout.splitlines()) if proc and proc.returncode == 0 else 0
    return gpus, int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 1)


def final_export(workdir: Path) -> Path:
    steps = [
        (int(m.group(1)), p)
        for p in (workdir / "exports").glob("global_step_*")
        if (m := re.fullmatch(r"global_step_(\d+)", p.name)) and (p / "policy").is_dir()
    ]
    if not steps:
        raise StageError(f"rl.trainer: skyrl: SkyRL wrote no HF export under {workdir / 'exports'}")
    return max(steps)[1] / "policy"


def artifact(workdir: Path, outdir: Path, manifest: dict) -> dict:
    """SkyRL's last export as the stage's checkpoint dir: its files at the top, checkpoint.json last."""
    policy = final_export(workdir)
    for f in policy.iterdir():
        if f.is_file():
            shutil.copy2(f, outdir / f.name)
    step = int(policy.parent.name.removeprefix("global_step_"))
    manifest = {"kind": "rl", "trainer": "skyrl", **manifest, "steps": step, "skyrl_export": str(policy)}
    manifest["files"] = {p.name: file_sha256(p) for p in top_files(outdir) if p.name != MANIFEST}
    write_json(outdir / MANIFEST, manifest)
    return manifest


def train(rl: Rl, inputs: list[Path], outdir: Path, log=print) -> dict:
    """Run SkyRL in the job and write the artifact; fails, naming what is missing, where it cannot run."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    python = os.environ.get("OTBUILD_SKYRL_PYTHON", str(DEFAULT_PYTHON))
    src = Path(os.environ.get("OTBUILD_SKYRL_SRC", str(DEFAULT_SRC)))
    if gaps := missing(python, src):
        raise StageError("rl.trainer: skyrl runs SkyRL on GPUs with Ray; missing here: " + "; ".join(gaps))
    gpus, nodes = allocation(dict(os.environ))
    if nodes > 1 and not os.environ.get("RAY_ADDRESS"):
        raise StageError(f"rl.trainer: skyrl on {nodes} nodes needs a Ray cluster across them (RAY_ADDRESS unset)")
    sft_dir = Path(inputs[0]).parent if Path(inputs[0]).is_file() else Path(inputs[0])
    workdir = outdir / "skyrl"
    try:
        h = write_handoff(rl, Path(inputs[1]), str(sft_dir.resolve()), workdir, gpus, nodes, python=python)
    except ValueError as e:
        raise StageError(str(e)) from None
    log("rl: SkyRL: " + " ".join(shlex.quote(a) for a in h["command"]))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    proc = subprocess.run(h["command"], cwd=src, env=env, check=False)
    if proc.returncode:
        raise StageError(f"rl.trainer: skyrl: SkyRL exited with {proc.returncode} (logs: {workdir / 'logs'})")
    version = subprocess.run(
        [python, "-c", "from importlib.metadata import version; print(version('skyrl'))"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return artifact(
        workdir,
        outdir,
        {
            "algorithm": "rloo",
            "skyrl": version,
            "base_checkpoint": str(sft_dir),
            "world_size": gpus * nodes,
            "config": h["yaml"],
        },
    )
