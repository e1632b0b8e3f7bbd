"""RL stage (RLOO): inputs [an SFT checkpoint's checkpoint.json, a task parquet] -> the
checkpoint dir (otbuild/train/rl.py). Outputs: checkpoint.json (manifest, written last: feeds
downstream), model.safetensors, train_log.jsonl (reward and loss per step), config.json,
tokenizer files. A killed run resumes from outdir/checkpoints/."""

from __future__ import annotations

from pathlib import Path

from otbuild import usage
from otbuild.settings.stages import RlSettings
from otbuild.stages.sft import run_training


def run(cfg: RlSettings, inputs: list[Path], outdir: Path) -> dict:
    stats = run_training("rl", cfg, inputs, outdir)
    # the rollouts' requests and tokens: the policy served by vLLM, or generating in process
    model = f"{cfg.rollout}:policy"
    return {**stats, "llm_usage": usage.of_log(Path(outdir) / "train_log.jsonl", model)}
