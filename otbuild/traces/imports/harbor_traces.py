"""Import Harbor's trace export (`export_traces`, behind `harbor traces export`): the table
OpenThoughts-Agent publishes its SFT sets as.

Harbor writes one row per episode of each trial: `conversations` ([{role, content}], the
conversation up to that episode's answer), `agent`, `model`, `model_provider`, `date`, `task`,
`episode` ("episode-N"), `run_id`, `trial_name`, `result` (the reward as text, or the class
name of the trial's exception); with `--sharegpt` also `conversations_sharegpt` ([{from,
value}]), with subagents merged a `trace_source` ("main", or the subagent trajectory's type,
e.g. "summarization-1-summary"), and optionally `instruction` and `verifier_output`.

`episodes: last` (default) keeps each trial's last episode (its whole conversation, as
otbuild's own rollouts and job ingest give it); `all` keeps every row. Subagent rows (a
`trace_source` other than "main") are kept and marked `is_subagent`. `result` gives the reward
when it is a number; otherwise the exception: `AgentTimeoutError` sets `timed_out`, the other
names are `exception`. Rows are read twice (first only the keys that find each trial's last
episode), one row at a time: memory does not grow with the file.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from otbuild.records import iter_file
from otbuild.settings.recipe import HarborTracesOptions
from otbuild.tasks.table import Quarantined
from otbuild.traces.imports._common import ensure_task_text, files, iso, load_task_ids, trace_row
from otbuild.traces.outcome import TIMEOUT_ERRORS

KIND = "harbor-traces"
SUFFIXES = (".parquet", ".jsonl", ".ndjson", ".json")
MAIN = "main"
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
    "tool": "tool",
}
USED = {
    "conversations",
    "conversations_sharegpt",
    "agent",
    "model",
    "model_provider",
    "date",
    "task",
    "episode",
    "run_id",
    "trial_name",
    "result",
    "trace_source",
    "instruction",
}
KEYS = ("run_id", "trial_name", "trace_source", "episode")


def read(path: Path, cfg: HarborTracesOptions) -> Iterator[dict | Quarantined]:
    """Trace rows of an export file, or of every export file in a folder."""
    return read_many(files(Path(path), SUFFIXES), cfg)


def read_many(paths: list[Path], cfg: HarborTracesOptions) -> Iterator[dict | Quarantined]:
    """Trace rows of export files read as one table (a trial's episodes may be spread over a
    dataset's shard files)."""
    last = _last_episodes(paths) if cfg.episodes == "last" else None
    task_ids = load_task_ids(cfg.tasks)
    for f in paths:
        for row in iter_file(f):
            if row.data is None:
                yield Quarantined(row.where, row.reason, row.detail)
                continue
            if last is not None and _is_main(row.data) and _episode(row.data) != last.get(_trial(row.data)):
                continue
            yield convert(row.data, row.where, run_id=cfg.run_id, model=cfg.model, agent=cfg.agent, task_ids=task_ids)


def convert(d: dict, where: str, *, run_id, model, agent, task_ids) -> dict | Quarantined:
    task = d.get("task") or None
    name = d.get("trial_name") or task or where
    conv = _conversation(d)
    if conv is None:
        return Quarantined(name, "missing field", f"{where}: no conversations (or conversations_sharegpt) list")
    if (err := ensure_task_text(conv, d.get("instruction"))) is not None:
        return Quarantined(name, err, f"{where}: no task text for the first user message")
    reward, exception = _outcome(d.get("result"))
    model_name = model or d.get("model")
    agent_name = agent or d.get("agent") or "unknown"
    source = d.get("trace_source") or MAIN
    return trace_row(
        conv,
        kind=KIND,
        agent=agent_name,
        task=task,
        model=model_name,
        model_provider=d.get("model_provider"),
        date=iso(d.get("date")),
        episode=d.get("episode") or None,
        run_id=run_id or d.get("run_id"),
        trial_name=d.get("trial_name"),
        task_id=task_ids.get(task, task) if task else None,
        teacher=f"{agent_name}:{model_name}" if model_name else None,
        reward=reward,
        timed_out=exception in TIMEOUT_ERRORS,
        exception=None if exception in TIMEOUT_ERRORS else exception,
        is_subagent=source != MAIN,
        metadata={"where": where, "trace_source": source, **{k: v for k, v in d.items() if k not in USED}},
    ) | {"result": d.get("result")}  # as Harbor wrote it


def _conversation(d: dict) -> list[dict] | None:
    """{role, content} messages, text as exported: `conversations`, else the ShareGPT column."""
    msgs: Any = d.get("conversations")  # a list, or an array (parquet) with tolist
    if hasattr(msgs, "tolist"):
        msgs = msgs.tolist()
    if isinstance(msgs, list) and msgs and all(isinstance(m, dict) and m.get("role") for m in msgs):
        return [
            {"role": str(m["role"]), "content": "" if m.get("content") is None else str(m["content"])} for m in msgs
        ]
    msgs = d.get("conversations_sharegpt")
    if hasattr(msgs, "tolist"):
        msgs = msgs.tolist()
    if isinstance(msgs, list) and msgs and all(isinstance(m, dict) and m.get("from") in SHAREGPT_ROLES for m in msgs):
        return [
            {"role": SHAREGPT_ROLES[m["from"]], "content": "" if m.get("value") is None else str(m["value"])}
            for m in msgs
        ]
    return None


def _outcome(result) -> tuple[float | None, str | None]:
    """(reward, exception class) from Harbor's `result` text."""
    if result is None or result == "":
        return None, None
    try:
        value = float(result)
    except (TypeError, ValueError):
        return None, str(result)
    return (value if math.isfinite(value) else None), None


def _trial(d: dict) -> tuple:
    return d.get("run_id"), d.get("trial_name")


def _is_main(d: dict) -> bool:
    return (d.get("trace_source") or MAIN) == MAIN


def _episode(d: dict) -> int:
    try:
        return int(str(d.get("episode") or "episode-0").rsplit("-", 1)[-1])
    except ValueError:
        return 0


def _last_episodes(paths: list[Path]) -> dict[tuple, int]:
    """{(run_id, trial_name): its last episode} over the main rows of every file, reading only
    the key columns of parquet files."""
    last: dict[tuple, int] = {}
    for f in paths:
        if f.name.endswith(".parquet"):
            names = set(pq.ParquetFile(f).schema_arrow.names)
            table = pq.read_table(f, columns=[k for k in KEYS if k in names])
            rows = (dict(zip(table.column_names, r)) for r in zip(*(c.to_pylist() for c in table.columns)))
        else:
            rows = (r.data for r in iter_file(f) if r.data is not None)
        for d in rows:
            if _is_main(d):
                key = _trial(d)
                last[key] = max(last.get(key, -1), _episode(d))
    return last
