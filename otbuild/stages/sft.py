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
from otbuild.settings.train import Sft
from otbuild.span import Span
from otbuild.stagekit import TRAINING, DefaultRate, Inputs, StageDef, stage_run
from otbuild.stagekit.training import LOSS_KEYS, TRAIN_FILES, TRAINED, run_training

# The paper's SFT figure: about 160 GPU-hours per 10K traces of its 8B SFT (7 epochs, the
# otagent_v2_10k recipe's) on GH200. Expressed per trained token at an assumed trace length, it
# scales with the model's parameters (6N FLOPs per token) and the tokens trained on.
PAPER_SFT_GPU_HOURS, PAPER_SFT_TRACES, PAPER_SFT_EPOCHS, PAPER_SFT_PARAMS_B = 160.0, 10_000, 7, 8.0
TOKENS_PER_TRACE = 16_000  # assumed length of a paper trace (32K context, cut at cutoff_len)
SFT_GPU_S_PER_TOKEN_PER_B = (
    PAPER_SFT_GPU_HOURS * 3600 / (PAPER_SFT_TRACES * PAPER_SFT_EPOCHS * TOKENS_PER_TRACE * PAPER_SFT_PARAMS_B)
)
RATES = {
    "tokens_per_trace": DefaultRate(
        Span(TOKENS_PER_TRACE, 6_000, 32_768), "tokens", "a long agentic trace; capped at cutoff_len"
    ),
    "gpu_seconds_per_token": DefaultRate(
        Span(SFT_GPU_S_PER_TOKEN_PER_B, SFT_GPU_S_PER_TOKEN_PER_B * 0.75, SFT_GPU_S_PER_TOKEN_PER_B * 2.0),
        "GPU-s per token per B params",
        "the paper: ~160 GPU-hours per 10K-trace 8B SFT (7 epochs) on GH200, at "
        f"{TOKENS_PER_TRACE:,} tokens per trace; x0.75-2 for other GPUs (A100: ~2x)",
    ),
}


@stage_run
def run(cfg: SftSettings, inputs: Inputs, outdir: Path) -> dict:
    def here() -> dict:
        from otbuild.train.sft import train

        return train(cfg, inputs, outdir)

    return run_training("sft", cfg, inputs, outdir, here)


def estimate(m, n, e) -> None:
    """Traces x tokens per trace (at most cutoff_len) x epochs (or max_steps x batch), at the
    device-seconds per token a pilot measured (else the paper's figure), over the GPUs granted."""
    cfg = n.config
    traces = m.rows_in(n)
    per_trace = m.rate(e, n, "tokens_per_trace", cap=cfg.cutoff_len)
    per_epoch = (traces * per_trace).cap(cfg.token_budget)
    if cfg.max_steps is not None:
        trained = Span.of(cfg.max_steps * cfg.global_batch_size) * per_trace
    else:
        trained = per_epoch * cfg.epochs
    e.counts.update(traces=traces, tokens_per_epoch=per_epoch, tokens_to_train_on=trained)
    devices = max(m.grant(n.stage).gpus, 1)
    over = m.training_overhead(n, e, per_epoch)
    grant = m.job(e, n.stage, 1, over + trained * m.device_seconds_per_token(n, e) / devices)
    if grant.gpus == 0 and n.settings.get("model", {}).get("kind") == "pretrained":
        e.notes.append("the profile grants sft no GPU: its GPU-hours count 0 (pass --profile slurm)")
    m.rows[n.id] = Span.of(1)


STAGE = StageDef(
    "sft",
    3,
    TRAINED,
    __name__,
    SftSettings,
    plan="training",
    consumes=("traces",),
    produces="checkpoint",
    gpu=True,
    training=True,
    curve=LOSS_KEYS,
    volatile=TRAIN_FILES,
    counts={"traces": "data.traces", "tokens_to_train_on": "tokens_seen"},
    reported=(("train_log.jsonl", TRAINING),),
    recipe_field=(Sft | None, None),
    estimate=estimate,
    rates=RATES,
)
