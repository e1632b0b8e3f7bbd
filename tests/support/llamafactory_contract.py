"""otbuild's LLaMA-Factory handoff, read by LLaMA-Factory's own code: run by
.venv-llamafactory's python (LLaMA-Factory and its dependencies only;
tests/contracts/test_llamafactory.py feeds it and reads its answer). No GPU.

stdin (JSON): {"model": a model dir (its tokenizer is the one LLaMA-Factory loads),
"runs": [{"name", "yaml": an exported train_NAME.yaml, "output_dir"}, ...]}.
Each YAML is taken as `llamafactory-cli train` takes it, from its own folder, with these changes:
`model_name_or_path` is the tiny model, `output_dir` a scratch dir and `use_cpu` set (the CPU
stands in for the lab's GPUs: bf16 is refused on a CPU otherwise); `deepspeed` is left out
when given (LLaMA-Factory refuses DeepSpeed outside a torchrun launch). Its arguments go
through `get_train_args` (LLaMA-Factory's parser and checks), its dataset through `get_dataset`
(the sharegpt converter, the template, the supervised processor) with that tokenizer.
Writes to the file named by its only argument {"llamafactory": version, "runs": {name:
{"error": text or null, "args": the parsed settings otbuild sets, "rows": [{"input_ids",
"labels"}, ...] in dataset order}}}.

`llamafactory_contract.py cli train YAML` stands in for `llamafactory-cli train YAML` where no
GPU is (tests/e2e/test_docs.py runs docs/training.md's handoff with it): the same checks, from the
current folder, with the model dir in $OTBUILD_LF_MODEL; it prints what it loaded, or fails.
"""

import json
import os
import sys
import traceback
from importlib.metadata import version
from pathlib import Path

import yaml

# the settings the test compares with the recipe's, as LLaMA-Factory parsed them (where they live)
PARSED = {
    "model": ["model_name_or_path", "flash_attn", "enable_liger_kernel"],
    "data": ["template", "cutoff_len", "train_on_prompt", "packing", "neat_packing", "dataset", "dataset_dir"],
    "training": [
        "learning_rate",
        "num_train_epochs",
        "max_steps",
        "lr_scheduler_type",
        "warmup_ratio",
        "optim",
        "max_grad_norm",
        "adam_beta1",
        "adam_beta2",
        "adam_epsilon",
        "weight_decay",
        "seed",
        "bf16",
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "save_steps",
        "save_total_limit",
    ],
    "finetuning": ["stage", "finetuning_type"],
}


def load(run: dict, model: str) -> dict:
    from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
    from llamafactory.hparams import get_train_args
    from llamafactory.model import load_tokenizer

    folder = Path(run["yaml"]).parent
    args = yaml.safe_load(Path(run["yaml"]).read_text())
    args.pop("deepspeed", None)
    args.update(model_name_or_path=model, output_dir=run["output_dir"], report_to="none", use_cpu=True)
    os.chdir(folder)  # as documented: run from the export folder (dataset_dir: .)
    model_args, data_args, training_args, finetuning_args, _ = get_train_args(args)
    parsed = {"model": model_args, "data": data_args, "training": training_args, "finetuning": finetuning_args}
    values = {k: getattr(parsed[part], k) for part, keys in PARSED.items() for k in keys}
    values = {k: (v.value if hasattr(v, "value") else v) for k, v in values.items()}  # enums by value
    tokenizer_module = load_tokenizer(model_args)
    template = get_template_and_fix_tokenizer(tokenizer_module["tokenizer"], data_args)
    dataset = get_dataset(template, model_args, data_args, training_args, stage="sft", **tokenizer_module)
    rows = [{"input_ids": r["input_ids"], "labels": r["labels"]} for r in dataset["train_dataset"]]
    return {"error": None, "args": {k: v for k, v in values.items() if k != "model_name_or_path"}, "rows": rows}


def main(out: str) -> None:
    given = json.load(sys.stdin)
    answer = {"llamafactory": version("llamafactory"), "runs": {}}
    here = os.getcwd()
    for run in given["runs"]:
        try:
            answer["runs"][run["name"]] = load(run, given["model"])
        except (Exception, SystemExit) as e:  # noqa: BLE001  (any refusal is the finding)
            answer["runs"][run["name"]] = {
                "error": f"{type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}",
                "args": None,
                "rows": None,
            }
        finally:
            os.chdir(here)
    Path(out).write_text(json.dumps(answer))


def cli(command: str, yaml_path: str) -> int:
    import tempfile

    if command != "train":
        print(f"llamafactory-cli (otbuild's stand-in): only `train`, not {command!r}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as out:
        res = load({"yaml": str(Path(yaml_path).resolve()), "output_dir": out}, os.environ["OTBUILD_LF_MODEL"])
    supervised = sum(t != -100 for r in res["rows"] for t in r["labels"])
    print(
        f"llamafactory {version('llamafactory')}: {len(res['rows'])} examples, {supervised} trained-on tokens, "
        f"template {res['args']['template']}"
    )
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "cli":
        sys.exit(cli(*sys.argv[2:]))
    main(sys.argv[1])
