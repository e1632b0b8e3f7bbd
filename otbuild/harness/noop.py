"""The no-op engine: declares the task complete at once and runs nothing, so its trial is the
verifier on the untouched environment (the task_check stage's do-nothing agent: a task whose
verifier passes it checks nothing)."""

from __future__ import annotations

from otbuild.harness import protocol

DONE = {
    "analysis": "",
    "plan": "Nothing: the task is declared complete as it stands.",
    "commands": [],
    "task_complete": True,
}


class NoopEngine:
    name = "noop"
    provider = "otbuild"

    def __init__(self, settings=None):
        self.model = "noop"

    async def complete(self, messages: list[dict], **_):
        from otbuild.engines import Completion

        return Completion(protocol.format_answer(DONE), 0, 0, "stop")  # every turn, the confirmation too

    async def aclose(self) -> None:
        pass
