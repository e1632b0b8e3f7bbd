"""The no-op engine: declares the task complete at once and runs nothing, so its trial is the
verifier on the untouched environment (the task_check stage's do-nothing agent: a task whose
verifier passes it checks nothing)."""

from __future__ import annotations

from otbuild.harness import protocol
from otbuild.harness.tools import COMPLETE

DONE = {
    "analysis": "",
    "plan": "Nothing: the task is declared complete as it stands.",
    "commands": [],
    "task_complete": True,
}


class NoopEngine:
    name = "noop"
    provider = "otbuild"
    takes_tools = True  # offered tools, it calls the completion tool

    def __init__(self, settings=None):
        self.model = "noop"

    async def complete(self, messages: list[dict], tools=None, **_):
        from otbuild.engines import Completion

        if tools:  # the tools protocol: the completion tool, every turn
            call = {"id": "call_done", "type": "function", "function": {"name": COMPLETE, "arguments": "{}"}}
            return Completion("", 0, 0, "tool_calls", tool_calls=[call])
        return Completion(protocol.format_answer(DONE), 0, 0, "stop")  # every turn, the confirmation too

    async def aclose(self) -> None:
        pass
