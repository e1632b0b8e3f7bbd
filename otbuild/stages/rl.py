"""RL stage (RLOO): inputs [an SFT checkpoint's checkpoint.json, a task parquet] -> the
checkpoint dir (otbuild/train/rl/). Outputs: checkpoint.json (manifest, written last: feeds
downstream), model.safetensors, train_log.jsonl (reward and loss per step), config.json,
tokenizer files. A killed run resumes from outdir/checkpoints/."""

from __future__ import annotations

from pathlib import Path

from otbuild import usage
from otbuild.settings.stages import RlSettings
from otbuild.stagekit import Inputs, stage_run
from otbuild.stagekit.training import run_training


@stage_run
def run(cfg: RlSettings, inputs: Inputs, outdir: Path) -> dict:
    if cfg.trainer == "skyrl":
        from otbuild.train.skyrl import train

        manifest = train(cfg, inputs, outdir)
        return {k: manifest[k] for k in ("steps", "world_size", "files", "skyrl")}

    def here() -> dict:
        from otbuild.train.rl.trainer import train

        return train(cfg, inputs, outdir)

    stats = run_training("rl", cfg, inputs, outdir, here)
    # the rollouts' requests and tokens: the policy served by vLLM, or generating in process
    # (rollout: auto is the one its steps name)
    log = Path(outdir) / "train_log.jsonl"
    engines = usage.rollout_engines(log)
    model = f"{rollout_engine_name(engines, cfg.rollout)}:policy"
    return {**stats, "rollout_engines": engines, "llm_usage": usage.of_log(log, model)}


def rollout_engine_name(engines: list[str], rollout: str) -> str:
    """The engine of the rollouts ("vllm 0.32.0" -> vllm), else the recipe's `rollout`."""
    return engines[-1].split()[0] if engines else rollout
