"""Helpers shared by the trace importers: message normalisation, the task text fallback,
task-id lookup, labels, and building a complete TRACE_SCHEMA row."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from otbuild import records as rows
from otbuild.records import SourceFormatError, iter_rows
from otbuild.tasks.table import Quarantined
from otbuild.traces.table import TRACE_SCHEMA, count_turns

COLUMNS = TRACE_SCHEMA.names


class TraceFormatError(SourceFormatError):
    """A trajectory file that cannot be read; the message names the file and the position."""


def files(path: Path, suffixes: tuple[str, ...]) -> list[Path]:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"trajectory path does not exist: {path}")
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(suffixes))


def load_json(f: Path) -> object:
    return rows.load_json(f, TraceFormatError)


def text_of(content) -> str:
    """Message content as text: strings as they are, content-part lists joined (text parts;
    other parts as a short placeholder), None as ""."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, str):
                parts.append(p)
            elif isinstance(p, dict):
                if isinstance(p.get("text"), str):
                    parts.append(p["text"])
                elif p.get("type"):
                    parts.append(f"[{p['type']}]")
        return "\n".join(parts)
    return json.dumps(content, ensure_ascii=False)


def tool_calls_text(calls) -> str:
    """Tool calls as text, for assistant messages whose content is only tool calls."""
    out = []
    for c in calls or []:
        fn = (c or {}).get("function") or {}
        out.append(json.dumps({"name": fn.get("name"), "arguments": fn.get("arguments")}, ensure_ascii=False))
    return "\n".join(f"<tool_call>{x}</tool_call>" for x in out)


def normalise(messages: Iterable[dict]) -> list[dict]:
    """[{role, content}] with the real text; tool-call-only assistant turns render their calls."""
    out = []
    for m in messages:
        role = str(m.get("role") or "")
        content = text_of(m.get("content"))
        if not content.strip() and m.get("tool_calls"):
            content = tool_calls_text(m["tool_calls"])
        out.append({"role": role, "content": content})
    return out


def ensure_task_text(conv: list[dict], task_text: str | None) -> str | None:
    """Make the conversation's first turn after its system prompt a user turn carrying the
    task: fill it from `task_text` when it is empty, insert one when the conversation starts
    with an answer or has no user turn. Returns an error reason when the task cannot be put
    there (no `task_text`), else None."""
    lead = next((i for i, m in enumerate(conv) if m["role"] != "system"), len(conv))
    opens_with_user = lead < len(conv) and conv[lead]["role"] == "user"
    if opens_with_user and conv[lead]["content"].strip():
        return None
    if task_text and task_text.strip():
        if opens_with_user:
            conv[lead]["content"] = task_text
        else:
            conv.insert(lead, {"role": "user", "content": task_text})
        return None
    return "empty first user message" if opens_with_user else "no user message before the first answer"


def load_task_ids(tasks: str | Path | None) -> dict[str, str]:
    """{task path: task_id} from an otbuild task parquet (or folder of them)."""
    if not tasks:
        return {}
    import pyarrow.parquet as pq

    from otbuild.tasks.harbor_meta import parquet_files

    out: dict[str, str] = {}
    for f in parquet_files(Path(tasks)):
        t = pq.read_table(f, columns=["path", "task_id"])
        out.update(zip(t.column("path").to_pylist(), t.column("task_id").to_pylist()))
    return out


def load_labels(path: Path | None, key: str = "instance_id") -> dict[str, dict]:
    """{instance id: label row} from a labels JSON/JSONL (e.g. mini-swe-agent's labels.jsonl)."""
    if path is None or not Path(path).exists():
        return {}
    return {str(r.data[key]): r.data for r in iter_rows(Path(path)) if r.data and r.data.get(key) is not None}


def iso(ts) -> str | None:
    """ISO 8601 UTC from a unix time or an ISO string; None when unknown."""
    if ts is None or ts == "":
        return None
    if isinstance(ts, (int, float)):
        return datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z")
    return str(ts)


def reward_of(label: dict | None) -> float | None:
    if not label:
        return None
    for key in ("reward", "resolved", "success", "passed"):
        v = label.get(key)
        if isinstance(v, bool):
            return 1.0 if v else 0.0
        if isinstance(v, (int, float)):
            return float(v)
    return None


def trace_row(conversations: list[dict], *, kind: str, agent: str, task: str | None, **fields) -> dict:
    """A complete TRACE_SCHEMA row: every column present, typed columns derived."""
    reward, exception = fields.get("reward"), fields.get("exception")
    row: dict[str, Any] = {c: None for c in COLUMNS}
    row.update(
        conversations=conversations,
        agent=agent,
        task=task,
        episode="episode-0",
        source=f"import:{kind}",
        sample_idx=0,
        n_turns=count_turns(conversations),
        timed_out=False,
        is_subagent=False,
        result=(exception if exception else (None if reward is None else str(reward))),
    )
    for k, v in fields.items():
        if k == "metadata":
            row[k] = json.dumps(v, sort_keys=True, default=str)
        elif k in row and v is not None:
            row[k] = v
    if row["metadata"] is None:
        row["metadata"] = "{}"
    if row["task_id"] is None:
        row["task_id"] = task
    return row


def quarantine(where: str, reason: str, detail: str = "") -> Quarantined:
    return Quarantined(where, reason, detail)


@dataclass(frozen=True)
class SweRun:
    """What each trajectory of an SWE import is read against, looked up by instance id: labels
    (the reward), task ids (from a task parquet), problem statements (from SWE instances); and
    the run id."""

    labels: dict[str, dict]
    task_ids: dict[str, str]
    problems: dict[str, Any]
    run_id: str


def swe_trajectories(
    path: Path, suffix: str, labels: Path | None, tasks, instances, run_id: str | None
) -> Iterator[tuple[object, Path, SweRun]]:
    """For each SWE trajectory file under `path`: its JSON, the file and what it is read against."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    problems = {k: v.get("problem_statement") for k, v in load_labels(Path(instances) if instances else None).items()}
    run = SweRun(load_labels(labels), load_task_ids(tasks), problems, run_id or folder.name)
    for f in files(path, (suffix,)):
        yield load_json(f), f, run
