"""Tool calls as vLLM handles them, for otbuild's own models (`otbuild serve`, the RL policy)
and its SFT: a request's earlier calls go to the chat template as vLLM's chat path passes them
(`arguments_object`), and a model's answer is read as vLLM's `hermes` tool parser reads it (the
parser for Qwen3's `<tool_call>` blocks: `parse_tool_calls`), so they answer with the same
`tool_calls` and `content` a vLLM server with `--tool-call-parser hermes` would.

Each `<tool_call>JSON</tool_call>` block (or a last one the answer left open) holds
{"name", "arguments"}; a call's `arguments` is json.dumps of its object (ensure_ascii off), its
id `chatcmpl-tool-` and 32 hex digits; `content` is the text before the first block, None when
there is none. An answer with a block that is not such JSON has no tool calls and all of its
text as content (vLLM's parser gives up the same way).
"""

from __future__ import annotations

import json
import re
import uuid

START = "<tool_call>"
BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)
PARSERS = ("hermes",)  # the --tool-call-parser values otbuild's own servers implement


def arguments_object(call: dict) -> dict | None:
    """A tool call's arguments as the object its JSON text holds (None: not a JSON object, which
    vLLM's chat path replaces with {}: its renderers/chat_utils.py)."""
    args = (call.get("function") or {}).get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    return args if isinstance(args, dict) else None


def template_messages(messages: list[dict]) -> list[dict]:
    """A request's messages as vLLM gives them to the chat template: each assistant tool call's
    arguments as an object ({} where they are not a JSON object)."""
    out = []
    for m in messages:
        if isinstance(m, dict) and m.get("role") == "assistant" and m.get("tool_calls"):
            calls = [
                {**c, "function": {**(c.get("function") or {}), "arguments": arguments_object(c) or {}}}
                for c in m["tool_calls"]
            ]
            m = {**m, "tool_calls": calls}
        out.append(m)
    return out


def parse_tool_calls(text: str) -> tuple[str | None, list[dict] | None]:
    """(content, tool_calls) of a model's answer; tool_calls None: it called none."""
    if START not in text:
        return text, None
    try:
        calls = [json.loads(closed or open_) for closed, open_ in BLOCK.findall(text)]
        tool_calls = [
            {
                "id": f"chatcmpl-tool-{uuid.uuid4().hex}",
                "type": "function",
                "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)},
            }
            for c in calls
        ]
    except (ValueError, KeyError, TypeError):
        return text, None
    return text[: text.find(START)] or None, tool_calls


def tool_calls_of(message: dict) -> list[dict] | None:
    """A chat message's `tool_calls` in the trace's shape ({id, type, function: {name,
    arguments}}; otbuild/traces/table.py), each field as the server sent it; `arguments` that
    came as a JSON value rather than its text is written as JSON text. None: no tool call."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not calls:
        return None
    out = []
    for call in calls:
        call = call if isinstance(call, dict) else {}
        fn = call["function"] if isinstance(call.get("function"), dict) else {}
        arguments = fn.get("arguments")
        out.append(
            {
                "id": _text(call.get("id")),
                "type": _text(call.get("type")) or "function",
                "function": {
                    "name": _text(fn.get("name")),
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            }
        )
    return out


def _text(value) -> str | None:
    return value if isinstance(value, str) else None
