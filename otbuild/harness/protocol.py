"""The terminus-2 turn protocol: parse the model's JSON answer, and the harness's replies."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from otbuild.prompts import render

MAX_DURATION = 60.0
MAX_OUTPUT_BYTES = 10_000


@dataclass
class Command:
    keystrokes: str
    duration: float = 1.0


@dataclass
class Answer:
    analysis: str = ""
    plan: str = ""
    commands: list[Command] = field(default_factory=list)
    task_complete: bool = False


class ParseError(ValueError):
    pass


def first_prompt(instruction: str, terminal_state: str) -> str:
    return render(
        "terminus2_prompt.j2",
        instruction=instruction.strip(),
        terminal_state=terminal_state,
        max_duration=int(MAX_DURATION),
        max_output_bytes=MAX_OUTPUT_BYTES,
    )


def parse_answer(text: str) -> Answer:
    """The JSON object in the answer (code fences and text around it are tolerated)."""
    obj = _json_object(text)
    if not isinstance(obj.get("commands", []), list):
        raise ParseError('"commands" must be an array')
    commands = []
    for i, c in enumerate(obj.get("commands", [])):
        if not isinstance(c, dict) or not isinstance(c.get("keystrokes"), str):
            raise ParseError(f'commands[{i}] must be an object with a string "keystrokes"')
        try:
            duration = float(c.get("duration", 1.0))
        except (TypeError, ValueError):
            raise ParseError(f"commands[{i}].duration must be a number") from None
        commands.append(Command(c["keystrokes"], min(max(duration, 0.0), MAX_DURATION)))
    complete = obj.get("task_complete", False)
    if isinstance(complete, str):
        complete = complete.strip().lower() == "true"
    return Answer(str(obj.get("analysis", "")), str(obj.get("plan", "")), commands, bool(complete))


def _json_object(text: str) -> dict:
    fenced = re.search(r"```(?:json)?\s*(\{.*?\})\s*```", text, re.DOTALL)
    candidates = [fenced.group(1)] if fenced else []
    start, end = text.find("{"), text.rfind("}")
    if start != -1 and end > start:
        candidates.append(text[start : end + 1])
    if not candidates:
        raise ParseError("no JSON object found in the response")
    error = None
    for c in candidates:
        try:
            obj = json.loads(c)
        except json.JSONDecodeError as e:
            error = e
            continue
        if isinstance(obj, dict):
            return obj
    raise ParseError(f"invalid JSON: {error}")


def parse_error_reply(error: Exception) -> str:
    return (
        f"Previous response had parsing errors:\nERROR: {error}\n\n"
        "Please fix these issues and provide a proper JSON response."
    )


def observation_reply(output: str) -> str:
    return f"New Terminal Output:\n{output}"


def confirm_reply(output: str) -> str:
    return (
        f"Current terminal state:\n{output}\n\nAre you sure you want to mark the task as complete? "
        "This will trigger your solution to be graded and you won't be able to make any further "
        'corrections. If so, include "task_complete": true in your JSON response again.'
    )


def cap_output(text: str, limit: int = MAX_OUTPUT_BYTES) -> str:
    """At most `limit` bytes, keeping the head and the tail."""
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text
    half = limit // 2
    omitted = len(data) - 2 * half
    return (
        data[:half].decode("utf-8", "ignore")
        + f"\n[... output limited to {limit} bytes; {omitted} interior bytes omitted ...]\n"
        + data[-half:].decode("utf-8", "ignore")
    )
