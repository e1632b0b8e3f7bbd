"""One turn loop (otbuild/harness/agent.py), two protocols: how the model is asked and how its
answer becomes what the harness does. A protocol gives the conversation's first messages, what
each request carries beside the messages (`request`: the offered `tools`), the assistant
message an answer is recorded as, and `handle(completion)`: the answer as a `Plan`, the
actions to take in order, each with the message that reports it.

`terminus2`: the answer is terminus-2's JSON (otbuild/harness/protocol.py), its commands run
as one action, the reply is a user message. `tools`: native tool calls
(otbuild/harness/tools.py), one action and one `tool` message per call."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from otbuild.engines.base import Completion
from otbuild.harness import protocol
from otbuild.harness.protocol import Command

# (the terminal's output, capped, or None where nothing ran; whether the shell is alive) -> message
Reply = Callable[[str | None, bool], dict]


@dataclass(frozen=True)
class Action:
    """One thing the harness does for an answer: `commands` typed into the terminal (an empty
    list only reads what it shows; None: the terminal is left alone), then `reply` reports it."""

    commands: list[Command] | None
    reply: Reply


@dataclass(frozen=True)
class Plan:
    """An answer, as the harness acts on it. `complete`: the answer asks to end the task (True),
    acts without asking (False), or could not be read (None: a request to end, made before,
    still waits for its confirmation)."""

    actions: list[Action]
    complete: bool | None


def user(text: str) -> dict:
    return {"role": "user", "content": text}


class Terminus2Turns:
    """terminus-2's JSON protocol in a prompt style's texts (protocol.prompt_style)."""

    name = "terminus2"
    tools: list[dict] | None = None

    def __init__(self, style):
        self.style = style

    def first_messages(self, instruction: str, screen: str) -> list[dict]:
        return [user(self.style.first_prompt(instruction, screen))]

    def request(self) -> dict:
        return {}

    def assistant_message(self, completion: Completion) -> dict:
        return {"role": "assistant", "content": completion.text}

    def handle(self, completion: Completion) -> Plan:
        style = self.style
        try:
            answer = protocol.parse_answer(completion.text)
        except protocol.ParseError as e:
            error = user(style.parse_error_reply(e))
            return Plan([Action(None, lambda _out, _alive: error)], None)

        def reply(output: str | None, alive: bool) -> dict:
            asks = answer.task_complete and alive
            return user(style.confirm_reply(output) if asks else style.observation_reply(output))

        return Plan([Action(answer.commands, reply)], answer.task_complete)
