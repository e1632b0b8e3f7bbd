"""`otbuild export llamafactory`: a recipe's filtered traces and SFT settings as a folder that
LLaMA-Factory trains from (data, dataset_info.json, DeepSpeed config, training YAML)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

from otbuild.cli import main
from otbuild.plan import plan_recipe
from otbuild.recipe.load import load_recipe
from otbuild.runner import run_spec
from otbuild.train.toy import trace_rows

# LLaMA-Factory's training argument names, as its docs and sources list them (hiyouga/LLaMA-Factory:
# examples/train_full/*_full_sft.yaml; src/llamafactory/hparams/model_args.py, data_args.py,
# finetuning_args.py; and the HF Seq2SeqTrainingArguments it extends). A key outside this list
# is one LLaMA-Factory would refuse.
LLAMAFACTORY_ARGS = {
    # model
    "model_name_or_path", "trust_remote_code", "disable_gradient_checkpointing",
    # method
    "stage", "do_train", "finetuning_type", "deepspeed",
    # data
    "dataset", "dataset_dir", "template", "cutoff_len", "train_on_prompt", "packing", "neat_packing",
    "overwrite_cache", "preprocessing_num_workers", "max_samples",
    # output
    "output_dir", "logging_steps", "save_steps", "save_total_limit", "plot_loss", "overwrite_output_dir",
    "save_only_model", "report_to",
    # train
    "per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate", "num_train_epochs", "max_steps",
    "lr_scheduler_type", "warmup_ratio", "bf16", "max_grad_norm", "adam_beta1", "adam_beta2", "adam_epsilon",
    "weight_decay", "seed", "ddp_timeout",
}

RECIPE = """
trace_imports:
  runs: {kind: messages-jsonl, path: runs.jsonl}
trace_filter: {min_turns: 0}
sft:
  model: {kind: pretrained, path: Qwen/Qwen3-8B}
  epochs: 7
"""


@pytest.fixture
def built(tmp_path, monkeypatch):
    """A project whose recipe `r` has its traces built by the real stages (import, filter)."""
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "r.yaml").write_text(RECIPE)
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps({"messages": r["conversations"]}) + "\n"
                                                 for r in trace_rows(5)))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _build(recipe: str = "r") -> Path:
    nodes = plan_recipe(load_recipe(recipe, Path.cwd())).nodes
    for n in nodes:
        if n.stage in ("trace_import", "trace_filter"):
            run_spec(n.spec())
    return next(n for n in nodes if n.stage == "trace_filter").main_output


def _export(*args):
    return CliRunner().invoke(main, ["export", "llamafactory", *args])


def test_the_yaml_carries_the_recipes_sft_settings_under_llamafactory_names(built):
    kept = _build()
    result = _export("r", "lf", "--gpus", "16")
    assert result.exit_code == 0, result.output
    lf = built / "lf"
    train = yaml.safe_load((lf / "train_otbuild_sft.yaml").read_text())
    assert set(train) <= LLAMAFACTORY_ARGS, set(train) - LLAMAFACTORY_ARGS
    assert {k: train[k] for k in ("model_name_or_path", "stage", "do_train", "finetuning_type", "template",
                                  "cutoff_len", "learning_rate", "num_train_epochs", "lr_scheduler_type",
                                  "warmup_ratio", "per_device_train_batch_size", "gradient_accumulation_steps",
                                  "bf16", "dataset", "dataset_dir")} == {
        "model_name_or_path": "Qwen/Qwen3-8B", "stage": "sft", "do_train": True, "finetuning_type": "full",
        "template": "qwen3", "cutoff_len": 32768, "learning_rate": 4e-5, "num_train_epochs": 7.0,
        "lr_scheduler_type": "cosine", "warmup_ratio": 0.1, "per_device_train_batch_size": 1,
        "gradient_accumulation_steps": 6, "bf16": True, "dataset": "otbuild_sft", "dataset_dir": "."}  # 96 = 16 x 1 x 6
    ds = json.loads((lf / train["deepspeed"]).read_text())
    assert train["deepspeed"] == "ds_z3_config.json" and ds["zero_optimization"]["stage"] == 3
    # the dataset the YAML names is in dataset_info.json, its file beside it, one row per kept trace
    info = json.loads((lf / "dataset_info.json").read_text())[train["dataset"]]
    assert info["formatting"] == "sharegpt"
    rows = json.loads((lf / info["file_name"]).read_text())
    assert len(rows) == pq.read_metadata(kept).num_rows == 5
    head = (lf / "train_otbuild_sft.yaml").read_text().splitlines()[0]
    sft = next(n for n in plan_recipe(load_recipe("r", built)).nodes if n.stage == "sft")
    assert "recipe r" in head and sft.id in head


def test_a_gpu_count_that_does_not_divide_the_global_batch_is_an_error(built):
    _build()
    result = _export("r", "lf", "--gpus", "7")
    assert result.exit_code == 2
    assert "global_batch_size 96 is not a multiple of 7 GPUs" in result.output
    assert not (built / "lf").exists()  # nothing half-written


def test_unbuilt_traces_and_tiny_models_are_errors(built):
    result = _export("r", "lf")
    assert result.exit_code == 2 and "not built yet" in result.output and "otbuild build r" in result.output
    (built / "recipes" / "r.yaml").write_text(RECIPE.replace("{kind: pretrained, path: Qwen/Qwen3-8B}", "{kind: tiny}"))
    _build()
    result = _export("r", "lf")
    assert result.exit_code == 2 and "pass --model" in result.output
    assert _export("r", "lf", "--model", "Qwen/Qwen3-0.6B").exit_code == 0
    assert yaml.safe_load((built / "lf" / "train_otbuild_sft.yaml").read_text())["model_name_or_path"] == "Qwen/Qwen3-0.6B"


def test_zero_stage_precision_and_steps_map_to_their_llamafactory_settings():
    from otbuild.recipe.schema_train import Sft
    from otbuild.train.llamafactory import deepspeed_config, training_args

    def args(**sft):
        return training_args(Sft(model={"kind": "tiny"}, **sft), "d", 8, "m")

    assert "deepspeed" not in args(zero_stage=0) and deepspeed_config(0) is None
    assert args(zero_stage=1)["deepspeed"] == "ds_z2_config.json" == args(zero_stage=2)["deepspeed"]
    assert deepspeed_config(1)["zero_optimization"]["stage"] == 2
    plain = args()
    assert "max_steps" not in plain and plain["bf16"] and not plain["disable_gradient_checkpointing"]
    other = args(max_steps=0, precision="fp32", gradient_checkpointing=False, lr_scheduler="linear",
                 per_device_batch_size=4, global_batch_size=64)
    assert (other["max_steps"], other["bf16"], other["disable_gradient_checkpointing"]) == (0, False, True)
    assert args(packing=True)["packing"] and not plain["packing"]
    assert (other["lr_scheduler_type"], other["gradient_accumulation_steps"]) == ("linear", 2)  # 64 = 8 x 4 x 2
    assert set(plain) | set(other) <= LLAMAFACTORY_ARGS
    # sft.tracking -> report_to: TensorBoard by default, as otbuild's own trainer
    assert plain["report_to"] == ["tensorboard"]
    assert args(tracking={"tensorboard": False})["report_to"] == "none"
    assert args(tracking={"wandb": {"project": "p"}})["report_to"] == ["tensorboard", "wandb"]


def test_a_wandb_run_is_named_in_the_yamls_header(tmp_path):
    from otbuild.recipe.schema_train import Sft
    from otbuild.train.llamafactory import write_handoff
    from otbuild.train.toy import write_toy_traces

    traces = write_toy_traces(tmp_path / "kept.parquet", 4, full_prompt=False)
    sft = Sft(model={"kind": "tiny"}, global_batch_size=8,
              tracking={"wandb": {"project": "lab", "mode": "offline"}})
    out = write_handoff([traces], tmp_path / "lf", sft, "Qwen/Qwen3-8B", 8)
    text = Path(out["yaml"]).read_text()
    assert "# wandb (sft.tracking.wandb): export WANDB_PROJECT=lab WANDB_MODE=offline\n" in text
    assert yaml.safe_load(text)["report_to"] == ["tensorboard", "wandb"]
