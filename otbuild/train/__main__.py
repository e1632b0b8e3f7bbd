"""`python -m otbuild.train sft|rl --settings JSON --outdir DIR INPUT...` (what launchers run on
every rank) and `python -m otbuild.train export-llamafactory TRACES... --outdir DIR
[--chat-template qwen3_thinking|qwen3]`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import cast


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m otbuild.train")
    p.add_argument("command", choices=["sft", "rl", "export-llamafactory"])
    p.add_argument("inputs", nargs="+", type=Path)
    p.add_argument("--outdir", type=Path, required=True)
    p.add_argument("--settings", default="{}", help="JSON object, or @FILE")
    p.add_argument("--name", default="otbuild_sft", help="export: the dataset's name")
    p.add_argument(
        "--chat-template",
        default="qwen3_thinking",
        choices=["qwen3_thinking", "qwen3"],
        help="export: reasoning kept (LLaMA-Factory's qwen3) or removed (its qwen3_nothink)",
    )
    a = p.parse_args(argv)
    if a.command == "export-llamafactory":
        from otbuild.train.export import export_llamafactory

        print(json.dumps(export_llamafactory(a.inputs, a.outdir, a.name, chat_template=a.chat_template)))
        return 0
    from otbuild.settings.stages import RlSettings, SftSettings

    raw = Path(a.settings[1:]).read_text() if a.settings.startswith("@") else a.settings
    model = SftSettings if a.command == "sft" else RlSettings  # the stage's model: the schema's defaults
    cfg = model.model_validate(json.loads(raw))
    a.outdir.mkdir(parents=True, exist_ok=True)

    def log(s: str) -> None:
        print(s, flush=True)

    if a.command == "sft":
        from otbuild.train.sft import train as train_sft

        train_sft(cast(SftSettings, cfg), a.inputs, a.outdir, log=log)
    else:
        from otbuild.train.rl.trainer import train as train_rl

        train_rl(cast(RlSettings, cfg), a.inputs, a.outdir, log=log)
    import torch.distributed as dist

    if dist.is_initialized():  # each rank leaves its group: torn down at exit, gloo aborts a rank
        dist.destroy_process_group()  # ("terminate called without an active exception")
    return 0


if __name__ == "__main__":
    sys.exit(main())
