"""The terminus-2 turn protocol: parse the model's JSON answer, and the harness's replies.

Two prompt styles share the protocol (`prompt_style(name)`): `terminus2`, the harness's own
texts (a ~1,300-character instruction in otbuild's words; Harbor's exact terminus-2 text
reaches traces only through Harbor, `sandbox: harbor`), and `compact`, for tiny students: a
short system text, answers as JSON without indentation and with short analysis/plan, terse
replies. The same style is used by rollouts, SFT (`compact_conversation` rewrites any
terminus2 trace) and eval.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from otbuild.fsio import parquet_batches
from otbuild.prompts import render
from otbuild.settings.recipe import PROMPTS
from otbuild.traces.table import step_conversations

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


def _answer_regex() -> str:
    """The answer frame as a regular expression (for constrained decoding): the keys in the
    prompt's order, JSON strings, durations as plain numbers, a little whitespace allowed."""
    w = r"[ \n]{0,8}"
    string = r'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt])*"'
    key = lambda name: f'{w}"{name}"{w}:{w}'
    command = rf"{w}\{{{key('keystrokes')}{string}{w},{key('duration')}[0-9]{{1,3}}(?:\.[0-9]{{1,2}})?{w}\}}"
    return (
        rf"{w}\{{{key('analysis')}{string}{w},{key('plan')}{string}{w},{key('commands')}\["
        rf"(?:{command}(?:{w},{command})*)?{w}\]{w},{key('task_complete')}(?:true|false){w}\}}"
    )


ANSWER_REGEX = _answer_regex()


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


def parse_error_reply(error: Exception | str) -> str:
    return f"Your last answer could not be read:\nERROR: {error}\n\nAnswer again with one valid JSON object."


def observation_reply(output: str) -> str:
    return f"New Terminal Output:\n{output}"


def confirm_reply(output: str) -> str:
    return (
        f"The terminal now:\n{output}\n\nMarking the task complete ends the trial: the tests run and "
        'nothing can be changed after. To confirm, answer again with "task_complete": true.'
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


def format_answer(answer: dict) -> str:
    return json.dumps(answer, indent=2)


class Terminus2:
    """The harness's texts: terminus-2's protocol, otbuild's words."""

    name = "terminus2"
    first_prompt = staticmethod(first_prompt)
    parse_error_reply = staticmethod(parse_error_reply)
    observation_reply = staticmethod(observation_reply)
    confirm_reply = staticmethod(confirm_reply)
    format_answer = staticmethod(format_answer)


class Compact:
    """Short texts for tiny students: every token the student reads is one it can afford."""

    name = "compact"
    ANALYSIS_CHARS = 120  # analysis/plan of a rewritten trace: the first sentence, at most this

    @staticmethod
    def first_prompt(instruction: str, terminal_state: str) -> str:
        return render("compact_prompt.j2", instruction=instruction.strip(), terminal_state=terminal_state)

    @staticmethod
    def parse_error_reply(error: Exception | str) -> str:
        return f"Invalid answer: {error}. Reply with one JSON object."

    @staticmethod
    def observation_reply(output: str) -> str:
        return f"Output:\n{output}"

    @staticmethod
    def confirm_reply(output: str) -> str:
        return f"Output:\n{output}\nDone? Reply task_complete true again to confirm."

    @staticmethod
    def format_answer(answer: dict) -> str:
        return json.dumps(answer, separators=(",", ":"))


def prompt_style(name: str):
    """The texts of prompt style `name` (one of PROMPTS)."""
    styles = {"terminus2": Terminus2, "compact": Compact}
    if name not in styles:
        raise ValueError(f"unknown prompt style {name!r}; choose from {list(styles)}")
    return styles[name]


# otbuild's terminus2 texts, and Harbor's terminus-2 ones (traces that Harbor ran or exported)
_T2_FIRST = re.compile(
    r"(?:The task|Task Description):\n(.*)\n\n(?:The terminal now|Current terminal state):\n(.*)\Z", re.DOTALL
)
_T2_ERROR = re.compile(
    r"(?:Your last answer could not be read|Previous response had parsing errors):\nERROR: (.*)"
    r"\n\n(?:Answer again|Please fix)",
    re.DOTALL,
)
_T2_CONFIRM = re.compile(
    r"(?:The terminal now|Current terminal state):\n(.*)\n\n"
    r"(?:Marking the task complete|Are you sure you want)",
    re.DOTALL,
)
_T2_OUTPUT = "New Terminal Output:\n"


def compact_conversation(conversation: list[dict]) -> list[dict]:
    """A terminus2 trace in the compact style (a compact one is returned as it is): the first
    prompt, the replies and every parseable answer rewritten; anything else kept verbatim."""
    out, first = [], True
    for m in conversation:
        role, text = m["role"], m.get("content") or ""
        if role == "user":
            text = _compact_user(text, first)
            first = False
        elif role == "assistant":
            text = _compact_answer(text)
        out.append({**m, "content": text})
    return out


def _compact_user(text: str, first: bool) -> str:
    if first and (m := _T2_FIRST.search(text)):
        return Compact.first_prompt(m.group(1), m.group(2).removesuffix("\n"))  # the template adds it
    if text.startswith(_T2_OUTPUT):
        return Compact.observation_reply(text[len(_T2_OUTPUT) :])
    if m := _T2_ERROR.match(text):
        return Compact.parse_error_reply(m.group(1))
    if m := _T2_CONFIRM.match(text):
        return Compact.confirm_reply(m.group(1))
    return text


def _compact_answer(text: str) -> str:
    try:
        a = parse_answer(text)
    except ParseError:
        return text
    return Compact.format_answer(
        {
            "analysis": _short(a.analysis),
            "plan": _short(a.plan),
            "commands": [{"keystrokes": c.keystrokes, "duration": c.duration} for c in a.commands],
            "task_complete": a.task_complete,
        }
    )


def _short(text: str) -> str:
    first = re.split(r"(?<=[.!?])\s", text.strip(), maxsplit=1)[0]
    return first[: Compact.ANALYSIS_CHARS]


def iter_conversations(paths, batch_rows: int = 32, prompt: str = PROMPTS[0]) -> Iterator[list]:
    """The inputs' conversations as a model was sent them (`conversations_of`), `batch_rows`
    traces at a time, in order."""
    for path in [paths] if isinstance(paths, (str, Path)) else paths:
        for batch in trace_batches(path, batch_rows):
            yield [conv for _, conv in conversations_of(batch, prompt)]


def trace_batches(path, batch_rows: int):
    """A trace parquet's `conversations` and (where the file has them) `metadata` and `tools`,
    in batches."""
    names = pq.ParquetFile(path).schema_arrow.names
    return parquet_batches(path, batch_rows, [c for c in ("conversations", "metadata", "tools") if c in names])


def conversations_of(batch, prompt: str = PROMPTS[0]) -> list[tuple[int, list | None]]:
    """(row, conversation) pairs of a batch of `trace_batches`: one per trace, but one per step
    of a multi-step trial, each step having begun a conversation of its own
    (`traces.table.step_conversations`); rewritten as the compact harness renders them when
    `prompt` is compact."""
    convs = batch.column("conversations").to_pylist()
    metas = batch.column("metadata").to_pylist() if "metadata" in batch.schema.names else [None] * len(convs)
    return [
        (i, compact_conversation(c) if c and prompt == "compact" else c)
        for i, (conv, meta) in enumerate(zip(convs, metas, strict=True))
        for c in (step_conversations(conv, meta) if conv else [conv])
    ]
