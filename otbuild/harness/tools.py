"""The native tool-calling protocol: the model is offered two tools in the request's `tools`
(OpenAI's format), `bash` (type a command into the trial's terminal, wait a bounded time, see
what it printed) and `task_complete` (the task is done). Its `tool_calls` run in order, each
answered by a `tool` message with its `tool_call_id`; a call that cannot run (an unknown tool,
arguments that are not a JSON object, a missing or wrong key) is answered with what was wrong;
an answer without a tool call gets a short reminder. `task_complete` is confirmed as
terminus-2 confirms: the first call shows the terminal and asks again, a second call in the
next answer ends the trial. Output is capped as terminus-2's is (protocol.cap_output)."""

from __future__ import annotations

import json
import math

from otbuild.engines.base import Completion
from otbuild.harness.protocol import MAX_DURATION, MAX_OUTPUT_BYTES, Command
from otbuild.harness.turns import Action, Plan, user
from otbuild.prompts import render

BASH = "bash"
COMPLETE = "task_complete"
DEFAULT_WAIT = 10.0  # seconds; the read ends earlier once the prompt is back
NO_TOOL_CALL = (
    f"No tool was called. Act through the tools: `{BASH}` runs a command, `{COMPLETE}` ends the task once it is solved."
)

TOOLS: list[dict] = [
    {
        "type": "function",
        "function": {
            "name": BASH,
            "description": (
                "Type a command into the task's terminal (a persistent interactive bash shell: "
                "the working directory, variables and running programs carry over between calls) "
                "and press Enter, then wait until the prompt is back or `wait` seconds have "
                "passed, whichever comes first. Returns what the terminal printed, at most "
                f"{MAX_OUTPUT_BYTES} bytes (the middle of longer output is cut). A lone key name "
                "such as C-c, C-d or Escape presses that key instead."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "the command line to type"},
                    "wait": {
                        "type": "number",
                        "description": f"most seconds to wait for it (default {DEFAULT_WAIT:g}, "
                        f"at most {MAX_DURATION:g}); call again with an empty command to wait longer",
                    },
                },
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": COMPLETE,
            "description": (
                "Declare the task solved. The first call shows the terminal and asks for a "
                "confirmation; calling it again in the next answer ends the task: its tests "
                "run and nothing can be changed after."
            ),
            "parameters": {"type": "object", "properties": {}},
        },
    },
]


class CallError(ValueError):
    pass


def first_prompt(instruction: str, terminal_state: str) -> str:
    return render(
        "tools_prompt.j2",
        instruction=instruction.strip(),
        terminal_state=terminal_state,
        bash=BASH,
        complete=COMPLETE,
    )


def parse_call(call: dict) -> tuple[str, dict]:
    """A tool call's tool and its arguments; CallError says what is wrong with it."""
    fn: dict = call["function"] if isinstance(call.get("function"), dict) else {}
    name = fn.get("name")
    if name not in (BASH, COMPLETE):
        raise CallError(f"there is no tool {name!r}; the tools are {BASH}, {COMPLETE}")
    text = fn.get("arguments")
    try:
        args = json.loads(text) if isinstance(text, str) and text.strip() else {}
    except ValueError as e:
        raise CallError(f"the arguments of {name} are not valid JSON ({e})") from None
    if not isinstance(args, dict):
        raise CallError(f"the arguments of {name} must be a JSON object")
    if name == BASH:
        if not isinstance(args.get("command"), str):
            raise CallError(f'{BASH} needs "command", a string')
        wait = args.get("wait", DEFAULT_WAIT)
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not math.isfinite(wait):
            raise CallError(f'"wait" of {BASH} must be a number of seconds')
    return name, args


def bash_command(args: dict) -> Command:
    """The keystrokes of a `bash` call: the command and Enter (a lone key name as it is), its
    wait bounded to [0, MAX_DURATION]."""
    command = args["command"]
    keys = command if command.strip() in _KEY_NAMES or command.endswith("\n") else command + "\n"
    return Command(keys, min(max(float(args.get("wait", DEFAULT_WAIT)), 0.0), MAX_DURATION))


def _key_names() -> frozenset[str]:
    from otbuild.harness.terminal import KEYS

    return frozenset(KEYS)


_KEY_NAMES = _key_names()


def tool_message(call_id: str | None, text: str) -> dict:
    return {"role": "tool", "content": text, "tool_call_id": call_id or ""}


def confirm_text(output: str) -> str:
    return (
        f"The terminal now:\n{output}\n\nThe task is not yet ended: its tests run once it is, and "
        f"nothing can be changed after. To end it, call {COMPLETE} again in your next answer."
    )


class ToolsTurns:
    """The tools protocol for the turn loop (otbuild/harness/turns.py)."""

    name = "tools"
    tools = TOOLS

    def first_messages(self, instruction: str, screen: str) -> list[dict]:
        return [user(first_prompt(instruction, screen))]

    def request(self) -> dict:
        return {"tools": self.tools}

    def assistant_message(self, completion: Completion) -> dict:
        message: dict = {"role": "assistant", "content": completion.text}
        if completion.tool_calls:
            message["tool_calls"] = completion.tool_calls
        return message

    def handle(self, completion: Completion) -> Plan:
        if not completion.tool_calls:
            return Plan([Action(None, lambda _out, _alive: user(NO_TOOL_CALL))], None)
        actions: list[Action] = []
        complete: bool | None = None
        for call in completion.tool_calls:
            call_id = call.get("id")
            try:
                name, args = parse_call(call)
            except CallError as e:
                actions.append(Action(None, _reply(call_id, f"ERROR: {e}")))
                continue
            if name == BASH:
                actions.append(Action([bash_command(args)], _reply(call_id)))
                complete = complete or False
            else:  # the terminal as it is now, and the question
                actions.append(Action([], _reply(call_id, confirm=True)))
                complete = True
        return Plan(actions, complete)


def _reply(call_id: str | None, error: str | None = None, confirm: bool = False):
    def reply(output: str | None, alive: bool) -> dict:
        if error is not None:
            return tool_message(call_id, error)
        text = output or ""  # capped already (agent._execute)
        return tool_message(call_id, confirm_text(text) if confirm and alive else text)

    return reply
