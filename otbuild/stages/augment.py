"""Augment: LLM surface forms of task instructions (rewrite / harden / combine).

Each new task is its parent's task dir with a new instruction.md; it records the parent's
task id (`parent_task_id`) and how it was made (`augmentation`). `combine` pairs each task
with a seeded partner from the same input and keeps the first parent's environment and
verifier (so the partner's part is not checked: use it for sources judged by an LLM).
Reasoning is never part of a new instruction: text up to a closing `</think>` (a model
served without a reasoning parser) is cut off, and an answer still holding `<think>` is
quarantined. Answers that are empty or fail after the engine's retries are quarantined with
the reason. Requests run in `shards` jobs that resume (otbuild/stagekit/llm_requests.py); the
merge streams the parents and the answers.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from pathlib import Path
from typing import Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Field

from otbuild.fsio import atomic_path
from otbuild.prompts import render
from otbuild.settings.base import MAX_REPEATS, Sharded, plan_only
from otbuild.settings.engines import LLM
from otbuild.stagekit import Inputs, StageDef, llm_requests, stage_run, stage_run_shard
from otbuild.tasks.table import TASK_SCHEMA, Quarantined, TaskRecord, write_quarantine
from otbuild.tasks.taskdir import INSTRUCTION, TaskDir


class Augment(LLM, Sharded):
    """LLM rewrites of task instructions, per source, before the mix (paper: StackExchange
    Tezos 997 -> ~21K surface forms)."""

    sources: list[str] | None = plan_only(None, description="sources to augment; default: all")
    kinds: list[Literal["rewrite", "harden", "combine"]] = Field(default=["rewrite"], min_length=1)
    k: int = Field(default=1, ge=1, le=MAX_REPEATS, description="surface forms per task and kind")
    keep_original: bool = True
    seed: int = 0


SCHEMA = TASK_SCHEMA.append(pa.field("parent_task_id", pa.string())).append(pa.field("augmentation", pa.string()))
THINK, END_THINK = "<think>", "</think>"
BATCH_ROWS = 256


def _forms(cfg) -> list[tuple[str, int]]:
    """(kind, j) of each request one task makes, in request order."""
    return [(kind, j) for kind in cfg.kinds for j in range(cfg.k)]


def requests(cfg, inputs: list[Path]):
    """`requests(wanted)` for llm_requests.run_shard: each task's forms in turn, in input order."""
    forms = _forms(cfg)
    instructions = _column(inputs, "instruction") if "combine" in cfg.kinds else None
    partners = _partners(len(instructions), cfg.seed) if instructions is not None else None

    def wanted_requests(wanted):
        number = 0
        for i, row in enumerate(_rows(inputs, ["task_id", "instruction"])):
            for kind, j in forms:
                if wanted(number):
                    partner = instructions[partners[i]].as_py() if kind == "combine" else None
                    yield (
                        number,
                        _prompt(row["instruction"], kind, partner),
                        {"seed": _seed(cfg.seed, row["task_id"], kind, j)},
                    )
                number += 1

    return wanted_requests


@stage_run_shard
def run_shard(cfg: Augment, inputs: Inputs, outdir: Path, shard: int) -> None:
    total = llm_requests.input_rows(inputs) * len(_forms(cfg))
    llm_requests.run_shard("augment", cfg, requests(cfg, inputs), total, outdir, shard)


@stage_run
def run(cfg: Augment, inputs: Inputs, outdir: Path) -> dict:
    """Merge: the parents (with keep_original), then each parent's new forms in request order."""
    forms = _forms(cfg)
    n_rows = llm_requests.input_rows(inputs)
    answers = llm_requests.answers(outdir, cfg.shards, n_rows * len(forms))
    partner_ids = _column(inputs, "task_id") if "combine" in cfg.kinds else None
    partners = _partners(n_rows, cfg.seed) if partner_ids is not None else None
    quarantined: list[Quarantined] = []
    kept = new = 0
    with atomic_path(outdir / "tasks.parquet") as tmp, pq.ParquetWriter(tmp, SCHEMA, compression="zstd") as w:
        buffer: list[dict] = []

        def emit(row: dict) -> None:
            nonlocal kept
            buffer.append(row)
            kept += 1
            if len(buffer) >= BATCH_ROWS:
                w.write_table(pa.Table.from_pylist(buffer, SCHEMA))
                buffer.clear()

        if cfg.keep_original:
            for parent in _rows(inputs, TASK_SCHEMA.names):
                emit({**parent, "parent_task_id": None, "augmentation": None})
        for i, parent in enumerate(_rows(inputs, TASK_SCHEMA.names)):
            for kind, j in forms:
                answer = next(answers)
                name = f"{parent['path']}-{kind}{j}"
                text, why = (None, f"engine error: {answer['error']}") if answer["error"] else clean(answer["text"])
                if text is None:
                    quarantined.append(Quarantined(name, why.split(":")[0], (answer["error"] or answer["text"])[:500]))
                    continue
                task = TaskDir.unpack(name, parent["task_binary"])
                task.add(INSTRUCTION, text.rstrip() + "\n")
                meta = {
                    **json.loads(parent["metadata"] or "{}"),
                    "augmentation": kind,
                    "parent_task_id": parent["task_id"],
                }
                if kind == "combine":
                    assert partner_ids is not None and partners is not None  # read for combine (above)
                    meta["partner_task_id"] = partner_ids[partners[i]].as_py()
                row = TaskRecord(task, parent["runnable_locally"], meta).row(parent["source"])
                emit({**row, "parent_task_id": parent["task_id"], "augmentation": kind})
                new += 1
        if buffer:
            w.write_table(pa.Table.from_pylist(buffer, SCHEMA))
    next(answers, None)  # runs the answers' own check: exactly one per request
    write_quarantine(outdir / "quarantine.parquet", quarantined, "augment")
    reasons = dict(Counter(q.reason for q in quarantined))
    if quarantined and not new:
        (outdir / "tasks.parquet").unlink()
        raise RuntimeError(
            f"augment: all {len(quarantined)} answers were quarantined ({reasons}); "
            f"first: {quarantined[0].reason}: {quarantined[0].detail[:300]}"
        )
    return {
        "tasks": kept,
        "new": new,
        "quarantined": len(quarantined),
        "quarantined_by_reason": reasons,
        "shards": llm_requests.shard_records(outdir, cfg.shards),
        "llm_usage": llm_requests.llm_usage(cfg, outdir),
    }


def _prompt(instruction: str, kind: str, partner: str | None) -> list[dict]:
    content = render(f"augment_{kind}.j2", instruction=(instruction or "").strip(), partner=(partner or "").strip())
    return [{"role": "user", "content": content}]


def _partners(n: int, seed: int) -> list[int]:
    """A seeded pairing: task i's partner is the next task in a seeded cycle (never itself)."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    nxt = {order[k]: order[(k + 1) % n] for k in range(n)}
    return [nxt[i] for i in range(n)]


def _seed(seed: int, task_id: str, kind: str, j: int) -> int:
    return int(hashlib.sha256(f"{seed}:{task_id}:{kind}:{j}".encode()).hexdigest()[:8], 16)


def clean(text: str) -> tuple[str | None, str]:
    """(the new instruction, "") or (None, why it is not one). Reasoning is cut off: all up to
    the last `</think>` (a reasoning model served without a parser writes its thinking in the
    answer, its opening tag often in the prompt); a `<think>` left after that (unclosed: the
    answer ran out mid-thought) rejects the answer. A code fence around the answer goes."""
    text = text.rsplit(END_THINK, 1)[-1].strip()
    if THINK in text:
        return None, f"reasoning in answer: {THINK} without {END_THINK}"
    if text.startswith("```") and text.endswith("```"):
        text = text.split("\n", 1)[1].rsplit("```", 1)[0] if "\n" in text else ""
    text = text.strip()
    return (text, "") if text else (None, "empty answer")


def _rows(inputs: list[Path], columns: list[str]):
    for batch in llm_requests.input_batches(inputs, columns, BATCH_ROWS):
        yield from batch.to_pylist()


def _column(inputs: list[Path], name: str) -> pa.Array:
    """One narrow column of every input (instructions or ids for combine's partners), in arrow."""
    return pa.chunked_array(
        [c for p in inputs for c in pq.read_table(p, columns=[name]).column(name).chunks], pa.string()
    )


def estimate(m, n, e) -> None:
    """One request per task, kind and surface form; the originals kept beside them."""
    cfg = n.config
    tasks = m.rows_in(n)
    forms = cfg.k * len(cfg.kinds)
    m.requests(n, e, tasks * forms)
    m.rows[n.id] = tasks * (forms + int(cfg.keep_original))
    e.counts.update(tasks_in=tasks, tasks_out=m.rows[n.id])


STAGE = StageDef(
    "augment",
    2,
    ("tasks.parquet", "quarantine.parquet"),
    __name__,
    Augment,
    plan="per_source",
    consumes=("tasks",),
    produces="tasks",
    sharded=True,
    gpu=True,
    llm=True,
    tasks=True,
    recipe_field=(Augment | None, None),
    estimate=estimate,
)
