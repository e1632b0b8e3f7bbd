"""One trial: a task, an engine, a sandbox; terminus-2 turns until the agent is done, then the
task's verifier. Returns a trace row (otbuild/traces/table.py).

Task failures (wrong answer, agent timeout) and infrastructure errors (the sandbox would not
start, the engine failed after its retries, the verifier timed out) are kept apart: the
latter set `exception` to the error's class name, which is also the row's `result`.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from otbuild.harness import protocol
from otbuild.harness.terminal import SHELL_ENV, Terminal
from otbuild.sandbox import Limits, open_sandbox, read_reward
from otbuild.tasks.harbor_meta import parse_task_toml
from otbuild.tasks.taskdir import TaskDir, TaskFormatError

SETTLE_SECONDS = 2.0  # wait for the first prompt


@dataclass(frozen=True)
class TrialSettings:
    max_episodes: int = 50
    agent_timeout_sec: float | None = None  # None: the task's [agent] timeout_sec
    timeout_multiplier: float = 1.0
    timeout_cap_sec: float = 7200.0
    verifier_timeout_sec: float | None = None  # None: the task's [verifier] timeout_sec
    backend: str = "bwrap"
    limits: Limits = field(default_factory=Limits)
    prompt: str = "terminus2"  # the prompt style (protocol.PROMPTS)


class VerifierTimeoutError(Exception):
    pass


class SandboxError(Exception):
    pass


async def run_trial(task: TaskDir, task_id: str, engine, settings: TrialSettings, workdir: Path,
                    *, sample_idx: int = 0, run_id: str = "", source: str = "") -> dict:
    started, t0 = datetime.now(UTC), time.monotonic()
    meta = _task_timeouts(task)
    agent_timeout = effective_timeout(settings.agent_timeout_sec or meta["agent"], settings.timeout_multiplier,
                                      settings.timeout_cap_sec)
    verifier_timeout = settings.verifier_timeout_sec or meta["verifier"]
    messages: list[dict] = []
    reward = exception = None
    details: dict = {}
    timed_out = False
    episodes = 0
    # the sandbox's watchdog bounds the whole trial: agent, verifier and a margin
    limits = replace(settings.limits, wall_seconds=agent_timeout + verifier_timeout + 60)
    try:
        with open_sandbox(task, workdir, backend=settings.backend, limits=limits,
                          with_solution=getattr(engine, "needs_solution", False)) as box:
            try:
                episodes, timed_out = await _agent(box, task, engine, settings, agent_timeout, messages)
            finally:
                box.kill_all()  # nothing the agent started survives into the verifier
            result = await asyncio.to_thread(
                box.run, ["bash", "/tests/test.sh"], timeout=verifier_timeout, with_tests=True)
            if result.timed_out:
                raise VerifierTimeoutError(f"verifier exceeded {verifier_timeout}s")
            reward, details = _reward(read_reward(box.root))
    except Exception as e:  # noqa: BLE001 - every infrastructure failure is recorded, not raised
        exception = type(e).__name__
        details["exception_message"] = str(e)[:2000]
    return _trace_row(task, task_id, engine, started, t0, messages, reward, exception, details, timed_out,
                      episodes, agent_timeout, sample_idx, run_id, source)


def effective_timeout(base_sec: float, multiplier: float, cap_sec: float) -> float:
    """Timeout-aware evaluation as in the paper: a per-model multiplier (e.g. 2 for 8B, 16 for
    32B) on the task's own timeout, capped (e.g. 2 h): min(cap, base x multiplier)."""
    return min(cap_sec, base_sec * multiplier)


def not_runnable_trace(task: TaskDir, task_id: str, engine, *, sample_idx: int = 0, run_id: str = "",
                       source: str = "") -> dict:
    """The row for a task that needs its container image: recorded as an infrastructure
    exception (the trace filter drops it with that reason), never run on the host."""
    return _trace_row(task, task_id, engine, datetime.now(UTC), time.monotonic(), [], None,
                      "TaskNotRunnableLocally", {"exception_message": "the task needs its container image; "
                      "run it through the harbor backend"}, False, 0, 0.0, sample_idx, run_id, source)


def _trace_row(task, task_id, engine, started, t0, messages, reward, exception, details, timed_out,
               episodes, agent_timeout, sample_idx, run_id, source) -> dict:
    usage = _usage(messages)
    conversations = _trim(messages)
    return {
        "conversations": conversations,
        "agent": "terminus-2",
        "model": engine.model,
        "model_provider": engine.provider,
        "date": started.isoformat(timespec="seconds"),
        "task": task.name,
        "episode": f"episode-{max(episodes - 1, 0)}",
        "run_id": run_id,
        "trial_name": f"{task.name}__{sample_idx}__{run_id[:8]}",
        "result": exception or ("" if reward is None else f"{reward:g}"),
        "task_id": task_id,
        "source": source,
        "teacher": f"{engine.name}:{engine.model}",
        "sample_idx": sample_idx,
        "n_turns": sum(1 for m in conversations if m["role"] == "assistant"),
        "reward": reward,
        "timed_out": timed_out,
        "exception": exception,
        "is_subagent": False,
        "n_input_tokens": usage[0],
        "n_output_tokens": usage[1],
        "duration_s": round(time.monotonic() - t0, 3),
        "metadata": json.dumps({"agent_timeout_sec": agent_timeout, "episodes": episodes, **details},
                               sort_keys=True, default=str),
    }


async def _agent(box, task: TaskDir, engine, settings: TrialSettings, timeout: float,
                 messages: list[dict]) -> tuple[int, bool]:
    """Terminus-2 turns. Returns (episodes run, timed out)."""
    deadline = time.monotonic() + timeout
    style = protocol.prompt_style(settings.prompt)
    term = await asyncio.to_thread(
        Terminal, box.argv(["bash", "--noprofile", "--norc", "-i"], env=SHELL_ENV, tty=True))
    try:
        screen = await asyncio.to_thread(term.read, SETTLE_SECONDS)
        messages.append({"role": "user", "content": style.first_prompt(task.instruction, screen)})
        pending_complete = False
        for episode in range(settings.max_episodes):
            left = deadline - time.monotonic()
            if left <= 0:
                return episode, True
            try:
                # the oracle reads the task's solution; a model's request gets the messages only
                extra = {"task": task, "style": style} if getattr(engine, "needs_solution", False) else {}
                completion = await asyncio.wait_for(engine.complete(messages, **extra), left)
            except TimeoutError:
                return episode, True
            messages.append({"role": "assistant", "content": completion.text,
                             "_usage": (completion.n_input_tokens, completion.n_output_tokens)})
            try:
                answer = protocol.parse_answer(completion.text)
            except protocol.ParseError as e:
                messages.append({"role": "user", "content": style.parse_error_reply(e)})
                continue
            if answer.task_complete and pending_complete:
                return episode + 1, False
            output = await _execute(term, answer.commands, deadline)
            if not term.alive:
                messages.append({"role": "user", "content": style.observation_reply(output)})
                return episode + 1, False
            if answer.task_complete:
                pending_complete = True
                reply = style.confirm_reply(output)
            else:
                pending_complete = False
                reply = style.observation_reply(output)
            messages.append({"role": "user", "content": reply})
        return settings.max_episodes, False
    finally:
        await asyncio.to_thread(term.close)


async def _execute(term: Terminal, commands: list[protocol.Command], deadline: float) -> str:
    out = []
    for c in commands:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        term.send(c.keystrokes)
        out.append(await asyncio.to_thread(term.read, min(c.duration, left)))
    if not commands:  # nothing to run: what the terminal already shows (as tmux would capture)
        out.append(await asyncio.to_thread(term.read, 0.005, False))
    return protocol.cap_output("".join(out))


def _task_timeouts(task: TaskDir) -> dict:
    try:
        cfg = parse_task_toml(task)
    except (KeyError, TaskFormatError):  # a task without a usable task.toml gets the defaults
        cfg = {}
    return {
        "agent": float((cfg.get("agent") or {}).get("timeout_sec", 900.0)),
        "verifier": float((cfg.get("verifier") or {}).get("timeout_sec", 300.0)),
    }


def _reward(value) -> tuple[float | None, dict]:
    """reward.txt gives a float; reward.json a flat dict (its "reward", else the mean)."""
    if value is None or isinstance(value, (int, float)):
        return value, {}
    metrics = {k: float(v) for k, v in value.items() if isinstance(v, (int, float))}
    reward = metrics.get("reward", sum(metrics.values()) / len(metrics) if metrics else None)
    return reward, {"reward_json": value}


def _usage(messages: list[dict]) -> tuple[int, int]:
    pairs = [m["_usage"] for m in messages if "_usage" in m]
    return sum(p[0] for p in pairs), sum(p[1] for p in pairs)


def _trim(messages: list[dict]) -> list[dict]:
    """The conversation as {role, content}, ending on the model's last answer."""
    out = [{"role": m["role"], "content": m["content"]} for m in messages]
    while out and out[-1]["role"] != "assistant":
        out.pop()
    return out
