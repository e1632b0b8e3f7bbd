"""Harbor's RolloutDetail <-> calls.parquet rows (otbuild/stagekit/calls.py: CALL_SCHEMA).

Harbor keeps the token ids of a trial's model calls in its result.json, as the agent reported
them (`agent_result.rollout_details`; a multi-step trial's under each `step_results[i]`): a list
of segments, the first the main agent's linear chat, the others its subagents' (terminus-2's
summarization calls). Each segment holds per call (turn) `prompt_token_ids` (the whole prompt as
the server tokenized it), `completion_token_ids` and `logprobs`, index-aligned; terminus-2 fills
them when its `collect_rollout_details` asks the server for them (vLLM's `return_token_ids`).

Imported, each turn is one call row: `trial_name` the trial's, `scope` the segment
(`rollout_details/K`, a step's `steps/NAME/rollout_details/K`), `call_idx` the call's number
in the trial, counted on across segments. Exported, each trial's rows are its segments again:
one JSON line per trial, `{"trial_name", "agent_result": {"rollout_details": [...],
"n_input_tokens", "n_output_tokens"}}`, `agent_result` being Harbor's AgentContext.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from otbuild import duck
from otbuild.fsio import atomic_path

SCOPE = "rollout_details/{k}"
RANGE_IDS = 20_000_000  # token ids the export sorts at once (4 bytes each in DuckDB)
FIELDS = ("prompt_token_ids", "completion_token_ids", "logprobs")


def trial_calls(result: dict, trial_name: str | None = None) -> list[dict]:
    """The call rows of a trial's result.json (its dict); [] when it reports no rollout details."""
    name = trial_name or result.get("trial_name")
    model = ((result.get("agent_info") or {}).get("model_info") or {}).get("name")
    contexts = [("", result.get("agent_result"))]
    contexts += [(f"steps/{s.get('step_name')}/", s.get("agent_result")) for s in result.get("step_results") or []]
    rows: list[dict] = []
    for prefix, context in contexts:
        details = (context or {}).get("rollout_details") if isinstance(context, dict) else None
        for k, detail in enumerate(details if isinstance(details, list) else []):
            for turn in _turns(detail):
                rows.append(_row(name, prefix + SCOPE.format(k=k), len(rows), model, turn))
    return rows


def _turns(detail) -> Iterator[dict]:
    """A segment's calls: the n-th entry of each per-call list (a list shorter than the others,
    as when the server gave no log-probs, leaves that field null)."""
    if not isinstance(detail, dict):
        return
    lists: dict[str, list] = {f: v if isinstance(v := detail.get(f), list) else [] for f in FIELDS}
    for i in range(max(len(v) for v in lists.values())):
        yield {f: _numbers(v[i]) if i < len(v) else None for f, v in lists.items()}


def _numbers(value) -> list | None:
    return list(value) if isinstance(value, list) else None


def _row(trial_name: str | None, scope: str, idx: int, model: str | None, turn: dict) -> dict:
    prompt, completion = turn["prompt_token_ids"], turn["completion_token_ids"]
    return {
        "trial": None,
        "trial_name": trial_name,
        "scope": scope,
        "call_idx": idx,
        "path": None,
        "model": model,
        "stream": None,
        "status": 200,  # Harbor records the calls that were answered
        "delivered": True,
        "duration_s": None,
        "request": None,
        "response": None,
        "content": None,
        "reasoning": None,
        "tool_calls": None,
        "finish_reason": None,
        "prompt_tokens": None if prompt is None else len(prompt),
        "completion_tokens": None if completion is None else len(completion),
        **turn,
        "harness_agrees": None,
    }


# -- export ----------------------------------------------------------------------------------
def write_rollout_details(calls: Path, dest: Path, range_ids: int = RANGE_IDS) -> dict:
    """calls.parquet as Harbor's rollout details, one JSON line per trial at `dest` (written
    atomically), its trials in name order and each trial's segments in the order its calls
    came. Only answered calls with completion token ids go; calls matched to no trial (a
    Harbor job's proxy capture) are counted, not written. The trials are sorted a range at a
    time, each range's token ids about `range_ids` (DuckDB sorts long id lists within its
    memory cap only when they fit it). Returns the counts."""
    con = duck.connect()
    src = f"read_parquet({duck.sql_literal(str(calls))})"
    kept = "status = 200 AND completion_token_ids IS NOT NULL"
    con.execute(  # each segment's first call (the segments' order in their trial) and its ids
        "CREATE TEMP TABLE segment AS SELECT trial_name, scope, min(call_idx) AS first, "
        "sum(coalesce(len(prompt_token_ids), 0) + 2 * len(completion_token_ids)) AS ids "
        f"FROM {src} WHERE {kept} AND trial_name IS NOT NULL GROUP BY ALL"
    )
    counts = {"trials": 0, "calls": 0, "segments": 0}
    with atomic_path(dest) as tmp, open(tmp, "w") as out:
        for first, last in list(_ranges(con, range_ids)):  # a pair per range, all read before the first range's query
            cur = con.execute(
                f"SELECT c.trial_name, c.scope, prompt_token_ids, completion_token_ids, logprobs FROM {src} c "
                "JOIN segment s ON c.trial_name = s.trial_name AND c.scope IS NOT DISTINCT FROM s.scope "
                f"WHERE {kept} AND c.trial_name BETWEEN ? AND ? ORDER BY c.trial_name, s.first, c.scope, c.call_idx",
                [first, last],
            )
            for trial_name, segments in _trials(cur):
                out.write(json.dumps({"trial_name": trial_name, "agent_result": _context(segments)}) + "\n")
                counts["trials"] += 1
                counts["segments"] += len(segments)
                counts["calls"] += sum(len(s["completion_token_ids"]) for s in segments)
    (counts["no_trial"], counts["without_token_ids"]) = con.execute(
        f"SELECT count(*) FILTER ({kept} AND trial_name IS NULL), count(*) FILTER (NOT ({kept})) FROM {src}"
    ).fetchone()  # type: ignore[misc]
    return counts


def _ranges(con, range_ids: int) -> Iterator[tuple[str, str]]:
    """(first, last) trial names of consecutive ranges of trials holding about `range_ids`
    token ids each (a trial over it is a range of its own)."""
    cur = con.execute("SELECT trial_name, sum(ids) FROM segment GROUP BY trial_name ORDER BY trial_name")
    first: str | None = None
    last, held = "", 0
    while rows := cur.fetchmany(4096):
        for name, ids in rows:
            if first is not None and held + ids > range_ids:
                yield first, last
                first, held = None, 0
            first = name if first is None else first
            last, held = name, held + ids
    if first is not None:
        yield first, last


def _trials(cur, batch: int = 1024) -> Iterator[tuple[str, list[dict]]]:
    """(trial_name, its segments) from the ordered rows, a batch at a time: one trial's calls
    are held at once, never the table's."""
    name: str = ""
    scope: str | None = None
    segments: list[dict] = []
    while rows := cur.fetchmany(batch):
        for trial_name, sc, prompt, completion, logprobs in rows:
            if trial_name != name:
                if segments:
                    yield name, segments
                name, scope, segments = trial_name, None, []
            if sc != scope:
                segments.append({f: [] for f in FIELDS})
                scope = sc
            seg = segments[-1]
            seg["prompt_token_ids"].append(prompt or [])
            seg["completion_token_ids"].append(completion)
            seg["logprobs"].append(logprobs or [])
    if segments:
        yield name, segments


def _context(segments: list[dict]) -> dict:
    """Harbor's AgentContext of a trial's segments (a field no call filled is left out)."""
    details = [{f: seg[f] for f in FIELDS if any(seg[f])} for seg in segments]
    return {
        "n_input_tokens": sum(len(p) for seg in segments for p in seg["prompt_token_ids"]),
        "n_output_tokens": sum(len(c) for seg in segments for c in seg["completion_token_ids"]),
        "rollout_details": details,
    }
