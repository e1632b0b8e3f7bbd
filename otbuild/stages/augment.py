"""Augment: LLM surface forms of task instructions (rewrite / harden / combine).

Each new task is its parent's task dir with a new instruction.md; it records the parent's
task id (`parent_task_id`) and how it was made (`augmentation`). `combine` pairs each task
with a seeded partner from the same input and keeps the first parent's environment and
verifier (so the partner's part is not checked: use it for sources judged by an LLM).
Answers that are empty or fail after the engine's retries are quarantined with the reason.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from otbuild.engines import EngineError
from otbuild.engines.batch import complete_all
from otbuild.fsio import atomic_path
from otbuild.prompts import render
from otbuild.tasks.table import TASK_SCHEMA, Quarantined, TaskRecord, write_quarantine
from otbuild.tasks.taskdir import INSTRUCTION, TaskDir

SCHEMA = TASK_SCHEMA.append(pa.field("parent_task_id", pa.string())).append(pa.field("augmentation", pa.string()))


def run(settings: dict, inputs: list[Path], outdir: Path) -> dict:
    rows = [r for p in inputs for r in pq.read_table(p, columns=TASK_SCHEMA.names).to_pylist()]
    partners = _partners(len(rows), settings["seed"])
    jobs = [(i, kind, j) for i in range(len(rows)) for kind in settings["kinds"] for j in range(settings["k"])]
    requests = [(_prompt(rows, i, kind, partners), {"seed": _seed(settings["seed"], rows[i]["task_id"], kind, j)})
                for i, kind, j in jobs]
    answers = complete_all(settings, requests)
    out = [{**r, "parent_task_id": None, "augmentation": None} for r in rows] if settings["keep_original"] else []
    quarantined = []
    for (i, kind, j), answer in zip(jobs, answers):
        parent = rows[i]
        name = f"{parent['path']}-{kind}{j}"
        text = _clean(answer.text) if not isinstance(answer, EngineError) else ""
        if not text:
            why = f"engine error: {answer}" if isinstance(answer, EngineError) else "empty answer"
            quarantined.append(Quarantined(name, why.split(":")[0], str(answer)[:500]))
            continue
        task = TaskDir.unpack(name, parent["task_binary"])
        task.add(INSTRUCTION, text.rstrip() + "\n")
        meta = {**json.loads(parent["metadata"] or "{}"), "augmentation": kind,
                "parent_task_id": parent["task_id"]}
        if kind == "combine":
            meta["partner_task_id"] = rows[partners[i]]["task_id"]
        row = TaskRecord(task, parent["runnable_locally"], meta).row(parent["source"])
        out.append({**row, "parent_task_id": parent["task_id"], "augmentation": kind})
    with atomic_path(outdir / "tasks.parquet") as tmp:
        pq.write_table(pa.Table.from_pylist(out, SCHEMA), tmp, compression="zstd")
    write_quarantine(outdir / "quarantine.parquet", quarantined, "augment")
    return {"tasks": len(out), "new": len(out) - (len(rows) if settings["keep_original"] else 0),
            "quarantined": len(quarantined), "quarantined_by_reason": dict(Counter(q.reason for q in quarantined))}


def _prompt(rows: list[dict], i: int, kind: str, partners: list[int]) -> list[dict]:
    partner = rows[partners[i]]["instruction"] if kind == "combine" else None
    content = render(f"augment_{kind}.j2", instruction=rows[i]["instruction"].strip(),
                     partner=(partner or "").strip())
    return [{"role": "user", "content": content}]


def _partners(n: int, seed: int) -> list[int]:
    """A seeded pairing: task i's partner is the next task in a seeded cycle (never itself)."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    nxt = {order[k]: order[(k + 1) % n] for k in range(n)}
    return [nxt[i] for i in range(n)]


def _seed(seed: int, task_id: str, kind: str, j: int) -> int:
    return int(hashlib.sha256(f"{seed}:{task_id}:{kind}:{j}".encode()).hexdigest()[:8], 16)


def _clean(text: str) -> str:
    """The answer without a code fence around it."""
    text = text.strip()
    if text.startswith("```") and text.endswith("```"):
        text = text.split("\n", 1)[1].rsplit("```", 1)[0] if "\n" in text else ""
    return text.strip()
