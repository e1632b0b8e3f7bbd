"""Import SWE-agent trajectories (`*.traj`: JSON with `history`, `trajectory`, `info`).

The conversation is `history` ([{role, content, agent, message_type, tool_calls?, ...}]; content
a string or a list of content parts). One row per agent in the history: the agent of the
first message is the main one; messages of any other agent (e.g. a reviewer or a summariser)
make their own row with `is_subagent` True, so a trace filter can drop them. `trajectory`
(steps with action/observation/thought) is summarised in metadata (`n_steps`).

Options (otbuild/settings/recipe.py SweAgentOptions):
- `labels`: JSON/JSONL of `instance_id` + `resolved`/`reward` (key: the file stem), for `reward`;
- `tasks`: an otbuild task parquet, for `task_id` by task path (= file stem);
- `instances`: SWE instances JSON/JSONL whose `problem_statement` fills an empty first user
  message (by the file stem as instance id);
- `run_id` (default: the folder name), `model` (default: `replay_config` agent.model.name when
  the file has it), `agent` (default "swe-agent").

`exception` is info.exit_status when it names an error (e.g. exit_environment_error);
`timed_out` when it names a timeout; token counts come from info.model_stats when the run
made API calls (human demonstrations have zeros and get nulls).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from otbuild.settings.recipe import SweAgentOptions
from otbuild.tasks.table import Quarantined
from otbuild.traces.imports._common import (
    SweRun,
    ensure_task_text,
    normalise,
    reward_of,
    swe_trajectories,
    trace_row,
)  # fmt: skip

KIND = "swe-agent"


def read(path: Path, cfg: SweAgentOptions) -> Iterator[dict | Quarantined]:
    labels = Path(cfg.labels) if cfg.labels else None
    for item in swe_trajectories(path, ".traj", labels, cfg.tasks, cfg.instances, cfg.run_id):
        yield from convert(*item, cfg.model, cfg.agent)


def _model_from_replay(d: dict) -> str | None:
    rc = d.get("replay_config")
    if isinstance(rc, str):
        try:
            rc = json.loads(rc)
        except json.JSONDecodeError:
            return None
    if isinstance(rc, dict):
        m = (rc.get("agent") or {}).get("model") or {}
        return m.get("name") or m.get("model_name")
    return None


def convert(d, f: Path, run: SweRun, model, agent) -> Iterator[dict | Quarantined]:
    name = f.name.removesuffix(".traj")
    if not isinstance(d, dict) or not isinstance(d.get("history"), list) or not d["history"]:
        yield Quarantined(name, "missing field", f"{f}: no history list")
        return
    history = d["history"]
    if any(not isinstance(m, dict) or "role" not in m for m in history):
        yield Quarantined(name, "bad messages", f"{f}: a history entry without a role")
        return
    info = v if isinstance(v := d.get("info"), dict) else {}
    stats = v if isinstance(v := info.get("model_stats"), dict) else {}
    status = str(info.get("exit_status") or "")
    model_name = model or _model_from_replay(d)
    calls = stats.get("api_calls") or 0
    agents = list(dict.fromkeys(str(m.get("agent") or "main") for m in history))
    for ai, agent_name in enumerate(agents):
        conv = normalise(m for m in history if str(m.get("agent") or "main") == agent_name)
        trial = name if ai == 0 else f"{name}:{agent_name}"
        if (err := ensure_task_text(conv, run.problems.get(name))) is not None:
            yield Quarantined(trial, err, f"{f}: agent {agent_name!r}: the task text is not in the history")
            continue
        yield trace_row(
            conv, kind=KIND, agent=agent, task=name, model=model_name,
            model_provider=model_name.split("/", 1)[0] if model_name and "/" in model_name else None,
            run_id=run.run_id, trial_name=trial, task_id=run.task_ids.get(name, name),
            teacher=f"{agent}:{model_name}" if model_name else None,
            reward=reward_of(run.labels.get(name)), is_subagent=ai > 0,
            timed_out="timeout" in status.lower(),
            exception=status if "error" in status.lower() else None,
            n_input_tokens=stats.get("tokens_sent") if calls else None,
            n_output_tokens=stats.get("tokens_received") if calls else None,
            metadata={
                "file": f.name, "agent_name": agent_name, "exit_status": status or None,
                "submission": info.get("submission"), "model_stats": stats, "environment": d.get("environment"),
                "n_steps": len(d.get("trajectory") or []), "label": run.labels.get(name),
                "message_types": sorted({str(m.get("message_type")) for m in history if m.get("message_type")}),
            },
        )  # fmt: skip
