"""Import mini-swe-agent trajectories (`*.traj.json`, trajectory_format mini-swe-agent-1).

A file holds `messages` ([{role, content, extra?}]: system prompt, the task as the first user
message, then assistant actions and user observations), `info` (exit_status, submission,
model_stats, mini_version, config with model/agent/environment) and `instance_id`.

Options (otbuild/settings/recipe.py MiniSweAgentOptions):
- `labels`: a JSON/JSONL with `instance_id` and `resolved` (or `reward`); default
  `labels.jsonl` beside the trajectories when present. Gives `reward` (1.0/0.0).
- `tasks`: an otbuild task parquet; a task whose `path` is the instance id gives `task_id`
  (else `task_id` is the instance id).
- `instances`: a SWE instances JSON/JSONL; its `problem_statement` fills the first user
  message if a trajectory has it empty (and is recorded in metadata `problem_statement_found`).
- `run_id` (default: the trajectories' folder name), `model` (default: config.model.model_name),
  `agent` (default "mini-swe-agent").

Columns: `date` is the first model response's `created` time; token counts sum the responses'
`usage`; `timed_out` when exit_status names a timeout; `exception` is exit_status unless it is
Submitted/LimitsExceeded (those are the agent's own outcome, not infrastructure).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from otbuild.settings.recipe import MiniSweAgentOptions
from otbuild.tasks.table import Quarantined
from otbuild.traces.imports._common import (
    SweRun,
    ensure_task_text,
    iso,
    normalise,
    reward_of,
    swe_trajectories,
    trace_row,
)  # fmt: skip

KIND = "mini-swe-agent"
AGENT_OUTCOMES = {"Submitted", "LimitsExceeded"}


def read(path: Path, cfg: MiniSweAgentOptions) -> Iterator[dict | Quarantined]:
    folder = Path(path) if Path(path).is_dir() else Path(path).parent
    labels = Path(cfg.labels) if cfg.labels else folder / "labels.jsonl"
    for item in swe_trajectories(path, ".traj.json", labels, cfg.tasks, cfg.instances, cfg.run_id):
        yield convert(*item, cfg.model, cfg.agent)


def convert(d, f: Path, run: SweRun, model, agent) -> dict | Quarantined:
    name = f.name.removesuffix(".traj.json")
    if not isinstance(d, dict) or not isinstance(d.get("messages"), list):
        return Quarantined(name, "missing field", f"{f}: no messages list")
    if any(not isinstance(m, dict) or "role" not in m for m in d["messages"]):
        return Quarantined(name, "bad messages", f"{f}: a message without a role")
    iid = str(d.get("instance_id") or name)
    info = v if isinstance(v := d.get("info"), dict) else {}
    config = v if isinstance(v := info.get("config"), dict) else {}
    model_cfg = v if isinstance(v := config.get("model"), dict) else {}
    model_name = model or model_cfg.get("model_name")
    conv = normalise(d["messages"])
    problem = run.problems.get(iid)
    if (err := ensure_task_text(conv, problem)) is not None:
        return Quarantined(iid, err, f"{f}: the task text is not in the trajectory and no instances were given")
    responses = [
        ((m.get("extra") or {}).get("response") or {}) for m in d["messages"] if isinstance(m.get("extra"), dict)
    ]
    usage = [r.get("usage") or {} for r in responses if isinstance(r, dict)]
    n_in = sum(u.get("prompt_tokens") or 0 for u in usage) if usage else None
    n_out = sum(u.get("completion_tokens") or 0 for u in usage) if usage else None
    created = next((r.get("created") for r in responses if isinstance(r, dict) and r.get("created")), None)
    status = str(info.get("exit_status") or "")
    label = run.labels.get(iid)
    model_type = str(config.get("model_type") or "")
    provider = model_type.rsplit(".", 1)[-1].removesuffix("Model").lower() or None
    if not provider and model_name and "/" in model_name:
        provider = model_name.split("/", 1)[0]
    stats = info.get("model_stats") or {}
    return trace_row(
        conv, kind=KIND, agent=agent, task=iid,
        model=model_name, model_provider=provider, date=iso(created), run_id=run.run_id, trial_name=name,
        task_id=run.task_ids.get(iid, iid), teacher=f"{agent}:{model_name}" if model_name else None,
        reward=reward_of(label), timed_out="timeout" in status.lower(),
        exception=None if status in AGENT_OUTCOMES or not status else status,
        n_input_tokens=n_in, n_output_tokens=n_out,
        metadata={
            "file": f.name, "instance_id": iid, "exit_status": status or None, "submission": info.get("submission"),
            "model_stats": stats, "agent_version": info.get("mini_version"),
            "trajectory_format": d.get("trajectory_format"), "agent_type": config.get("agent_type"),
            "model_kwargs": model_cfg.get("model_kwargs"), "label": label,
            "environment_image": (config.get("environment") or {}).get("image")
            if isinstance(config.get("environment"), dict) else None,
            "problem_statement_found": bool(problem),
        },
    )  # fmt: skip
