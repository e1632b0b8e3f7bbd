"""One captured call as a record: the request without its secrets, the response assembled
(from its SSE chunks when streamed), and the token ids and log-probs the server sent (vLLM:
`return_token_ids` gives `prompt_token_ids` and each choice's `token_ids`; `logprobs` gives
`choices[].logprobs.content[].logprob`)."""

from __future__ import annotations

import json
import re
from typing import Any

# a request body's top-level fields that carry a credential (a client's own key, a gateway's
# token): never recorded (deeper down, a tool's schema may well name a property `key`)
SECRET_FIELD = re.compile(r"^(api[_-]?key|key|authorization|access[_-]?token|token|secret|password)$", re.IGNORECASE)
REDACTED = "[redacted]"


def redact(body: Any, secrets: tuple[str, ...] = ()) -> Any:
    """A request body without its credential fields, every occurrence of a known secret (the
    request's own Authorization value, a key in its URL) masked."""
    if isinstance(body, dict):
        body = {k: v for k, v in body.items() if not SECRET_FIELD.match(str(k))}
    return masked(body, secrets)


def masked(value: Any, secrets: tuple[str, ...]) -> Any:
    if isinstance(value, dict):
        return {k: masked(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v, secrets) for v in value]
    if isinstance(value, str):
        return mask(value, secrets)
    return value


def mask(text: str, secrets: tuple[str, ...]) -> str:
    for s in secrets:
        if s:
            text = text.replace(s, REDACTED)
    return text


def sse_events(data: bytes) -> list[dict]:
    """The JSON payloads of an SSE stream's `data:` lines (not `[DONE]`, not comments)."""
    out = []
    for line in data.splitlines():
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if not payload or payload == b"[DONE]":
            continue
        try:
            event = json.loads(payload)
        except ValueError:
            continue
        if isinstance(event, dict):
            out.append(event)
    return out


def assemble(chunks: list[dict]) -> dict:
    """A chat completion body from its stream's chunks: each choice's content, reasoning and
    tool calls joined in order, its token ids and log-probs concatenated, the last finish
    reason; the stream's usage and prompt token ids where a chunk carried them."""
    body: dict[str, Any] = {"object": "chat.completion"}
    choices: dict[int, dict] = {}
    for chunk in chunks:
        for key in ("id", "model", "created", "system_fingerprint"):
            if chunk.get(key) is not None:
                body.setdefault(key, chunk[key])
        if chunk.get("usage"):
            body["usage"] = chunk["usage"]
        if chunk.get("prompt_token_ids") is not None:
            body["prompt_token_ids"] = chunk["prompt_token_ids"]
        for c in chunk.get("choices") or []:
            _add_delta(choices.setdefault(int(c.get("index") or 0), _empty_choice(c)), c)
    body["choices"] = [_finish_choice(choices[i]) for i in sorted(choices)]
    return body


def _empty_choice(c: dict) -> dict:
    return {"index": int(c.get("index") or 0), "message": {"role": "assistant"}, "_parts": {}, "_tools": {}}


def _add_delta(choice: dict, c: dict) -> None:
    delta = c.get("delta") or {}
    for key in ("content", "reasoning", "reasoning_content"):
        if isinstance(delta.get(key), str):
            choice["_parts"].setdefault(key, []).append(delta[key])
    for call in delta.get("tool_calls") or []:
        slot = choice["_tools"].setdefault(int(call.get("index") or 0), {"function": {"arguments": []}})
        for key in ("id", "type"):
            if call.get(key):
                slot[key] = call[key]
        fn = call.get("function") or {}
        if fn.get("name"):
            slot["function"]["name"] = fn["name"]
        if isinstance(fn.get("arguments"), str):
            slot["function"]["arguments"].append(fn["arguments"])
    if c.get("token_ids") is not None:
        choice.setdefault("token_ids", []).extend(c["token_ids"])
    content = (c.get("logprobs") or {}).get("content")
    if isinstance(content, list):
        choice.setdefault("logprobs", {"content": []})["content"].extend(content)
    if c.get("finish_reason") is not None:
        choice["finish_reason"] = c["finish_reason"]
    if c.get("stop_reason") is not None:
        choice["stop_reason"] = c["stop_reason"]


def _finish_choice(choice: dict) -> dict:
    parts, tools = choice.pop("_parts"), choice.pop("_tools")
    for key, texts in parts.items():
        choice["message"][key] = "".join(texts)
    if tools:
        choice["message"]["tool_calls"] = [
            {**t, "function": {**t["function"], "arguments": "".join(t["function"]["arguments"])}}
            for _, t in sorted(tools.items())
        ]
    choice.setdefault("finish_reason", None)
    return choice


def lean(answer: Any, logprobs: bool = False) -> Any:
    """The answer as a record's `response` keeps it: without its token ids, which the record
    holds in columns of their own (a long prompt's ids would be most of the text, at every
    call); with `logprobs`, without the log-probs the proxy asked for on the caller's behalf
    (their column has them). Log-probs the caller asked for stay, top_logprobs and all."""
    if not isinstance(answer, dict):
        return answer
    drop = {"token_ids", "logprobs"} if logprobs else {"token_ids"}
    out = {k: v for k, v in answer.items() if k != "prompt_token_ids"}
    if isinstance(out.get("choices"), list):
        choices = out["choices"]
        out["choices"] = [{k: v for k, v in c.items() if k not in drop} if isinstance(c, dict) else c for c in choices]
    return out


def call_fields(body: Any) -> dict:
    """The record's columns read off a chat completion body (its first choice)."""
    out: dict[str, Any] = {
        "content": None,
        "reasoning": None,
        "tool_calls": None,
        "finish_reason": None,
        "prompt_tokens": None,
        "completion_tokens": None,
        "prompt_token_ids": None,
        "completion_token_ids": None,
        "logprobs": None,
    }
    if not isinstance(body, dict):
        return out
    usage = body.get("usage") or {}
    out["prompt_tokens"] = usage.get("prompt_tokens")
    out["completion_tokens"] = usage.get("completion_tokens")
    out["prompt_token_ids"] = body.get("prompt_token_ids")
    choices = body.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return out
    choice = choices[0]
    message = choice.get("message") or {}
    out["content"] = message.get("content")
    out["reasoning"] = message.get("reasoning_content") or message.get("reasoning")
    if message.get("tool_calls"):
        out["tool_calls"] = json.dumps(message["tool_calls"], sort_keys=True)
    out["finish_reason"] = choice.get("finish_reason")
    out["completion_token_ids"] = choice.get("token_ids")
    tokens = (choice.get("logprobs") or {}).get("content")
    if isinstance(tokens, list):
        out["logprobs"] = [float(t["logprob"]) for t in tokens if isinstance(t, dict) and "logprob" in t]
    return out
