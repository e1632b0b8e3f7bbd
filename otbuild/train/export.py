"""Export a trace parquet as a LLaMA-Factory dataset (sharegpt format, role/content messages).

    python -m otbuild.train export-llamafactory kept.parquet out_dir [--name otbuild_sft]

writes out_dir/NAME.json (a JSON list of {"messages": [{"role", "content"}, ...]}) and
out_dir/dataset_info.json, so LLaMA-Factory's `dataset_dir: out_dir`, `dataset: NAME` takes it
as is (with `template: qwen3`). Tool results are exported with role "observation" only if the
caller asks (`tool_role`); by default otbuild's traces hold system/user/assistant turns.
"""

from __future__ import annotations

import json
from pathlib import Path

from otbuild.fsio import atomic_path, write_json
from otbuild.train.data import read_conversations

ROLE_TAGS = {"role_tag": "role", "content_tag": "content", "user_tag": "user",
             "assistant_tag": "assistant", "observation_tag": "tool", "system_tag": "system"}


def export_llamafactory(inputs: list[Path], outdir: Path, name: str = "otbuild_sft") -> dict:
    outdir = Path(outdir)
    rows = []
    for conv in read_conversations(inputs):
        msgs = [{"role": m["role"], "content": m.get("content") or ""} for m in conv]
        system = [m["content"] for m in msgs[:1] if m["role"] == "system"]
        row = {"messages": msgs[1:] if system else msgs}
        if system:
            row["system"] = system[0]
        rows.append(row)
    with atomic_path(outdir / f"{name}.json") as tmp:
        tmp.write_text(json.dumps(rows, ensure_ascii=False))
    info = {name: {"file_name": f"{name}.json", "formatting": "sharegpt",
                   "columns": {"messages": "messages", "system": "system"}, "tags": ROLE_TAGS}}
    write_json(outdir / "dataset_info.json", info)
    return {"rows": len(rows), "file": str(outdir / f"{name}.json")}
