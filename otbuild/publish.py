"""Publish a recipe's artifact as a Hugging Face Hub dataset.

The folder holds `data/train-NNNNN-of-MMMMM.parquet` (the artifact's table, streamed into
shards of bounded size), `README.md` (a dataset card whose YAML header tells the Hub and
`datasets.load_dataset(folder)` where the data is, and gives `license` as the report works it out
from the sources, `task_categories` and `language`), `recipe.resolved.yaml` and `manifest.json`
(the recipe's sha256, the artifact's id and every upstream id, each shard's rows and sha256,
what was redacted). Every string of the table is redacted on the way (otbuild/tasks/redact.py:
keys and tokens an agent echoed or a task carried), counted per pattern in the manifest and the
card.
It appears by rename only when complete; `upload` sends it with `HfApi`.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import yaml

from otbuild.errors import ConfigError
from otbuild.fsio import parquet_batches, write_json
from otbuild.plan import Node, Plan
from otbuild.provenance import read_record
from otbuild.stages import STAGES
from otbuild.tasks.redact import PATTERNS, Redactor, describe

REPO_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
MAX_SHARD_BYTES = 500 * 2**20  # in-memory bytes per shard (the Hub's advice: files under ~500 MB)


def hub_folder(plan: Plan, label: str, dest: Path, repo: str, max_shard_bytes: int = MAX_SHARD_BYTES) -> dict:
    """Write the Hub-ready folder for the artifact `label` of `plan` at `dest` (which must not exist)."""
    if not REPO_RE.match(repo):
        raise ConfigError(f"--repo {repo!r}: expected ORG/NAME (letters, digits, '-', '_', '.')")
    node = _built(plan, label)
    if dest.exists():
        raise ConfigError(f"{dest} exists: publish writes a new folder, never over one")
    tmp = dest.with_name(f".{dest.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "data").mkdir(parents=True)
    redactor = Redactor()
    files = _shards(node.main_output, tmp / "data", max_shard_bytes, redactor)
    with open(tmp / "recipe.resolved.yaml", "w") as f:
        yaml.safe_dump(plan.recipe.data, f, sort_keys=False)
    manifest = {
        "repo": repo,
        "recipe": plan.recipe.name,
        "recipe_sha256": hashlib.sha256(plan.recipe.path.read_bytes()).hexdigest(),
        "artifact": {
            "label": node.label,
            "stage": node.stage,
            "id": node.id,
            "path": str(node.main_output),
            "sha256": _recorded_sha256(node),
        },
        "upstream": [{"label": n.label, "stage": n.stage, "id": n.id} for n in _ancestors(node)],
        "files": files,
        "redacted": redactor.found(),
    }
    write_json(tmp / "manifest.json", manifest)
    licences = _licences([*_ancestors(node), node])
    (tmp / "README.md").write_text(_card(manifest, plan.recipe.data.get("description", ""), licences))
    tmp.rename(dest)
    return manifest


def upload(folder: Path, repo: str, token: str, private: bool = False) -> str:
    """Create the dataset repo if needed and upload the folder as one commit; returns its URL."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    api.create_repo(repo, repo_type="dataset", exist_ok=True, private=private)
    manifest = json.loads((folder / "manifest.json").read_text())
    info = api.upload_folder(
        folder_path=str(folder),
        repo_id=repo,
        repo_type="dataset",
        commit_message=f"otbuild: {manifest['recipe']} {manifest['artifact']['label']} {manifest['artifact']['id']}",
    )
    return str(info)


def _built(plan: Plan, label: str) -> Node:
    nodes = {n.label: n for n in plan.nodes}
    if label not in nodes:
        raise ConfigError(f"{plan.recipe.path}: no artifact {label!r} (the recipe's: {', '.join(nodes)})")
    node = nodes[label]
    if read_record(node.dir) is None:
        raise ConfigError(f"{label} ({node.dir}) is not built: run `otbuild build {plan.recipe.name}` first")
    if node.main_output.suffix != ".parquet":
        raise ConfigError(f"{label} is a {node.stage} artifact ({node.main_output.name}): only tables are published")
    return node


def _shards(src: Path, outdir: Path, max_bytes: int, redactor: Redactor) -> list[dict]:
    """Stream `src`, redacted, into shards of at most ~max_bytes (in memory) each, named as the Hub expects."""
    schema = pq.read_schema(src)
    parts: list[Path] = []
    writer, size = None, 0
    for batch in parquet_batches(src, 1024):
        if writer is None or size >= max_bytes:
            if writer:
                writer.close()
            parts.append(outdir / f"part-{len(parts)}.parquet")
            writer, size = pq.ParquetWriter(parts[-1], schema, compression="zstd"), 0
        writer.write_batch(redactor.batch(batch))
        size += batch.nbytes
    if writer is None:  # an empty table is still one (empty) shard with its schema
        parts.append(outdir / "part-0.parquet")
        pq.write_table(schema.empty_table(), parts[0])
    else:
        writer.close()
    files = []
    for k, part in enumerate(parts):
        final = part.with_name(f"train-{k:05d}-of-{len(parts):05d}.parquet")
        part.rename(final)
        files.append(
            {
                "path": f"data/{final.name}",
                "rows": pq.read_metadata(final).num_rows,
                "sha256": hashlib.sha256(final.read_bytes()).hexdigest(),
            }
        )
    return files


def _recorded_sha256(node: Node) -> str | None:
    for o in (read_record(node.dir) or {}).get("outputs", []):
        if Path(o["path"]).name == node.main_output.name:
            return o.get("sha256")
    return None


def _ancestors(node: Node) -> list[Node]:
    seen: dict[str, Node] = {}

    def visit(n: Node) -> None:
        for i in n.inputs:
            visit(i)
            seen.setdefault(i.id, i)

    visit(node)
    return list(seen.values())


def _licences(nodes: list[Node]) -> list[str]:
    """The licences the artifact's sources record (not the benchmarks'), as the report finds them."""
    from otbuild import duck
    from otbuild.report.data import Artifact, source_licences

    con = duck.connect()
    return sorted(
        {
            lic
            for n in nodes
            if STAGES[n.stage].brings == "tasks" and not n.label.startswith("benchmarks/")
            for lic, _ in source_licences(con, Artifact(n.label, n.label, n.stage, n.id, n.dir, read_record(n.dir)))
        }
    )


def _card(m: dict, description: str, licences: list[str]) -> str:
    from otbuild.report.page import hub_metadata, size_category

    rows = sum(f["rows"] for f in m["files"])
    a = m["artifact"]
    header = {
        **hub_metadata(licences),
        "configs": [{"config_name": "default", "data_files": [{"split": "train", "path": "data/train-*.parquet"}]}],
        "tags": ["otbuild", "agentic", a["stage"]],
        "size_categories": [size_category(rows)],
        "pretty_name": f"{m['recipe']} {a['label']}",
    }
    upstream = "\n".join(f"| {u['label']} | {u['stage']} | `{u['id']}` |" for u in m["upstream"])
    return f"""---
{yaml.safe_dump(header, sort_keys=False)}---

# {m["recipe"]}: {a["label"]}

{description}

The `{a["label"]}` artifact ({a["stage"]} stage, id `{a["id"]}`) of the otbuild recipe
`{m["recipe"]}` (recipe sha256 `{m["recipe_sha256"]}`): {rows:,} rows in {len(m["files"])} parquet file(s).
`recipe.resolved.yaml` is the recipe as built; `manifest.json` names every file with its rows and
sha256 and every upstream artifact with its id. Rebuild it with `otbuild build {m["recipe"]}`;
equal ids mean equal inputs, settings and stage versions.

Secrets were redacted before publishing (each match of {", ".join(PATTERNS)} replaced by
`[REDACTED:NAME]`): {describe(m["redacted"])}.

| upstream artifact | stage | id |
|---|---|---|
{upstream}
"""
