"""Harbor job dirs and trial dirs -> trace rows (otbuild/traces/table.py: TRACE_SCHEMA).

A Harbor job dir (`harbor run -o JOBS --job-name NAME` -> `JOBS/NAME/`) holds `config.json`
(the JobConfig), `result.json` (stats), `job.log`, and one dir per trial
(`<task>__<id>/`) with:

    config.json           the TrialConfig (task path, agent, environment)
    result.json           TrialResult: task_name, trial_name, agent_info{name, version,
                          model_info{name, provider}}, agent_result{n_input_tokens,
                          n_output_tokens, n_cache_tokens, cost_usd, metadata, rollout_details
                          (per model call the token ids and log-probs: read_job_calls)},
                          verifier_result
                          {rewards{reward, ...}}, exception_info{exception_type, message,
                          traceback}, started_at/finished_at and per-phase timings
    agent/trajectory.json ATIF (schema_version "ATIF-v1.x"): steps[{source user|system|agent,
                          message, observation{results[{content}]}, metrics}], continued in
                          trajectory.cont-*.json (`continued_trajectory_ref`); subagent
                          (summarisation) trajectories beside them. terminus-2 writes it;
                          the oracle writes agent/oracle.txt (solve.sh's output) instead.
    agent/*.pane          terminus-2's last screen
    verifier/reward.txt | reward.json, verifier/test-stdout.txt
    exception.txt         the traceback, when the trial raised

One row per trial: the main conversation (`episode` names the last episode; a trajectory
continued over context windows gives its last window: `_conversation`). Assistant turns are
the step messages (the model's raw answers in the jobs otbuild runs) with their reasoning
before them, written as otbuild's harness writes them (`traces.table.assistant_turn`).
Rows keep the real text: the conversation starts with the user turn that holds the task
(the instruction from the task dir when the trajectory has none, or an empty one), infra
errors and agent timeouts are apart from task failures (`exception`, `timed_out`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from otbuild.harbor.rollout_detail import trial_calls
from otbuild.traces.imports._common import ensure_task_text
from otbuild.traces.outcome import TIMEOUT_ERRORS, UNVERIFIED_REASON
from otbuild.traces.table import TRACE_SCHEMA, assistant_turn, count_turns, reward_text


def is_trial_dir(path: Path) -> bool:
    """A trial dir has a result.json naming its trial (a job's result.json does not)."""
    return _is_trial_result(Path(path))


def _is_trial_result(path: Path) -> bool:
    try:
        data = json.loads((Path(path) / "result.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "trial_name" in data


def trial_dirs(job_dir: Path) -> list[Path]:
    """The job's trial dirs (those with a trial result.json), sorted by name."""
    job_dir = Path(job_dir)
    return sorted(p for p in job_dir.iterdir() if p.is_dir() and _is_trial_result(p))


def read_job(job_dir: Path, *, task_root: Path | None = None, subagents: bool = False) -> Iterator[dict]:
    """Trace rows of every trial in a Harbor job dir (sample_idx: the attempt number per
    task). `subagents` adds one row per subagent trajectory (is_subagent)."""
    job_dir = Path(job_dir)
    counts: dict[str, int] = {}
    for trial in trial_dirs(job_dir):
        row = read_trial(trial, task_root=task_root, run_id=job_dir.name)
        counts[row["task"]] = idx = counts.get(row["task"], -1) + 1
        row["sample_idx"] = idx
        yield row
        if subagents:
            for sub in _subagent_rows(trial, row):
                sub["sample_idx"] = idx
                yield sub


def read_trial(trial_dir: Path, *, task_root: Path | None = None, run_id: str | None = None) -> dict:
    """One trace row (TRACE_SCHEMA's keys) from a Harbor trial dir."""
    trial_dir = Path(trial_dir)
    result = _json(trial_dir / "result.json") or {}
    config = result.get("config") or _json(trial_dir / "config.json") or {}
    agent_info = result.get("agent_info") or {}
    model_info = agent_info.get("model_info") or {}
    agent_cfg = config.get("agent") or {}
    agent_result = result.get("agent_result") or {}
    exc = result.get("exception_info") or {}
    exc_type = exc.get("exception_type")
    if not exc_type and (trial_dir / "exception.txt").is_file():
        exc_type = _exception_from_traceback((trial_dir / "exception.txt").read_text(errors="replace"))
    task = result.get("task_name") or _task_name(config, trial_dir)
    task_path = _task_path(config, trial_dir, task_root)
    instruction = _instruction(task_path)

    steps = None
    if result.get("step_results"):  # a multi-step task: each step's conversation, in order
        conversations, n_episodes, trajectories, steps = _step_conversations(trial_dir, result, task_path)
    else:
        conversations, n_episodes, trajectories = _trial_conversation(trial_dir / "agent", result, task_path)
        ensure_task_text(conversations, instruction)  # no empty first user turn where the task is known

    rewards = (result.get("verifier_result") or {}).get("rewards")
    reward = _reward(rewards, trial_dir)
    timed_out = exc_type in TIMEOUT_ERRORS  # the agent ran out of time: a task outcome
    exception = None if timed_out else exc_type
    n_in = agent_result.get("n_input_tokens")
    n_out = agent_result.get("n_output_tokens")
    model = model_info.get("name") or _model_name(agent_cfg.get("model_name"))
    provider = model_info.get("provider") or _provider(agent_cfg.get("model_name"))
    meta = {
        "harbor_trial_dir": str(trial_dir),
        "agent_version": agent_info.get("version"),
        "rewards": rewards,
        "exception_message": (exc.get("exception_message") or "")[:2000] or None,
        "exception_type": exc_type,
        "n_cache_tokens": agent_result.get("n_cache_tokens"),
        "cost_usd": agent_result.get("cost_usd"),
        "agent_metadata": agent_result.get("metadata"),
        "environment": (config.get("environment") or {}).get("import_path")
        or (config.get("environment") or {}).get("type"),
        "trajectories": trajectories,
        "timings": {
            k: _duration(result.get(k)) for k in ("environment_setup", "agent_setup", "agent_execution", "verifier")
        },
        "task_path": str(task_path) if task_path else None,
    }
    verifier = [_duration(r.get("verifier")) for r in result.get("step_results") or [result]]
    if any(v is not None for v in verifier):  # the verifier's seconds, as otbuild's harness records them
        meta["verifier_s"] = round(sum(v or 0.0 for v in verifier), 3)
    if steps is not None:
        meta["steps"] = steps
    if (config.get("verifier") or {}).get("disable") and reward is None:
        meta["unverified_reason"] = UNVERIFIED_REASON
    return {
        "conversations": conversations,
        "agent": agent_info.get("name") or agent_cfg.get("name"),
        "model": model,
        "model_provider": provider,
        "date": result.get("started_at"),
        "task": task,
        "episode": f"episode-{max(n_episodes - 1, 0)}",
        "run_id": run_id or str(config.get("job_id") or trial_dir.parent.name),
        "trial_name": result.get("trial_name") or trial_dir.name,
        "result": exc_type or ("" if reward is None else reward_text(reward)),
        "task_id": task,
        "source": "harbor",
        "teacher": f"{agent_info.get('name') or agent_cfg.get('name')}:{model}"
        if model
        else agent_info.get("name") or agent_cfg.get("name"),
        "sample_idx": 0,
        "n_turns": count_turns(conversations),
        "reward": reward,
        "timed_out": timed_out,
        "exception": exception,
        "is_subagent": False,
        "n_input_tokens": n_in,
        "n_output_tokens": n_out,
        "duration_s": _seconds(result.get("started_at"), result.get("finished_at")),
        "metadata": json.dumps(meta, sort_keys=True, default=str),
    }


def read_job_calls(job_dir: Path) -> Iterator[dict]:
    """Call rows (otbuild/stagekit/calls.py) of the rollout details every trial of a Harbor job
    reports (`agent_result.rollout_details`: per call the prompt's and the answer's token ids and
    the sampled log-probs), in trial-name order; none for a trial that reports none."""
    for trial in trial_dirs(Path(job_dir)):
        result = _json(trial / "result.json") or {}
        yield from trial_calls(result, result.get("trial_name") or trial.name)


def job_scores(job_dir: Path) -> list[dict]:
    """A flat scores view for evals: one dict per trial, in trial-name order:
    model, benchmark (the dataset/source name), repeat (attempt per task), task, reward,
    exception (class name; AgentTimeoutError included), duration (seconds)."""
    out: list[dict] = []
    counts: dict = {}
    for trial in trial_dirs(Path(job_dir)):
        result = _json(trial / "result.json") or {}
        config = result.get("config") or {}
        model_info = (result.get("agent_info") or {}).get("model_info") or {}
        task = result.get("task_name") or _task_name(config, trial)
        counts[task] = rep = counts.get(task, -1) + 1
        exc = (result.get("exception_info") or {}).get("exception_type")
        out.append(
            {
                "model": model_info.get("name")
                or (config.get("agent") or {}).get("model_name")
                or (result.get("agent_info") or {}).get("name"),
                "benchmark": result.get("source") or (config.get("task") or {}).get("source"),
                "repeat": rep,
                "task": task,
                "reward": _reward((result.get("verifier_result") or {}).get("rewards"), trial),
                "exception": exc,
                "duration": _seconds(result.get("started_at"), result.get("finished_at")),
            }
        )
    return out


# -- conversations ----------------------------------------------------------------------------
def _conversation(agent: Path) -> tuple[list[dict], int, list[str]]:
    """The main ATIF trajectory as {role, content} messages, with its episode count and the
    trajectory files it spans. A trajectory continued in other files (terminus-2's
    `linear_history`: `trajectory.cont-N.json`, one per context window) is read to its last
    file, whose conversation is what the model saw when it gave its last answer (the context
    it was handed after summarizing, then its new turns); the episodes of every file are
    counted. This is the row Harbor's own `traces export --episodes last` gives. The files are
    taken in their numbered order rather than by `continued_trajectory_ref`, which Harbor 0.26
    can write one number short (`cont-0` for a window it saved as `cont-1`)."""
    messages: list[dict] = []
    episodes = 0
    used: list[str] = []
    for path in _main_trajectories(agent):
        data = _json(path)
        if not isinstance(data, dict):
            break
        used.append(path.name)
        steps = data.get("steps") or []
        messages, _ = _atif_messages(steps)
        episodes += sum(
            1
            for st in steps
            if isinstance(st, dict) and st.get("source") == "agent" and not st.get("is_copied_context")
        )
    return messages, episodes, used


def _trial_conversation(
    agent: Path, result: dict, task_path: Path | None, step: dict | None = None
) -> tuple[list[dict], int, list[str]]:
    """The conversation of a trial's agent dir (`agent/`, or a step's `steps/NAME/agent/`, `step`
    its step result): its trajectory; the oracle's (which has none) is the solution it ran."""
    conversation, episodes, used = _conversation(agent)
    oracle = (result.get("agent_info") or {}).get("name") == "oracle"
    if not conversation and oracle and (step or result).get("agent_execution"):
        solutions = [task_path / "steps" / step["step_name"] / "solution"] if task_path and step else []
        conversation = _oracle_conversation([*solutions, *([task_path / "solution"] if task_path else [])])
        episodes = 1
    return conversation, episodes, used


def _step_conversations(
    trial_dir: Path, result: dict, task_path: Path | None
) -> tuple[list[dict], int, list[str], list[dict]]:
    """A multi-step trial's conversation (each step's, from `steps/NAME/agent/`, in the order
    run), its episodes and trajectory files, and the trace metadata's `steps`: per step its
    name, reward, the verifier's rewards, turns, where its conversation starts and its error."""
    conversation: list[dict] = []
    episodes, used, steps = 0, [], []
    for sr in result["step_results"]:
        name = sr.get("step_name")
        messages, n, files = _trial_conversation(trial_dir / "steps" / name / "agent", result, task_path, sr)
        ensure_task_text(messages, _read(task_path / "steps" / name / "instruction.md") if task_path else None)
        rewards = (sr.get("verifier_result") or {}).get("rewards")
        steps.append(
            {
                "name": name,
                "reward": _reward(rewards, trial_dir / "-") if rewards else None,
                "rewards": rewards,
                "n_turns": count_turns(messages),
                "first_message": len(conversation),
                "exception_type": (sr.get("exception_info") or {}).get("exception_type"),
            }
        )
        conversation += messages
        episodes += n
        used += [f"steps/{name}/agent/{f}" for f in files]
    return conversation, episodes, used, steps


def _main_trajectories(agent: Path) -> list[Path]:
    """trajectory.json, then its continuations trajectory.cont-N.json by N."""
    main = agent / "trajectory.json"
    if not main.is_file():
        return []
    conts = [
        (int(n), p)
        for p in agent.glob("trajectory.cont-*.json")
        if (n := p.name[len("trajectory.cont-") : -len(".json")]).isdigit()
    ]
    return [main] + [p for _, p in sorted(conts)]


def _atif_messages(steps: list) -> tuple[list[dict], int]:
    out: list[dict] = []
    n_agent = 0
    for step in steps:
        if not isinstance(step, dict):
            continue
        source = step.get("source")
        if source in ("user", "system"):
            out.append({"role": "user", "content": _text(step.get("message"))})
        elif source == "agent":
            n_agent += 1
            # raw content (what otbuild's jobs record): the message is the model's answer; a
            # trajectory Harbor rewrote has its commands as tool calls, kept as its export has them
            parts = [_text(step.get("message"))] if step.get("message") else []
            parts += [
                "<tool_call>\n"
                + json.dumps(
                    {"name": call.get("function_name"), "arguments": call.get("arguments", {})}, ensure_ascii=False
                )
                + "\n</tool_call>"
                for call in step.get("tool_calls") or []
            ]
            content = assistant_turn("\n".join(parts), step.get("reasoning_content"))
            out.append({"role": "assistant", "content": content})
            results = ((step.get("observation") or {}).get("results")) or []
            texts = [_text(r.get("content")) for r in results if isinstance(r, dict) and r.get("content") is not None]
            if texts:
                out.append({"role": "user", "content": "\n".join(texts)})
    while out and out[-1]["role"] != "assistant" and n_agent:
        out.pop()  # the last observation answers nothing the model saw
    return out, n_agent


def _oracle_conversation(solutions: list[Path]) -> list[dict]:
    """The oracle has no model: its one turn is the reference solution it ran (the first of
    `solutions`, solution dirs, that has a solve script)."""
    script = next(
        (
            f.read_text(errors="replace")
            for d in solutions
            for name in ("solve.sh", "solve.ps1", "solve.bat", "solve.cmd")
            if (f := d / name).is_file()
        ),
        None,
    )
    content = f"```bash\n{script.rstrip()}\n```" if script else "[oracle: solution/solve.sh]"
    return [{"role": "user", "content": ""}, {"role": "assistant", "content": content}]


def _subagent_rows(trial_dir: Path, parent: dict) -> Iterator[dict]:
    main = set(json.loads(parent["metadata"]).get("trajectories") or [])
    for path in sorted((trial_dir / "agent").glob("trajectory*.json")):
        if path.name in main:
            continue
        data = _json(path)
        if not isinstance(data, dict):
            continue
        msgs, n = _atif_messages(data.get("steps") or [])
        if not msgs:
            continue
        row = dict(parent)
        row.update(
            conversations=msgs,
            n_turns=count_turns(msgs),
            is_subagent=True,
            episode=f"episode-{max(n - 1, 0)}",
            trial_name=f"{parent['trial_name']}/{path.stem}",
            n_input_tokens=(data.get("final_metrics") or {}).get("total_prompt_tokens"),
            n_output_tokens=(data.get("final_metrics") or {}).get("total_completion_tokens"),
        )
        yield row


# -- helpers -------------------------------------------------------------------------------
def _task_name(config: dict, trial_dir: Path) -> str:
    path = (config.get("task") or {}).get("path")
    return Path(path).name if path else trial_dir.name.rsplit("__", 1)[0]


def _task_path(config: dict, trial_dir: Path, task_root: Path | None) -> Path | None:
    raw = (config.get("task") or {}).get("path")
    if not raw:
        return None
    p = Path(raw)
    candidates = [p] if p.is_absolute() else []
    if task_root is not None:
        candidates.append(Path(task_root) / p.name)
    if not p.is_absolute():
        candidates += [Path.cwd() / p]
        jobs_dir = config.get("trials_dir")
        # trials_dir is relative to where harbor ran, as is the task path
        if jobs_dir and not Path(jobs_dir).is_absolute():
            depth = len(Path(jobs_dir).parts)
            base = trial_dir.parent
            for _ in range(depth):
                base = base.parent
            candidates.append(base / p)
    for c in candidates:
        if (c / "instruction.md").is_file() or (c / "task.toml").is_file():  # a multi-step task has no instruction.md
            return c
    return None


def _instruction(task_path: Path | None) -> str | None:
    return _read(task_path / "instruction.md") if task_path else None


def _reward(rewards, trial_dir: Path) -> float | None:
    if isinstance(rewards, dict) and rewards:
        if isinstance(rewards.get("reward"), (int, float)):
            return float(rewards["reward"])
        nums = [float(v) for v in rewards.values() if isinstance(v, (int, float))]
        return sum(nums) / len(nums) if nums else None
    text = _read(trial_dir / "verifier" / "reward.txt")
    if text is not None:
        try:
            v = float(text.strip())
            return v if math.isfinite(v) else None
        except ValueError:
            return None
    data = _json(trial_dir / "verifier" / "reward.json")
    if isinstance(data, dict):
        return _reward(data, trial_dir / "-")
    return None


def _exception_from_traceback(text: str) -> str | None:
    for line in reversed(text.strip().splitlines()):
        head = line.split(":", 1)[0].strip()
        if head and " " not in head and not line.startswith(" "):
            return head.rsplit(".", 1)[-1]
    return None


def _model_name(model: str | None) -> str | None:
    return model.split("/", 1)[1] if model and "/" in model else model


def _provider(model: str | None) -> str | None:
    return model.split("/", 1)[0] if model and "/" in model else None


def _text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multimodal parts: keep the text ones
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type", "text") == "text")
    return json.dumps(content, ensure_ascii=False)


def _parse_time(s: str | None) -> datetime | None:
    if not s:
        return None
    try:
        return datetime.fromisoformat(s)  # Python >= 3.11 reads a trailing Z
    except ValueError:
        return None


def _seconds(start: str | None, end: str | None) -> float | None:
    a, b = _parse_time(start), _parse_time(end)
    if a is None or b is None:
        return None
    if (a.tzinfo is None) != (b.tzinfo is None):
        a, b = a.replace(tzinfo=None), b.replace(tzinfo=None)
    return round((b - a).total_seconds(), 3)


def _duration(timing) -> float | None:
    if not isinstance(timing, dict):
        return None
    return _seconds(timing.get("started_at"), timing.get("finished_at"))


def _json(path: Path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def _read(path: Path) -> str | None:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return None


__all__ = ["TRACE_SCHEMA", "is_trial_dir", "job_scores", "read_job", "read_job_calls", "read_trial", "trial_dirs"]
