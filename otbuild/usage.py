"""LLM usage: requests, errors and tokens per model, as a stage records them in its stats
(`llm_usage`), summed by DuckDB from what the stage kept.

Tokens are the server's own counts (the OpenAI-compatible `usage` field: `prompt_tokens`,
`completion_tokens`); a server that sends no `usage` counts 0 and the request is counted in
`usage_missing`. LLM request stages (augment, task_score) count one request per answer kept
(errors: answers that failed after the engine's retries). Trace stages (rollouts, eval) count
one request per assistant turn plus the one that ended a trial: an engine error (after
retries) or a conversation over the context window; those are the errors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from otbuild import duck

if TYPE_CHECKING:
    from otbuild.settings.recipe import Price

KEYS = ("requests", "errors", "input_tokens", "output_tokens")
# A trial's last request failed: the engine gave up (its exception; ServerDiedError: its own
# server died under it, otbuild/engines/managed.py), or the conversation outgrew the context
# window (its result: a task failure, as Harbor records it).
ENGINE_GAVE_UP, OVER_CONTEXT = ("EngineError", "ServerDiedError"), "ContextLengthExceededError"
FAILED_REQUEST = f"exception IN ({', '.join(repr(e) for e in ENGINE_GAVE_UP)}) OR result = '{OVER_CONTEXT}'"


def of_answers(files: list[Path], model: str) -> dict[str, dict[str, int]]:
    """The answers of an LLM request stage (its shard parquets), all from one model."""
    if not files:
        return {}
    src = f"read_parquet([{', '.join(duck.sql_literal(p) for p in files)}], union_by_name = true)"
    con = duck.connect()
    cols = {r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {src}").fetchall()}
    n_in = "n_input_tokens" if "n_input_tokens" in cols else "0"  # shards written before it was kept
    row = con.execute(f"""SELECT count(*), count(error), coalesce(sum({n_in}), 0),
                                 coalesce(sum(n_output_tokens), 0), count(*) FILTER (WHERE NOT usage_reported)
                          FROM {src}""").fetchall()[0]
    return {model: dict(zip((*KEYS, "usage_missing"), map(int, row)))} if row[0] else {}


def of_traces(path: Path) -> dict[str, dict[str, int]]:
    """The trials of a rollout or eval (traces.parquet), per `teacher` (engine:model)."""
    con = duck.connect()
    rows = con.execute(f"""SELECT teacher, sum(n_turns) + count(*) FILTER (WHERE {FAILED_REQUEST}),
                                  count(*) FILTER (WHERE {FAILED_REQUEST}),
                                  coalesce(sum(n_input_tokens), 0), coalesce(sum(n_output_tokens), 0)
                           FROM read_parquet({duck.sql_literal(path)}) GROUP BY teacher ORDER BY teacher""").fetchall()
    return {str(model): dict(zip(KEYS, map(int, r))) for model, *r in rows}


def engines_of_traces(path: Path) -> dict[str, str | None]:
    """Who answered a rollout's or eval's trials: per `teacher` (engine:model), the engine's
    release where it said it (a managed server's `metadata.engine_version`), else None."""
    rows = (
        duck.connect()
        .execute(f"""SELECT teacher, max(json_extract_string(metadata, '$.engine_version'))
                                      FROM read_parquet({duck.sql_literal(path)}) GROUP BY teacher
                                      ORDER BY teacher""")
        .fetchall()
    )
    return {str(model): version for model, version in rows}


def of_trial(row: dict) -> dict[str, int]:
    """One trial's trace row (RL rollouts, which keep no trace table): as `of_traces` counts it."""
    failed = int(row.get("exception") in ENGINE_GAVE_UP or row.get("result") == OVER_CONTEXT)
    return {
        "requests": (row.get("n_turns") or 0) + failed,
        "errors": failed,
        "input_tokens": row.get("n_input_tokens") or 0,
        "output_tokens": row.get("n_output_tokens") or 0,
    }


def rollout_engines(path: Path) -> list[str]:
    """The engines an RL run's rollouts ran on (`rollout_engine` of its train_log.jsonl), in order."""
    seen: dict[str, None] = {}
    for line in Path(path).read_text().splitlines() if Path(path).exists() else []:
        if engine := json.loads(line).get("rollout_engine"):
            seen[engine] = None
    return list(seen)


def of_log(path: Path, model: str) -> dict[str, dict[str, int]]:
    """An RL run's rollouts: the `rollout_*` counts of its train_log.jsonl, summed over steps."""
    total = dict.fromkeys(KEYS, 0)
    for line in Path(path).read_text().splitlines() if Path(path).exists() else []:
        rec = json.loads(line)
        for key in KEYS:
            total[key] += int(rec.get(f"rollout_{key}") or 0)
    return {model: total} if total["requests"] else {}


def cost(usage: dict[str, int], price: Price | None) -> float | None:
    """US dollars (or whatever unit the prices are in) for one model's usage; None without a price."""
    if price is None:
        return None
    return (usage["input_tokens"] * price.input_per_mtok + usage["output_tokens"] * price.output_per_mtok) / 1e6
