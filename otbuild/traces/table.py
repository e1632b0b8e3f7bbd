"""The trace parquet: Harbor's export columns plus typed columns otbuild filters on.

Every trace source (otbuild's own rollouts, Harbor job dirs, imported trajectories) writes
rows of this schema, and counts turns the same way (`count_turns`), so `min_turns` means the
same thing whatever produced the trace.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from otbuild.fsio import atomic_path

# An assistant message's native tool calls, as the OpenAI protocol has them (`arguments`: the
# model's JSON text, byte for byte).
FUNCTION = pa.struct([("name", pa.string()), ("arguments", pa.string())])
TOOL_CALL = pa.struct([("id", pa.string()), ("type", pa.string()), ("function", FUNCTION)])
# A message: Harbor's {role, content}, plus an assistant's `tool_calls` and a `tool` message's
# `tool_call_id` (null on every other message: a terminus-2 trace has neither).
MESSAGE = pa.struct(
    [
        ("role", pa.string()),
        ("content", pa.string()),
        ("tool_calls", pa.list_(TOOL_CALL)),
        ("tool_call_id", pa.string()),
    ]
)

TRACE_SCHEMA = pa.schema(
    [
        # Harbor's export columns
        ("conversations", pa.list_(MESSAGE)),
        ("agent", pa.string()),
        ("model", pa.string()),
        ("model_provider", pa.string()),
        ("date", pa.string()),  # ISO 8601, UTC
        ("task", pa.string()),  # the task's Harbor `path`
        ("episode", pa.string()),  # "episode-N": the last episode of the trial
        ("run_id", pa.string()),
        ("trial_name", pa.string()),
        # reward as text (`reward_text`: "1.0"), or the exception's class name
        # (ContextLengthExceededError: a task failure whose reward is 0, as Harbor exports it)
        ("result", pa.string()),
        # the tools the model was offered: a JSON array of OpenAI tool definitions (null: none,
        # as in every terminus-2 trace)
        ("tools", pa.string()),
        # typed columns
        ("task_id", pa.string()),
        ("source", pa.string()),  # task source, or the importer for imported traces
        ("teacher", pa.string()),  # engine:model
        ("sample_idx", pa.int32()),
        ("n_turns", pa.int32()),
        ("reward", pa.float64()),  # null when the verifier did not produce one
        ("timed_out", pa.bool_()),
        ("exception", pa.string()),  # the error's class (null for otbuild's task failures: `result`
        # names them); how a trial ended is otbuild/traces/outcome.py's outcome of these columns
        ("is_subagent", pa.bool_()),
        ("n_input_tokens", pa.int64()),
        ("n_output_tokens", pa.int64()),
        ("duration_s", pa.float64()),
        ("metadata", pa.string()),  # JSON object
    ]
)


# Columns (and `column.key`: a key of a JSON column's objects, at any depth) that measure a run
# rather than follow from its inputs: a rebuild from the same inputs gives other values. Declared
# once, here, for every trace table; `otbuild audit --rebuild` and the two-build test set them
# aside (docs/reproducibility.md).
VOLATILE_COLUMNS = {
    "date": "when the trial started: the wall clock",
    "duration_s": "how long the trial took: the machine's speed and load",
    "metadata.verifier_s": "the verifier's seconds (the trial's and each step's): the machine's speed and load",
    "metadata.timings": "a Harbor trial's phase durations: the machine's speed and load",
}


def assistant_turn(text: str, reasoning: str | None = None) -> str:
    """An assistant message of a trace: the model's answer byte for byte, its reasoning (a
    reasoning parser's text) before it as Harbor exports it: `<think>REASONING</think>\nTEXT`.
    Both harnesses write turns through this, so both give the same bytes."""
    return f"<think>{reasoning}</think>\n{text}" if reasoning else text


def reward_text(reward: float) -> str:
    """A reward as a row's `result`, as Harbor's export writes it: Python's str of the float
    ("1.0", "0.0", "0.5")."""
    return str(float(reward))


def step_conversations(conversation: list[dict], metadata: str | None) -> list[list[dict]]:
    """A trace's conversation as the model was sent it: a multi-step trial's steps (its
    metadata's `steps`, each with its `first_message` in the trace's) each began a conversation
    of their own, so each is one; any other trace is itself."""
    try:
        steps = json.loads(metadata or "{}").get("steps")
    except (ValueError, AttributeError):
        return [conversation]
    starts = (
        sorted(
            {
                s["first_message"]
                for s in steps
                if isinstance(s, dict)
                and isinstance(s.get("first_message"), int)
                and 0 < s["first_message"] < len(conversation)
            }
        )
        if isinstance(steps, list)
        else []
    )
    bounds = [0, *starts, len(conversation)]
    return [conversation[a:b] for a, b in itertools.pairwise(bounds)]


def count_turns(conversations: list[dict]) -> int:
    """A turn is one assistant message: the model acted once (with text, tool calls or both;
    a `tool` message answering its calls is not one)."""
    return sum(1 for m in conversations if m.get("role") == "assistant")


# Rows held in memory at once when writing traces (~110 KB each at the paper's scale): one
# parquet row group. Memory is bounded by this, not by the number of traces.
BATCH_ROWS = 256
# No min/max statistics for the message texts (up to 4 KB each per column chunk, useless for
# filtering): they made the metadata of 64 open shard files grow with the trace count.
WRITE_OPTIONS = {"compression": "zstd", "write_statistics": [n for n in TRACE_SCHEMA.names if n != "conversations"]}


def write_traces(dest: Path, rows: Iterable[dict], batch_rows: int = BATCH_ROWS) -> int:
    """Write trace rows (dicts with TRACE_SCHEMA's keys) atomically, `batch_rows` at a time;
    returns the count."""
    with atomic_path(dest) as tmp, pq.ParquetWriter(tmp, TRACE_SCHEMA, **WRITE_OPTIONS) as out:
        return sum(out.write_table(pa.Table.from_pylist(b, TRACE_SCHEMA)) or len(b) for b in batched(rows, batch_rows))


def batched(items: Iterable, n: int) -> Iterator[list]:
    """Lists of up to n items, in order (the last may be shorter; none when there are none)."""
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch
