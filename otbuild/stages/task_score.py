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

from otbuild.prompts import render
from otbuild.settings.recipe import TaskScorer
from otbuild.stagekit import Inputs, StageDef, llm_requests, stage_run, stage_run_shard

TEMPLATES = {"askllm": "askllm.j2", "response_length": "response_length.j2"}


def requests(cfg, inputs: list[Path]):
    """One request per task, in input order: the kind's prompt on its instruction."""
    return llm_requests.one_per_task(inputs, lambda text: render(TEMPLATES[cfg.kind], instruction=text))


@stage_run_shard
def run_shard(cfg: TaskScorer, inputs: Inputs, outdir: Path, shard: int) -> None:
    llm_requests.run_shard("task_score", cfg, requests(cfg, inputs), llm_requests.input_rows(inputs), outdir, shard)


@stage_run
def run(cfg: TaskScorer, inputs: Inputs, outdir: Path) -> dict:
    """Merge: the input rows, streamed, with each one's answer as `llm_score`, `llm_response`."""
    outcomes: Counter = Counter()
    first_error = None

    def columns(got: list[dict]) -> list[list]:
        nonlocal first_error
        scores = [score(cfg.kind, a) for a in got]
        for a, s in zip(got, scores):
            outcomes["engine_errors" if a["error"] else "scored" if s is not None else "unscored"] += 1
            first_error = first_error or a["error"]
        return [scores, [a["error"] or a["text"][:2000] for a in got]]

    fields = [pa.field("llm_score", pa.float64()), pa.field("llm_response", pa.string())]
    total = llm_requests.write_answered(inputs, outdir, cfg.shards, fields, columns)
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
    estimate="request_per_task",
)
