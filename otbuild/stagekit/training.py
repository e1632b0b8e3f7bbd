"""A training stage's job: train in this process, or launch one process per GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from otbuild.settings.stages import RlSettings, SftSettings
from otbuild.train.checkpoint import LOG, MANIFEST, VOLATILE_LOG_KEYS, VOLATILE_MANIFEST_KEYS
from otbuild.train.dist import free_port, launch_command

# what a training stage writes (checkpoint.json last: it feeds downstream), and the fields of its
# manifest and log that measure the run (`StageDef.volatile`)
TRAINED = ("checkpoint.json", "model.safetensors", "train_log.jsonl")
TRAIN_FILES = {MANIFEST: tuple(VOLATILE_MANIFEST_KEYS), LOG: tuple(VOLATILE_LOG_KEYS)}
# the log keys the report plots for a training stage, the first one logged (`StageDef.curve`)
LOSS_KEYS = ("loss", "policy_loss", "train_loss")
REWARD_KEYS = ("reward_mean", "reward", "mean_reward", "rewards/mean")


def run_training(
    kind: str, cfg: SftSettings | RlSettings, inputs: list[Path], outdir: Path, in_process: Callable[[], dict]
) -> dict:
    """Train in this process (`in_process()`: the manifest), or launch one process per GPU
    that each read `cfg` back (`python -m otbuild.train KIND`: the workers validate it into the
    same model, otbuild/train/__main__.py). Returns the manifest's figures for the record."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    spec = outdir / f".{kind}_settings.json"
    spec.write_text(cfg.model_dump_json())
    argv = [
        sys.executable,
        "-m",
        "otbuild.train",
        kind,
        *map(str, inputs),
        "--outdir",
        str(outdir),
        "--settings",
        f"@{spec}",
    ]
    cmd = launch_command(cfg, dict(os.environ), argv)
    if cmd == argv:
        # this process is the only rank: its own rendezvous port, never one inherited from a
        # parent (a test run, another job on the node) that may already be listening on it
        os.environ.update(
            RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port())
        )
        manifest = in_process()
    else:
        print("launching:", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        manifest = json.loads((outdir / "checkpoint.json").read_text())
    spec.unlink(missing_ok=True)
    keys = (
        "steps",
        "tokens_seen",
        "supervised_tokens_seen",
        "train_seconds",
        "world_size",
        "data",
        "reward_mean_last",
        "placement",
        "files",
    )
    return {k: manifest[k] for k in keys if k in manifest}
