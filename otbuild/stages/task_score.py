"""Task score: an LLM score per task in `llm_score`, for the task filter's top-k or budget.

- askllm: the model rates the task from 1 to 100 (the first integer in its answer); an
  answer without one leaves the score null (the filter rejects the row with that reason).
- response_length: a small model answers the task; the score is the length of its answer
  in tokens (the server's count, else whitespace-separated words). The paper found it the
  best task filter signal (+~3pp) and uses it as upsampling weights at scale.
The model's answer is kept in `llm_response` (first 2,000 characters) for audits.
"""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from otbuild.engines import EngineError
from otbuild.engines.batch import complete_all
from otbuild.fsio import atomic_path
from otbuild.prompts import render

TEMPLATES = {"askllm": "askllm.j2", "response_length": "response_length.j2"}


def run(settings: dict, inputs: list[Path], outdir: Path) -> dict:
    table = pa.concat_tables([pq.read_table(p) for p in inputs], promote_options="default")
    template = TEMPLATES[settings["kind"]]
    requests = [([{"role": "user", "content": render(template, instruction=i.strip())}], {})
                for i in table.column("instruction").to_pylist()]
    answers = complete_all(settings, requests)
    scores = [score(settings["kind"], a) for a in answers]
    texts = [f"[{type(a).__name__}] {a}" if isinstance(a, EngineError) else a.text[:2000] for a in answers]
    table = table.append_column("llm_score", pa.array(scores, pa.float64()))
    table = table.append_column("llm_response", pa.array(texts, pa.string()))
    with atomic_path(outdir / "tasks.parquet") as tmp:
        pq.write_table(table, tmp, compression="zstd")
    return {"tasks": table.num_rows, "scored": sum(s is not None for s in scores),
            "engine_errors": sum(isinstance(a, EngineError) for a in answers)}


def score(kind: str, answer) -> float | None:
    if isinstance(answer, EngineError):
        return None
    if kind == "askllm":
        m = re.search(r"\b(100|[1-9][0-9]?)\b", answer.text)
        return float(m.group(1)) if m else None
    return float(answer.n_output_tokens if answer.usage_reported else len(answer.text.split()))
