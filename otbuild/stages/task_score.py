"""Task score: an LLM score per task in `llm_score`, for the task filter's top-k or budget.

- askllm: the model rates the task from 1 to 100 (the first integer in its answer); an
  answer without one leaves the score null (the filter rejects the row with that reason).
- response_length: a small model answers the task; the score is the length of its answer
  in tokens (the server's count, else whitespace-separated words). The paper found it the
  best task filter signal (+~3pp) and uses it as upsampling weights at scale.
The model's answer is kept in `llm_response` (first 2,000 characters) for audits. One request
per task, in `shards` jobs that resume (otbuild/stagekit/llm_requests.py). A run that scores
no task at all fails, naming why (every answer an error, or none holding a rating).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from otbuild.fsio import atomic_path
from otbuild.prompts import render
from otbuild.settings.recipe import TaskScorer
from otbuild.stagekit import Inputs, StageDef, llm_requests, stage_run, stage_run_shard

TEMPLATES = {"askllm": "askllm.j2", "response_length": "response_length.j2"}


def requests(cfg, inputs: list[Path]):
    """`requests(wanted)` for llm_requests.run_shard: one request per task, in input order."""
    template = TEMPLATES[cfg.kind]

    def wanted_requests(wanted):
        number = 0
        for batch in _batches(inputs, ["instruction"]):
            for instruction in batch.column(0).to_pylist():
                if wanted(number):
                    prompt = render(template, instruction=(instruction or "").strip())
                    yield number, [{"role": "user", "content": prompt}], {}
                number += 1

    return wanted_requests


@stage_run_shard
def run_shard(cfg: TaskScorer, inputs: Inputs, outdir: Path, shard: int) -> None:
    llm_requests.run_shard("task_score", cfg, requests(cfg, inputs), llm_requests.input_rows(inputs), outdir, shard)


@stage_run
def run(cfg: TaskScorer, inputs: Inputs, outdir: Path) -> dict:
    """Merge: the input rows, streamed, with each one's answer as `llm_score`, `llm_response`."""
    total = llm_requests.input_rows(inputs)
    answers = llm_requests.answers(outdir, cfg.shards, total)
    schema = pa.unify_schemas([pq.ParquetFile(p).schema_arrow for p in inputs]) if inputs else pa.schema([])
    out_schema = schema.append(pa.field("llm_score", pa.float64())).append(pa.field("llm_response", pa.string()))
    outcomes: Counter = Counter()
    first_error = None
    with atomic_path(outdir / "tasks.parquet") as tmp, pq.ParquetWriter(tmp, out_schema, compression="zstd") as w:
        for batch in _batches(inputs, schema.names, schema):
            got = [next(answers) for _ in range(batch.num_rows)]
            scores = [score(cfg.kind, a) for a in got]
            for a, s in zip(got, scores):
                outcomes["engine_errors" if a["error"] else "scored" if s is not None else "unscored"] += 1
                first_error = first_error or a["error"]
            texts = [a["error"] or a["text"][:2000] for a in got]
            w.write_table(
                pa.Table.from_batches([batch])
                .append_column("llm_score", pa.array(scores, pa.float64()))
                .append_column("llm_response", pa.array(texts, pa.string()))
            )
    next(answers, None)  # runs the answers' own check: exactly one per task
    if total and not outcomes["scored"]:
        (outdir / "tasks.parquet").unlink()
        why = f"{outcomes['engine_errors']} engine errors (first: {first_error[:300]})" if first_error else ""
        why += ("; " if why and outcomes["unscored"] else "") + (
            f"{outcomes['unscored']} answers without a {cfg.kind} score" if outcomes["unscored"] else ""
        )
        raise RuntimeError(f"task_score: no task of {total} got a score: {why}")
    return {
        "tasks": total,
        "scored": outcomes["scored"],
        "engine_errors": outcomes["engine_errors"],
        "shards": llm_requests.shard_records(outdir, cfg.shards),
        "llm_usage": llm_requests.llm_usage(cfg, outdir),
    }


def score(kind: str, answer: dict) -> float | None:
    if answer["error"]:
        return None
    if kind == "askllm":
        m = re.search(r"\b(100|[1-9][0-9]?)\b", answer["text"])
        return float(m.group(1)) if m else None
    return float(answer["n_output_tokens"] if answer["usage_reported"] else len(answer["text"].split()))


def _batches(inputs: list[Path], columns: list[str], schema: pa.Schema | None = None, rows: int = 1024):
    """The inputs' rows in order, in batches; with `schema`, every batch cast to it (a column an
    input lacks is null)."""
    for path in inputs:
        present = [c for c in columns if c in pq.ParquetFile(path).schema_arrow.names]
        for batch in llm_requests.input_batches([path], present, rows):
            if schema is not None:
                arrays = [
                    batch.column(n) if n in present else pa.nulls(batch.num_rows, f.type)
                    for n, f in zip(schema.names, schema)
                ]
                batch = pa.RecordBatch.from_arrays([a.cast(f.type) for a, f in zip(arrays, schema)], schema=schema)
            yield batch


def estimate(m, n, e) -> None:
    """One request per task."""
    tasks = m.rows_in(n)
    m.requests(n, e, tasks)
    m.rows[n.id] = tasks
    e.counts["tasks"] = tasks


STAGE = StageDef(
    "task_score",
    1,
    ("tasks.parquet",),
    __name__,
    TaskScorer,
    section="task_filter.llm",
    consumes=("tasks",),
    produces="tasks",
    sharded=True,
    llm=True,
    tasks=True,
    estimate=estimate,
)
