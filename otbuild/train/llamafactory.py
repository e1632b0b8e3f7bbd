"""A LLaMA-Factory handoff: a recipe's trace set and SFT settings as a folder a lab trains from
on its own cluster with `llamafactory-cli train`.

The folder holds the sharegpt data and its `dataset_info.json` (otbuild/train/export.py), the
DeepSpeed config of the recipe's ZeRO stage, and `train_NAME.yaml`: the recipe's `sft` settings
under LLaMA-Factory's argument names. The data and DeepSpeed paths in the YAML are relative to
the folder (run it from there); a local model dir is written absolute, an HF id as it is.
LLaMA-Factory's template follows `sft.model.chat_template` (otbuild/train/export.py), its
`neat_packing` otbuild's `packing` (traces in a row attend only to themselves);
tests/contracts/test_llamafactory.py loads the folder with LLaMA-Factory's own code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from otbuild.fsio import atomic_path, write_json
from otbuild.settings.train import Sft
from otbuild.train.export import export_llamafactory, export_template, llamafactory_template

# The DeepSpeed config LLaMA-Factory's examples ship (examples/deepspeed/ds_zN_config.json):
# "auto" values are filled in by the trainer from the YAML's batch and precision settings.
_AUTO = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "zero_allow_untested_optimizer": True,
    "bf16": {"enabled": "auto"},
}
_ZERO = {
    2: {
        "stage": 2,
        "allgather_partitions": True,
        "allgather_bucket_size": 5e8,
        "overlap_comm": False,
        "reduce_scatter": True,
        "reduce_bucket_size": 5e8,
        "contiguous_gradients": True,
        "round_robin_gradients": True,
    },
    3: {
        "stage": 3,
        "overlap_comm": False,
        "contiguous_gradients": True,
        "sub_group_size": 1e9,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
        "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e9,
        "stage3_gather_16bit_weights_on_model_save": True,
    },
}


def deepspeed_config(stage: int) -> dict | None:
    """ZeRO stage 1 runs as 2 (LLaMA-Factory ships no stage-1 config); 0: plain data parallel."""
    return {**_AUTO, "zero_optimization": _ZERO[max(stage, 2)]} if stage else None


# OpenThoughts-Agent's speed settings (sft/lf_configs/qwen3/*.yaml: `enable_liger_kernel: true`,
# `attn: fa2`): options of the export, each needing its package (liger-kernel, flash-attn) on the
# lab's cluster. They change speed, not the objective. Its third, `optim: adamw_torch_fused`,
# is what `sft.optimizer: auto` exports (below).
SPEED: dict[str, dict[str, Any]] = {"liger-kernel": {"enable_liger_kernel": True}, "flash-attn": {"flash_attn": "fa2"}}
# sft.optimizer -> transformers' `optim`: otbuild's auto and deepspeed are a fused AdamW on GPU
# (DeepSpeed's), torch is torch's AdamW
OPTIMIZERS = {"auto": "adamw_torch_fused", "deepspeed": "adamw_torch_fused", "torch": "adamw_torch"}
# otbuild's schedules (otbuild/train/sft.py lr_lambda: linear warmup, then ...) by transformers' names
SCHEDULERS = {"cosine": "cosine", "linear": "linear", "constant": "constant_with_warmup"}


# what the export changed for LLaMA-Factory (its stats), noted in the YAML's header
MENDED = {
    "merged_turns": "turn(s) joined to the turn before them, both prompt or both answer (LLaMA-Factory drops a "
    "conversation whose turns do not alternate)",
    "trailing_turns_dropped": "turn(s) after a conversation's last answer left out (LLaMA-Factory drops a "
    "conversation that does not end with one; otbuild trains nothing there)",
    "dropped": "conversation(s) left out: no answer, or an answer first",
    "turns_without_reasoning": "answer(s) without reasoning: LLaMA-Factory's qwen3 template trains an empty "
    "<think> block before each (otbuild's qwen3_thinking does not)",
    "tool_arguments_not_json": "conversation(s) left out: a tool call's arguments are not a JSON object "
    "(otbuild's SFT drops them too)",
    "tools_without_system": "conversation(s) offered tools without a system message: LLaMA-Factory's qwen3 "
    "templates open the system turn with two newlines before `# Tools` (Qwen3's with `# Tools`; prompt tokens)",
}


def training_args(sft: Sft, dataset: str, gpus: int, model: str, speed: tuple[str, ...] = ()) -> dict:
    """The recipe's `sft` section as LLaMA-Factory training arguments, for `gpus`
    GPUs in all. The global batch is kept: gradient_accumulation = global / (gpus x per-device).
    `speed`: names of SPEED to apply."""
    per_step = gpus * sft.per_device_batch_size
    if sft.global_batch_size % per_step:
        raise ValueError(
            f"sft.global_batch_size {sft.global_batch_size} is not a multiple of {gpus} GPUs x "
            f"per_device_batch_size {sft.per_device_batch_size}: choose --gpus to divide it"
        )
    args = {
        "model_name_or_path": model,
        "trust_remote_code": True,
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "full",
        **({"deepspeed": f"ds_z{max(sft.zero_stage, 2)}_config.json"} if sft.zero_stage else {}),
        "dataset": dataset,
        "dataset_dir": ".",
        "template": llamafactory_template(sft.model.chat_template),
        # LLaMA-Factory packs into rows of cutoff_len - 1 (hparams/data_args.py): one more keeps otbuild's rows
        "cutoff_len": sft.cutoff_len + sft.packing,
        "train_on_prompt": sft.train_on_prompt,
        "packing": sft.packing,
        "neat_packing": sft.packing,
        "overwrite_cache": True,
        "output_dir": f"saves/{dataset}",
        "logging_steps": 1,
        "save_steps": sft.save_steps,
        "save_total_limit": sft.save_total_limit,
        "plot_loss": True,
        "report_to": report_to(sft),
        "per_device_train_batch_size": sft.per_device_batch_size,
        "gradient_accumulation_steps": sft.global_batch_size // per_step,
        "learning_rate": sft.learning_rate,
        "num_train_epochs": float(sft.epochs),
        "lr_scheduler_type": SCHEDULERS[sft.lr_scheduler],
        "warmup_ratio": sft.warmup_ratio,
        "optim": OPTIMIZERS[sft.optimizer],
        "max_grad_norm": sft.max_grad_norm,
        "adam_beta1": sft.adam_betas[0],
        "adam_beta2": sft.adam_betas[1],
        "adam_epsilon": sft.adam_eps,
        "weight_decay": sft.weight_decay,
        "seed": sft.seed,
        "bf16": sft.precision != "fp32",
        "disable_gradient_checkpointing": not sft.gradient_checkpointing,
    }
    if sft.max_steps is not None:
        args["max_steps"] = sft.max_steps
    for name in speed:
        args.update(SPEED[name])
    return args


def model_path(model: str) -> str:
    """A model dir that exists here, absolute (the YAML runs from its own folder); else an HF id."""
    path = Path(model).expanduser()
    return str(path.resolve()) if path.exists() else model


def report_to(sft: Sft) -> list[str] | str:
    """The recipe's `tracking` as the trainer's `report_to` (its wandb project: an env var, below)."""
    return [k for k in ("tensorboard", "wandb") if getattr(sft.tracking, k)] or "none"


def write_handoff(
    traces: list[Path],
    outdir: Path,
    sft: Sft,
    model: str,
    gpus: int,
    *,
    name: str = "otbuild_sft",
    header: str = "",
    speed: tuple[str, ...] = (),
) -> dict:
    """Data, dataset_info.json, DeepSpeed config and training YAML under `outdir`. `sft`: the
    stage's settings (its `prompt`, when it has one, is the style the traces are exported in)."""
    outdir = Path(outdir)
    # a bad --gpus fails before anything is written
    args = training_args(sft, name, gpus, model_path(model), speed)
    stats = export_llamafactory(
        traces,
        outdir,
        name,
        chat_template=sft.model.chat_template,
        **({"prompt": sft.prompt} if hasattr(sft, "prompt") else {}),
    )
    if ds := deepspeed_config(sft.zero_stage):
        write_json(outdir / args["deepspeed"], ds)
    notes = (
        [f"otbuild's token_budget has no LLaMA-Factory counterpart and is not applied: {sft.token_budget}"]
        if sft.token_budget is not None
        else []
    )
    if sft.truncation == "drop":
        notes.append("otbuild drops traces longer than cutoff_len; LLaMA-Factory truncates them")
    else:
        notes.append(
            "LLaMA-Factory truncates a trace over cutoff_len turn by turn (the last turn kept is cut, "
            "its prompt and answer in proportion); otbuild keeps its first cutoff_len tokens"
        )
    if sft.packing:
        notes.append(f"cutoff_len is otbuild's {sft.cutoff_len} + 1: LLaMA-Factory packs rows of cutoff_len - 1")
    if sft.model.chat_template == "auto":
        notes.append(f"sft.model.chat_template auto: exported as {export_template('auto')} (reasoning kept)")
    for key, text in MENDED.items():
        if n := stats[key]:
            notes.append(f"{n} {text}")
    if sft.copy_loss_weight:
        notes.append("otbuild's copy_loss_weight (an auxiliary objective for tiny students) is not applied")
    if wb := sft.tracking.wandb:
        env = {
            "WANDB_PROJECT": wb.project,
            "WANDB_ENTITY": wb.entity,
            "WANDB_MODE": wb.mode,
            "WANDB_DIR": wb.dir,
            "WANDB_NAME": wb.name,
        }
        notes.append("wandb (sft.tracking.wandb): export " + " ".join(f"{k}={v}" for k, v in env.items() if v))
    text = "".join(f"# {line}\n" for line in [*header.splitlines(), *notes])
    text += f"# run from this folder on {gpus} GPU(s): FORCE_TORCHRUN=1 llamafactory-cli train train_{name}.yaml\n"
    yaml_path = outdir / f"train_{name}.yaml"
    with atomic_path(yaml_path) as tmp:
        tmp.write_text(text + yaml.safe_dump(args, sort_keys=False))
    return {**stats, "yaml": str(yaml_path)}
