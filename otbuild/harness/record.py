"""What a trial produced: each step's run (`StepRun`) and the trial's record (`TrialRecord`), which
becomes its row of the trace table (otbuild/traces/table.py). The model is sent `{role, content}`
messages, with an assistant's `tool_calls` and a `tool` message's `tool_call_id` in the tools
protocol; what a trace keeps beside them (token counts, a reasoning parser's text) comes from
the completions."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from otbuild.engines.base import Completion
from otbuild.harness.verifier import reward_of
from otbuild.tasks.taskdir import TaskDir
from otbuild.traces.table import assistant_turn, reward_text


@dataclass
class StepRun:
    """What one step of a trial gave (a single-step task is one step without a name)."""

    name: str | None = None
    messages: list[dict] = field(default_factory=list)  # what the model is sent
    completions: list[Completion] = field(default_factory=list)  # its answers, one per assistant message
    stop: str | None = None
    failure: str | None = None  # a task failure that is not a wrong answer
    rewards: dict | None = None  # the verifier's: {"reward": R} from reward.txt, reward.json's numbers
    details: dict = field(default_factory=dict)

    @property
    def reward(self) -> float | None:
        return None if self.rewards is None else reward_of(self.rewards.get("reward", self.rewards))[0]


@dataclass
class TrialRecord:
    """Which trial it was (the task, its id, the engine that answered, the sample, the run, the
    source; when it started) and what it produced, as `trace_row()` writes it."""

    task: TaskDir
    task_id: str
    engine: Any
    started: datetime
    t0: float  # time.monotonic() when it started: the row's duration_s runs from here
    sample_idx: int = 0
    run_id: str = ""
    source: str = ""
    conversations: list[dict] = field(default_factory=list)  # the trace's conversation
    completions: list[Completion] = field(default_factory=list)
    reward: float | None = None
    exception: str | None = None  # the class name of an error in endings.INFRASTRUCTURE_ERRORS
    failure: str | None = None  # a task failure that is not a wrong answer (ContextLengthExceededError)
    timed_out: bool = False  # the agent ran out of time
    protocol: str = "terminus2"  # the harness's protocol (otbuild/harness/turns.py)
    tools: list[dict] | None = None  # the tools offered in every request (the tools protocol)
    agent_timeout: float = 0.0
    details: dict = field(default_factory=dict)  # the row's metadata beside the agent's timeout and episodes

    def trace_row(self) -> dict:
        """The trace table's row. Its `result` is the exception, else the failure (as in Harbor's
        export), else the reward."""
        episodes, engine = len(self.completions), self.engine
        task, reward = self.task, self.reward
        return {
            "conversations": self.conversations,
            "agent": AGENTS[self.protocol],
            "model": engine.model,
            "model_provider": engine.provider,
            "date": self.started.isoformat(timespec="seconds"),
            "task": task.name,
            "episode": f"episode-{max(episodes - 1, 0)}",
            "run_id": self.run_id,
            "trial_name": f"{task.name}__{self.sample_idx}__{self.run_id[:8]}",
            "result": self.exception or self.failure or ("" if reward is None else reward_text(reward)),
            "tools": None if self.tools is None else json.dumps(self.tools),
            "task_id": self.task_id,
            "source": self.source,
            "teacher": f"{engine.name}:{engine.model}",
            "sample_idx": self.sample_idx,
            "n_turns": sum(1 for m in self.conversations if m["role"] == "assistant"),
            "reward": reward,
            "timed_out": self.timed_out,
            "exception": self.exception,
            "is_subagent": False,
            "n_input_tokens": sum(c.n_input_tokens for c in self.completions),
            "n_output_tokens": sum(c.n_output_tokens for c in self.completions),
            "duration_s": round(time.monotonic() - self.t0, 3),
            "metadata": json.dumps(
                {
                    "agent_timeout_sec": self.agent_timeout,
                    "episodes": episodes,
                    **self.details,
                    **_engine_version(engine),
                },
                sort_keys=True,
                default=str,
            ),
        }


TOOL_KEYS = ("tool_calls", "tool_call_id")
# the trace's `agent` column per protocol: terminus-2's (as Harbor names it), otbuild's tool-calling one
AGENTS = {"terminus2": "terminus-2", "tools": "otbuild-tools"}


def _engine_version(engine) -> dict:
    """{"engine_version": ...} of an engine that knows its release (a managed server's)."""
    version = getattr(engine, "version", None)
    return {"engine_version": version} if isinstance(version, str) else {}


def step_records(runs: list[StepRun], keep_reasoning: bool) -> list[dict]:
    """The trace metadata's `steps`: per step its name, reward (and reward.json's values), turns,
    where its conversation starts in the trace's, and why it stopped."""
    out, first = [], 0
    for r in runs:
        n = len(conversation(r.messages, r.completions, keep_reasoning))
        out.append(
            {
                "name": r.name,
                "reward": r.reward,
                "rewards": r.rewards,
                "n_turns": len(r.completions),
                "first_message": first,
                "stop_reason": r.stop,
                **{k: v for k, v in r.details.items() if k != "reward_json"},
            }
        )
        first += n
    return out


def conversation_of(runs: list[StepRun], keep_reasoning: bool) -> list[dict]:
    """The trace's conversation: each step's in order."""
    return [m for r in runs for m in conversation(r.messages, r.completions, keep_reasoning)]


def conversation(messages: list[dict], completions: list[Completion], keep_reasoning: bool) -> list[dict]:
    """The trace's conversation, ending on the model's last answer; with `keep_reasoning`, an
    answer's reasoning goes before it as Harbor's export has it: <think>REASONING</think>\nTEXT.
    An assistant's `tool_calls` and a tool message's `tool_call_id` are kept as sent."""
    answers = iter(completions)
    out = []
    for m in messages:
        content = m["content"]
        if m["role"] == "assistant":
            c = next(answers)
            content = assistant_turn(content, c.reasoning if keep_reasoning else None)
        out.append({"role": m["role"], "content": content, **{k: m[k] for k in TOOL_KEYS if k in m}})
    while out and out[-1]["role"] != "assistant":
        out.pop()
    return out
