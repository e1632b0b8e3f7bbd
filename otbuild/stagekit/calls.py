"""calls.parquet: a shard's captured model calls, one row per call, keyed by (trial, call_idx)
(`trial_name` joins traces.parquet). A trial's calls travel in its record of the shard's
partial file (`_calls`), so they are durable exactly when the trial is: a killed shard loses
no finished trial's calls and a rerun trial's calls replace its earlier ones. The proxy's calls
of a Harbor job have no trial yet (null): their `scope` names the Harbor job they came from; the
calls Harbor's agents report themselves (otbuild/harbor/rollout_detail.py) name their trial."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa

from otbuild import duck
from otbuild.engines.toolcalls import tool_calls_of
from otbuild.fsio import atomic_path
from otbuild.traces.table import assistant_turn, batched

CALL_SCHEMA = pa.schema(
    [
        ("trial", pa.int64()),  # the trial's number in the run (null: a Harbor job's proxy capture, see scope)
        ("trial_name", pa.string()),  # traces.parquet's trial_name
        ("scope", pa.string()),  # the proxy's scope: trial-attempt, or Harbor's job
        ("call_idx", pa.int32()),  # the call's number in its scope, in the order calls came
        ("path", pa.string()),
        ("model", pa.string()),
        ("stream", pa.bool_()),
        ("status", pa.int32()),  # the server's HTTP status; 0: nothing answered
        ("delivered", pa.bool_()),  # the whole answer reached the caller
        ("duration_s", pa.float64()),
        ("request", pa.string()),  # the request body as JSON, secrets masked (messages, tools, sampling)
        # the answer as JSON (a stream assembled; its token ids and the log-probs the proxy asked
        # for are in the columns below: capture/record.py's lean), or the error's body
        ("response", pa.string()),
        ("content", pa.string()),
        ("reasoning", pa.string()),
        ("tool_calls", pa.string()),  # JSON
        ("finish_reason", pa.string()),
        ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("prompt_token_ids", pa.list_(pa.int32())),
        ("completion_token_ids", pa.list_(pa.int32())),
        ("logprobs", pa.list_(pa.float32())),  # each answer token's sampled log-prob
        ("harness_agrees", pa.bool_()),  # the harness's log of this answer is it byte for byte (null: not compared)
    ]
)
CALLS = "calls.parquet"  # a trial stage's calls, beside its traces.parquet
WRITE_OPTIONS = {"compression": "zstd", "write_statistics": ["trial", "trial_name", "scope", "call_idx", "status"]}
BATCH_ROWS = 256


def calls_path(shard_parquet: Path) -> Path:
    """A shard's calls beside its traces: shards/K-of-N.calls.parquet."""
    return shard_parquet.with_suffix(".calls.parquet")


def write_calls(dest: Path, rows: Iterable[dict]) -> int:
    """Write call rows atomically, a batch at a time; returns the count."""
    import pyarrow.parquet as pq

    n = 0
    with atomic_path(dest) as tmp, pq.ParquetWriter(tmp, CALL_SCHEMA, **WRITE_OPTIONS) as out:
        for batch in batched(rows, BATCH_ROWS):
            out.write_table(pa.Table.from_pylist(batch, CALL_SCHEMA))
            n += len(batch)
    return n


def trial_calls(trial: int | None, trace: dict, calls: list[dict], keep_reasoning: bool | None) -> list[dict]:
    """A trial's call rows; with `keep_reasoning` (otbuild's harness: how it wrote the turns),
    each answer the caller received is held against the trace's assistant turns in order: its
    content and its tool calls (id, type, name and arguments byte for byte) both."""
    turns = iter(
        (m["content"], m.get("tool_calls") or None)
        for m in trace.get("conversations") or []
        if m.get("role") == "assistant"
    )
    rows = []
    for call in calls:
        row = {**call, "trial": trial, "trial_name": trace.get("trial_name"), "harness_agrees": None}
        if keep_reasoning is not None and call["status"] == 200 and call["delivered"]:
            turn = next(turns, None)
            answer = assistant_turn(call["content"] or "", call["reasoning"] if keep_reasoning else None)
            row["harness_agrees"] = turn == (answer, captured_tool_calls(call["tool_calls"]))
        rows.append(row)
    return rows


def captured_tool_calls(text: str | None) -> list[dict] | None:
    """A call row's `tool_calls` (the server's, as JSON) in the trace's shape; None: none."""
    return tool_calls_of({"tool_calls": json.loads(text)}) if text else None


def merge_call_files(shard_files: list[Path], dest: Path) -> dict:
    """The shards' calls in one table ordered by (trial, scope, call_idx), sorted by DuckDB
    within its memory cap; returns the counts a stage's stats report."""
    con = duck.connect()
    files = [p for p in shard_files if p.exists()]
    if not files:
        return {}
    source = f"read_parquet([{', '.join(duck.sql_literal(p) for p in files)}])"
    with atomic_path(dest) as tmp:
        con.execute(
            f"COPY (SELECT * FROM {source} ORDER BY trial NULLS LAST, scope, call_idx) "
            f"TO {duck.sql_literal(str(tmp))} (FORMAT parquet, COMPRESSION zstd)"
        )
    calls, errors, disagree, with_ids = con.execute(
        "SELECT count(*), count(*) FILTER (status <> 200), count(*) FILTER (NOT harness_agrees),"
        f" count(*) FILTER (completion_token_ids IS NOT NULL) FROM read_parquet({duck.sql_literal(str(dest))})"
    ).fetchone()  # type: ignore[misc]
    return {"calls": calls, "errors": errors, "harness_disagrees": disagree, "with_token_ids": with_ids}
