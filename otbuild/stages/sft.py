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

from pathlib import Path

from otbuild.settings.stages import SftSettings
from otbuild.stagekit import Inputs, stage_run
from otbuild.stagekit.training import run_training


@stage_run
def run(cfg: SftSettings, inputs: Inputs, outdir: Path) -> dict:
    def here() -> dict:
        from otbuild.train.sft import train

        return train(cfg, inputs, outdir)

    return run_training("sft", cfg, inputs, outdir, here)
