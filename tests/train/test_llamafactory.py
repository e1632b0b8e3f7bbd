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
from otbuild.harness.protocol import compact_conversation
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
    "model_name_or_path",
    "trust_remote_code",
    "disable_gradient_checkpointing",
    "flash_attn",
    "enable_liger_kernel",
    # method
    "stage",
    "do_train",
    "finetuning_type",
    "deepspeed",
    # data
    "dataset",
    "dataset_dir",
    "template",
    "cutoff_len",
    "train_on_prompt",
    "packing",
    "neat_packing",
    "overwrite_cache",
    "preprocessing_num_workers",
    "max_samples",
    # output
    "output_dir",
    "logging_steps",
    "save_steps",
    "save_total_limit",
    "plot_loss",
    "overwrite_output_dir",
    "save_only_model",
    "report_to",
    # train
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "learning_rate",
    "num_train_epochs",
    "max_steps",
    "lr_scheduler_type",
    "warmup_ratio",
    "bf16",
    "optim",
    "max_grad_norm",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "weight_decay",
    "seed",
    "ddp_timeout",
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
    (tmp_path / "runs.jsonl").write_text(
        "".join(json.dumps({"messages": r["conversations"]}) + "\n" for r in trace_rows(5))
    )
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
    assert {
        k: train[k]
        for k in (
            "model_name_or_path",
            "stage",
            "do_train",
            "finetuning_type",
            "template",
            "cutoff_len",
            "learning_rate",
            "num_train_epochs",
            "lr_scheduler_type",
            "warmup_ratio",
            "per_device_train_batch_size",
            "gradient_accumulation_steps",
            "bf16",
            "dataset",
            "dataset_dir",
        )
    } == {
        "model_name_or_path": "Qwen/Qwen3-8B",
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "full",
        "template": "qwen3",
        "cutoff_len": 32768,
        "learning_rate": 4e-5,
        "num_train_epochs": 7.0,
        "lr_scheduler_type": "cosine",
        "warmup_ratio": 0.1,
        "per_device_train_batch_size": 1,
        "gradient_accumulation_steps": 6,
        "bf16": True,
        "dataset": "otbuild_sft",
        "dataset_dir": ".",
    }  # 96 = 16 x 1 x 6
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
    assert (
        yaml.safe_load((built / "lf" / "train_otbuild_sft.yaml").read_text())["model_name_or_path"] == "Qwen/Qwen3-0.6B"
    )


def test_zero_stage_precision_and_steps_map_to_their_llamafactory_settings():
    from otbuild.settings.train import Sft
    from otbuild.train.llamafactory import deepspeed_config, training_args

    def args(**sft):
        return training_args(Sft(model={"kind": "tiny"}, **sft), "d", 8, "m")

    assert "deepspeed" not in args(zero_stage=0) and deepspeed_config(0) is None
    assert args(zero_stage=1)["deepspeed"] == "ds_z2_config.json" == args(zero_stage=2)["deepspeed"]
    assert deepspeed_config(1)["zero_optimization"]["stage"] == 2
    plain = args()
    assert "max_steps" not in plain and plain["bf16"] and not plain["disable_gradient_checkpointing"]
    other = args(
        max_steps=0,
        precision="fp32",
        gradient_checkpointing=False,
        lr_scheduler="linear",
        per_device_batch_size=4,
        global_batch_size=64,
    )
    assert (other["max_steps"], other["bf16"], other["disable_gradient_checkpointing"]) == (0, False, True)
    packed = args(packing=True, cutoff_len=1024)
    assert packed["packing"] and packed["neat_packing"] and not plain["packing"] and not plain["neat_packing"]
    assert (packed["cutoff_len"], plain["cutoff_len"]) == (1025, 32768)  # LLaMA-Factory packs rows of cutoff_len - 1
    assert (other["lr_scheduler_type"], other["gradient_accumulation_steps"]) == ("linear", 2)  # 64 = 8 x 4 x 2
    assert args(lr_scheduler="constant")["lr_scheduler_type"] == "constant_with_warmup"  # otbuild's warms up
    assert (plain["optim"], args(optimizer="torch")["optim"]) == ("adamw_torch_fused", "adamw_torch")
    assert set(plain) | set(other) <= LLAMAFACTORY_ARGS
    # sft.tracking -> report_to: TensorBoard by default, as otbuild's own trainer
    assert plain["report_to"] == ["tensorboard"]
    assert args(tracking={"tensorboard": False})["report_to"] == "none"
    assert args(tracking={"wandb": {"project": "p"}})["report_to"] == ["tensorboard", "wandb"]


def test_a_wandb_run_is_named_in_the_yamls_header(tmp_path):
    from otbuild.settings.train import Sft
    from otbuild.train.llamafactory import write_handoff
    from otbuild.train.toy import write_toy_traces

    traces = write_toy_traces(tmp_path / "kept.parquet", 4, full_prompt=False)
    sft = Sft(model={"kind": "tiny"}, global_batch_size=8, tracking={"wandb": {"project": "lab", "mode": "offline"}})
    out = write_handoff([traces], tmp_path / "lf", sft, "Qwen/Qwen3-8B", 8)
    text = Path(out["yaml"]).read_text()
    assert "# wandb (sft.tracking.wandb): export WANDB_PROJECT=lab WANDB_MODE=offline\n" in text
    assert yaml.safe_load(text)["report_to"] == ["tensorboard", "wandb"]


def test_every_optimizer_setting_and_the_template_follow_the_recipe():
    from otbuild.settings.train import Sft
    from otbuild.train.llamafactory import training_args

    def args(template="auto", speed=(), **sft):
        return training_args(Sft(model={"kind": "tiny", "chat_template": template}, **sft), "d", 8, "m", speed)

    assert args("qwen3")["template"] == "qwen3_nothink"  # the 8B: no empty <think> block trained
    assert args("qwen3_thinking")["template"] == args()["template"] == "qwen3"
    opt = args(max_grad_norm=1e-3, adam_betas=(0.9, 0.98), adam_eps=1e-6, weight_decay=0.04, seed=3)
    assert {
        k: opt[k] for k in ("max_grad_norm", "adam_beta1", "adam_beta2", "adam_epsilon", "weight_decay", "seed")
    } == {
        "max_grad_norm": 1e-3,
        "adam_beta1": 0.9,
        "adam_beta2": 0.98,
        "adam_epsilon": 1e-6,
        "weight_decay": 0.04,
        "seed": 3,
    }
    fast = args(speed=("liger-kernel", "flash-attn"))
    assert (fast["enable_liger_kernel"], fast["flash_attn"]) == (True, "fa2")
    assert "enable_liger_kernel" not in args() and "flash_attn" not in args()
    assert set(fast) <= LLAMAFACTORY_ARGS


def _conv(*roles):
    return [{"role": r, "content": f"{r} {i}"} for i, r in enumerate(roles)]


def test_turns_alternate_as_llamafactory_requires_and_the_changes_are_counted(tmp_path):
    """LLaMA-Factory drops a conversation whose turns do not alternate user/assistant or that
    does not end with an answer: the export merges and trims them, and says how many."""
    from otbuild.settings.train import Sft
    from otbuild.traces.table import TRACE_SCHEMA, write_traces
    from otbuild.train.llamafactory import write_handoff

    convs = [
        _conv("system", "user", "assistant"),
        _conv("user", "system", "user", "assistant", "user"),  # Harbor: summary (system) then user
        _conv("user", "assistant", "assistant", "tool", "user", "assistant"),
        _conv("assistant", "user", "assistant"),
        _conv("user"),
    ]
    rows = [
        {
            **dict.fromkeys(TRACE_SCHEMA.names),
            "conversations": c,
            "task": f"t{i}",
            "trial_name": f"t{i}",
            "sample_idx": 0,
        }
        for i, c in enumerate(convs)
    ]
    write_traces(tmp_path / "kept.parquet", rows)
    out = write_handoff(
        [tmp_path / "kept.parquet"],
        tmp_path / "lf",
        Sft(model={"kind": "tiny"}, global_batch_size=8),
        "Qwen/Qwen3-8B",
        8,
    )
    assert {k: out[k] for k in ("rows", "merged_turns", "trailing_turns_dropped", "dropped")} == {
        "rows": 3,
        "merged_turns": 4,
        "trailing_turns_dropped": 1,
        "dropped": 2,
    }
    msgs = [r["messages"] for r in json.loads((tmp_path / "lf" / "otbuild_sft.json").read_text())]
    assert msgs[0] == _conv("system", "user", "assistant")  # a leading system prompt stays LLaMA-Factory's system
    assert msgs[1] == [
        {"role": "user", "content": "user 0\n\nsystem 1\n\nuser 2"},
        {"role": "assistant", "content": "assistant 3"},
    ]
    assert [m["role"] for m in msgs[2]] == ["user", "assistant", "user", "assistant"]
    assert msgs[2][1]["content"] == "assistant 1\n\nassistant 2"
    assert msgs[2][2]["content"] == "<tool_response>\ntool 3\n</tool_response>\n\nuser 4"
    info = json.loads((tmp_path / "lf" / "dataset_info.json").read_text())["otbuild_sft"]
    assert info["columns"] == {"messages": "messages"}  # no `system` column: no record has one
    head = Path(out["yaml"]).read_text()
    assert "# 4 turn(s) joined to the turn before them" in head and "# 2 conversation(s) left out" in head


def test_a_local_model_dir_is_absolute_and_the_layout_follows_the_template(built):
    """The YAML runs from the export folder: a model dir given relative to the project is
    written absolute. The answers keep their reasoning for the thinking template only, and
    the traces are exported in the recipe's prompt style."""
    (built / "models" / "base").mkdir(parents=True)
    (built / "recipes" / "r.yaml").write_text(
        RECIPE.replace("path: Qwen/Qwen3-8B}", "path: models/base, chat_template: qwen3}")
        + "harness: {prompt: compact}\n"
    )
    _build()
    result = _export("r", "lf", "--speed", "liger-kernel", "--speed", "flash-attn")
    assert result.exit_code == 0, result.output
    train = yaml.safe_load((built / "lf" / "train_otbuild_sft.yaml").read_text())
    assert train["model_name_or_path"] == str(built / "models" / "base") and train["template"] == "qwen3_nothink"
    assert (train["enable_liger_kernel"], train["flash_attn"]) == (True, "fa2")
    first = json.loads((built / "lf" / "otbuild_sft.json").read_text())[0]["messages"][0]["content"]
    original = trace_rows(5)[0]["conversations"]
    assert first == compact_conversation(original)[0]["content"] != original[0]["content"]
    assert _export("r", "lf2", "--model", "Org/Model").exit_code == 0  # an HF id stays one
    assert yaml.safe_load((built / "lf2" / "train_otbuild_sft.yaml").read_text())["model_name_or_path"] == "Org/Model"


# OpenThoughts-Agent's LLaMA-Factory configs for the paper's runs (open-thoughts/OpenThoughts-Agent,
# sft/lf_configs/qwen3/extra/): what the export of each paper recipe must say
OT_AGENT = {
    "otagent_v2_100k": (
        "32k_base_bs96_opt100k.yaml",
        {"template": "qwen3", "num_train_epochs": 5.0, "max_grad_norm": 1e-3, "adam_beta2": 0.98, "weight_decay": 0.04},
    ),
    "otagent_v2_10k": (
        "32k_base_bs96_nothink.yaml",
        {
            "template": "qwen3_nothink",
            "num_train_epochs": 7.0,
            "max_grad_norm": 1e-4,
            "adam_beta2": 0.98,
            "weight_decay": 0.0,
        },
    ),
}
OT_AGENT_COMMON = {
    "learning_rate": 4e-5,
    "lr_scheduler_type": "cosine",
    "warmup_ratio": 0.1,
    "cutoff_len": 32768,
    "adam_beta1": 0.9,
    "optim": "adamw_torch_fused",
    "bf16": True,
    "finetuning_type": "full",
    "disable_gradient_checkpointing": False,
}


@pytest.mark.parametrize("recipe", sorted(OT_AGENT))
def test_the_paper_recipes_train_with_openthoughts_agents_settings(recipe):
    from otbuild.train.llamafactory import training_args
    from tests.conftest import REPO

    config, settings = OT_AGENT[recipe]
    sft = next(n for n in plan_recipe(load_recipe(recipe, REPO)).nodes if n.stage == "sft").config
    args = training_args(sft, "d", 16, "m")  # OT-Agent's global batch 96 on 16 GPUs
    assert {k: args[k] for k in {**settings, **OT_AGENT_COMMON}} == {**settings, **OT_AGENT_COMMON}
    assert args["gradient_accumulation_steps"] * 16 == 96
    assert config in (REPO / "recipes" / f"{recipe}.yaml").read_text()  # each value names where it comes from
