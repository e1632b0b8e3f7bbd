"""A model's tool calls read from its text as vLLM's `hermes` tool parser reads them (the parser
for Qwen3's `<tool_call>` blocks): `otbuild serve` and the RL policy answer with the same
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
