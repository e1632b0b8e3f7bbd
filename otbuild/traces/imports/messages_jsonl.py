"""Import OpenAI-style chat conversations: JSONL (or JSON/parquet) with one conversation per
row under `messages` ([{role, content, tool_calls?}]; content a string or content parts).

Optional row fields used when present: `instance_id`/`task_id`/`id`/`task` (the task),
`problem_statement`/`instruction`/`prompt` (fills an empty first user message), `model`,
`agent`, `reward`/`resolved` (reward), `run_id`, `trial_name`, `date`/`created_at`,
`timed_out`, `exception`, `is_subagent`, `n_input_tokens`/`n_output_tokens`, `duration_s`;
every other field goes to metadata.

Options (MessagesOptions, otbuild/settings/recipe.py): `agent` (default "unknown"; e.g.
"swe-agent" for SWE-smith's SFT files), `model`, `model_provider`, `run_id` (default: the row's,
else the file stem), `tasks` (an otbuild task parquet, for `task_id` by task path). A
malformed line raises SourceFormatError naming the file and line; a row without a messages
list, or whose task text is missing, is quarantined.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from otbuild.records import first_text, iter_rows
from otbuild.settings.recipe import MessagesOptions
from otbuild.tasks.table import Quarantined
from otbuild.traces.imports._common import (
    ensure_task_text,
    iso,
    load_task_ids,
    normalise,
    reward_of,
    trace_row,
)

KIND = "messages-jsonl"
TASK_KEYS = ("instance_id", "task_id", "id", "task")
TEXT_KEYS = ("problem_statement", "instruction", "prompt")
USED = {
    "messages",
    *TASK_KEYS,
    *TEXT_KEYS,
    "model",
    "agent",
    "reward",
    "resolved",
    "run_id",
    "trial_name",
    "date",
    "created_at",
    "timed_out",
    "exception",
    "is_subagent",
    "n_input_tokens",
    "n_output_tokens",
    "duration_s",
}


def read(path: Path, cfg: MessagesOptions) -> Iterator[dict | Quarantined]:
    task_ids = load_task_ids(cfg.tasks)
    for row in iter_rows(Path(path), (".jsonl", ".ndjson", ".json", ".parquet")):
        if row.data is None:
            yield Quarantined(row.where, row.reason, row.detail)
            continue
        yield convert(row.data, row.where, cfg, task_ids)


def convert(d: dict, where: str, cfg: MessagesOptions, task_ids: dict[str, str]) -> dict | Quarantined:
    msgs: Any = d.get("messages")  # a list, or an array (parquet) with tolist
    if hasattr(msgs, "tolist"):
        msgs = msgs.tolist()
    task = first_text(d, TASK_KEYS)
    if not isinstance(msgs, list) or not msgs:
        return Quarantined(task or where, "missing field", f"{where}: no messages list")
    if any(not isinstance(m, dict) or not m.get("role") for m in msgs):
        return Quarantined(task or where, "bad messages", f"{where}: a message without a role")
    conv = normalise(msgs)
    if (err := ensure_task_text(conv, first_text(d, TEXT_KEYS))) is not None:
        return Quarantined(task or where, err, f"{where}: no task text to put in the first user message")
    model_name = cfg.model or d.get("model")
    provider = cfg.model_provider or (model_name.split("/", 1)[0] if model_name and "/" in model_name else None)
    label = {k: d[k] for k in ("reward", "resolved") if k in d}
    file_stem = where.split(":", 1)[0].split("[", 1)[0].rsplit(".", 1)[0]
    return trace_row(
        conv, kind=KIND, agent=str(d.get("agent") or cfg.agent), task=task, model=model_name,
        model_provider=provider,
        date=iso(d.get("date") or d.get("created_at")), run_id=cfg.run_id or d.get("run_id") or file_stem,
        trial_name=d.get("trial_name") or (f"{task}" if task else where),
        task_id=task_ids.get(task, task) if task else None,
        teacher=f"{d.get('agent') or cfg.agent}:{model_name}" if model_name else None,
        reward=reward_of(label), timed_out=bool(d.get("timed_out")), exception=d.get("exception"),
        is_subagent=bool(d.get("is_subagent")), n_input_tokens=d.get("n_input_tokens"),
        n_output_tokens=d.get("n_output_tokens"), duration_s=d.get("duration_s"),
        metadata={"where": where, **{k: v for k, v in d.items() if k not in USED}},
    )  # fmt: skip
