"""Export a trace parquet as a LLaMA-Factory dataset (sharegpt format, role/content messages).

    python -m otbuild.train export-llamafactory kept.parquet out_dir [--name otbuild_sft]

writes out_dir/NAME.json (a JSON list of {"messages": [{"role", "content"}, ...]}) and
out_dir/dataset_info.json, so LLaMA-Factory's `dataset_dir: out_dir`, `dataset: NAME` takes it
as is (with `template: qwen3`). Tool results are exported with role "observation" only if the
caller asks (`tool_role`); by default otbuild's traces hold system/user/assistant turns.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from otbuild.fsio import atomic_path, parquet_batches, write_json

ROLE_TAGS = {"role_tag": "role", "content_tag": "content", "user_tag": "user",
             "assistant_tag": "assistant", "observation_tag": "tool", "system_tag": "system"}


def export_llamafactory(inputs: list[Path], outdir: Path, name: str = "otbuild_sft") -> dict:
    """Streamed: one batch of conversations in memory at a time, whatever the row count."""
    outdir = Path(outdir)
    n = 0
    with atomic_path(outdir / f"{name}.json") as tmp, open(tmp, "w") as out:
        out.write("[")
        for conv in iter_conversations(inputs):
            msgs = [{"role": m["role"], "content": m.get("content") or ""} for m in conv]
            system = [m["content"] for m in msgs[:1] if m["role"] == "system"]
            row = {"messages": msgs[1:] if system else msgs}
            if system:
                row["system"] = system[0]
            out.write((", " if n else "") + json.dumps(row, ensure_ascii=False))
            n += 1
        out.write("]")
    info = {name: {"file_name": f"{name}.json", "formatting": "sharegpt",
                   "columns": {"messages": "messages", "system": "system"}, "tags": ROLE_TAGS}}
    write_json(outdir / "dataset_info.json", info)
    return {"rows": n, "file": str(outdir / f"{name}.json")}


def iter_conversations(paths, batch_rows: int = 64) -> Iterator[list[dict]]:
    """The non-empty conversations of trace parquets, in order, `batch_rows` at a time."""
    for path in paths:
        for batch in parquet_batches(path, batch_rows, ["conversations"]):
            yield from (c for c in batch.column(0).to_pylist() if c)
