"""SFT stage: inputs [kept.parquet of the trace filter] -> the checkpoint dir (otbuild/train/sft.py).

Outputs (in the artifact dir): checkpoint.json (manifest, written last: feeds downstream),
model.safetensors, train_log.jsonl, plus config.json, generation_config.json and the tokenizer
files. Locally the training runs in this process (DeepSpeed on gloo); on a Slurm allocation
or with several GPUs it is launched with `otbuild.train.dist.launch_command` (srun + torchrun,
one process per GPU), and this process waits for it. RL (otbuild/stages/rl.py) runs the same
way. A killed run resumes from outdir/checkpoints/; the traces are tokenized once, into
outdir/tokenized/ (otbuild/train/tokenized.py), which every rank and every resume reads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import cast

from otbuild.settings.stages import RlSettings, SftSettings
from otbuild.stages import Inputs, stage_run
from otbuild.train.dist import free_port, launch_command


@stage_run
def run(cfg: SftSettings, inputs: Inputs, outdir: Path) -> dict:
    return run_training("sft", cfg, inputs, outdir)


def run_training(kind: str, cfg: SftSettings | RlSettings, inputs: list[Path], outdir: Path) -> dict:
    """Train in this process, or launch one process per GPU that each read `cfg` back (the
    workers validate it into the same model: otbuild/train/__main__.py)."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    spec = outdir / f".{kind}_settings.json"
    spec.write_text(cfg.model_dump_json())
    argv = [sys.executable, "-m", "otbuild.train", kind, *map(str, inputs), "--outdir", str(outdir),
            "--settings", f"@{spec}"]
    cmd = launch_command(cfg, dict(os.environ), argv)
    if cmd == argv:
        # this process is the only rank: its own rendezvous port, never one inherited from a
        # parent (a test run, another job on the node) that may already be listening on it
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(free_port()))
        if kind == "sft":
            from otbuild.train.sft import train as train_sft

            manifest = train_sft(cast(SftSettings, cfg), inputs, outdir)
        else:
            from otbuild.train.rl.trainer import train as train_rl

            manifest = train_rl(cast(RlSettings, cfg), inputs, outdir)
    else:
        print("launching:", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        manifest = json.loads((outdir / "checkpoint.json").read_text())
    spec.unlink(missing_ok=True)
    keys = ("steps", "tokens_seen", "supervised_tokens_seen", "train_seconds", "world_size", "data",
            "reward_mean_last", "placement", "files")
    return {k: manifest[k] for k in keys if k in manifest}
