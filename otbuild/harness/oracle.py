"""The oracle engine: replays the task's solution/solve.sh through the same harness, one
top-level command per turn, so its traces are real multi-turn terminal sessions."""

from __future__ import annotations

import json
from functools import lru_cache

from otbuild.harness import protocol
from otbuild.harness.oracle_steps import split_commands
from otbuild.harness.tools import BASH, COMPLETE
from otbuild.tasks.taskdir import SOLUTION, TaskDir

ORACLE_DURATION = 30.0  # an upper bound: the terminal returns as soon as the prompt is back


class OracleEngine:
    name = "oracle"
    provider = "otbuild"
    needs_solution = True  # the sandbox mounts /solution for it, as Harbor's oracle has it
    takes_tools = True  # offered tools, it answers with a tool call

    def __init__(self, settings: dict | None = None):
        self.model = "oracle"

    async def complete(self, messages: list[dict], *, task: TaskDir, style=None, tools=None, **_):
        from otbuild.engines import Completion

        steps = _steps(task.text(SOLUTION) or "")
        turn = sum(1 for m in messages if m["role"] == "assistant")
        if tools:  # the tools protocol: each step a `bash` call, then `task_complete`
            call = (
                tool_call(turn, BASH, {"command": steps[turn], "wait": ORACLE_DURATION}) if turn < len(steps) else None
            )
            return Completion("", 0, 0, "tool_calls", tool_calls=[call or tool_call(turn, COMPLETE, {})])
        style = style or protocol.Terminus2
        if style is protocol.Compact:  # short analysis/plan: the commands carry the trace
            answer = {
                "analysis": "",
                "plan": f"step {turn + 1}" if turn < len(steps) else "done",
                "commands": [{"keystrokes": steps[turn] + "\n", "duration": ORACLE_DURATION}]
                if turn < len(steps)
                else [],
                "task_complete": turn >= len(steps),
            }
        elif turn < len(steps):
            answer = {
                "analysis": f"Step {turn + 1} of {len(steps)} of the reference solution.",
                "plan": f"Run: {steps[turn].splitlines()[0]}",
                "commands": [{"keystrokes": steps[turn] + "\n", "duration": ORACLE_DURATION}],
                "task_complete": False,
            }
        else:
            answer = {
                "analysis": "The reference solution has been run.",
                "plan": "Mark the task complete.",
                "commands": [],
                "task_complete": True,
            }
        text = style.format_answer(answer)
        return Completion(text, 0, 0, "stop")

    async def aclose(self) -> None:
        pass


def tool_call(turn: int, name: str, args: dict) -> dict:
    """A tool call as a server sends it (the arguments as JSON text)."""
    return {"id": f"call_{turn}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


@lru_cache(maxsize=256)
def _steps(script: str) -> tuple[str, ...]:
    return tuple(split_commands(script))
