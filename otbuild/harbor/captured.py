"""A Harbor trial's trace from its captured model calls (the capture proxy's scope per trial),
not from the agent's own log: what the model was sent and what it answered.

The conversation is the trial's LAST answered call: its request's messages (what the model saw
when it answered last) and its answer (content, tool calls); `tools` is that request's tools.
Each call's answer is held against the agent's own record of it (mini-swe-agent's trajectory:
its assistant messages, and the answers it refused, in order): `harness_agrees` per call,
counted in the stage's stats.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from otbuild.traces.table import assistant_turn, count_turns

# where an installed agent keeps its own conversation in Harbor's trial dir, and how to read it
AGENT_LOGS = {"mini-swe-agent": "agent/mini-swe-agent.trajectory.json"}


def message(m: Any) -> dict:
    """A request's message as a trace MESSAGE: text content (a list of parts joined), an
    assistant's tool calls with their arguments as sent, a tool message's tool_call_id."""
    m = m if isinstance(m, dict) else {}
    return {
        "role": str(m.get("role") or ""),
        "content": _text(m.get("content")),
        "tool_calls": _tool_calls(m.get("tool_calls")),
        "tool_call_id": m.get("tool_call_id") if isinstance(m.get("tool_call_id"), str) else None,
    }


def answer(call: dict, keep_reasoning: bool = True) -> dict:
    """A call's answer as the trace's assistant message: its content byte for byte (its
    reasoning before it as `assistant_turn` writes it), its tool calls."""
    reasoning = call.get("reasoning") if keep_reasoning else None
    return {
        "role": "assistant",
        "content": assistant_turn(call.get("content") or "", reasoning),
        "tool_calls": _tool_calls(json.loads(call["tool_calls"]) if call.get("tool_calls") else None),
        "tool_call_id": None,
    }


def conversation(calls: list[dict], keep_reasoning: bool = True) -> tuple[list[dict], str | None] | None:
    """(messages, tools JSON) from the trial's calls: the last answered call's request messages
    and its answer; None when no call was answered."""
    answered = [c for c in calls if c.get("status") == 200 and c.get("delivered")]
    if not answered:
        return None
    last = answered[-1]
    try:
        request = json.loads(last["request"])
    except (TypeError, ValueError):
        return None
    if not isinstance(request, dict):
        return None
    messages = [message(m) for m in request.get("messages") or []]
    tools = request.get("tools")
    return [*messages, answer(last, keep_reasoning)], json.dumps(tools) if tools else None


def agent_answers(trial_dir: Path, agent: str) -> list[dict | None] | None:
    """The agent's own record of the model's answers, in order: its log's assistant messages,
    and each answer it refused (mini-swe-agent's format error, an answer without a tool call or
    cut off at max_tokens, is a user message that keeps the response it got in `extra.response`;
    None where that is not a readable response); None when the agent keeps no log otbuild reads
    or the file is missing or broken."""
    name = AGENT_LOGS.get(agent)
    if name is None:
        return None
    try:
        log = json.loads((Path(trial_dir) / name).read_text())
    except (OSError, ValueError):
        return None
    messages = log.get("messages") if isinstance(log, dict) else None
    if not isinstance(messages, list):
        return None
    return [logged_answer(m) for m in messages if isinstance(m, dict) and is_answer(m)]


def is_answer(m: dict) -> bool:
    """The log message is the model's answer, or stands for one the agent refused."""
    return m.get("role") == "assistant" or (isinstance(m.get("extra"), dict) and "response" in m["extra"])


def logged_answer(m: dict) -> dict | None:
    """The answer a log message records: an assistant message as the agent kept it; for a
    refused answer, the response's first message."""
    if m.get("role") == "assistant":
        return m
    response = m["extra"]["response"]
    choices = response.get("choices") if isinstance(response, dict) else None
    first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    return first.get("message") if isinstance(first.get("message"), dict) else None


def agrees(call: dict, logged: dict | None) -> bool:
    """The agent logged this answer as it came: the same content and the same tool calls (name
    and arguments text)."""
    if logged is None:
        return False
    said = answer(call, keep_reasoning=False)
    kept = message(logged)
    return said["content"] == kept["content"] and _calls_key(said["tool_calls"]) == _calls_key(kept["tool_calls"])


def apply(row: dict, calls: list[dict], trial: int | None, keep_reasoning: bool) -> tuple[dict, list[dict]]:
    """The trial's row with its conversation and tools from its calls (the agent's own stays
    when no call was answered), and its call rows with `harness_agrees`; the metadata says
    which the trace came from and how many answers the agent's log disagreed with."""
    meta = json.loads(row.get("metadata") or "{}")
    logged = agent_answers(Path(meta.get("harbor_trial_dir") or ""), str(row.get("agent") or ""))
    rows, n = [], 0
    for call in calls:
        out = {**call, "trial": trial, "trial_name": row.get("trial_name"), "harness_agrees": None}
        if logged is not None and call["status"] == 200 and call["delivered"]:
            out["harness_agrees"] = agrees(call, logged[n] if n < len(logged) else None)
            n += 1
        rows.append(out)
    built = conversation(calls, keep_reasoning)
    meta["trace_from"] = "agent" if built is None else "capture"
    meta["harness_disagrees"] = sum(r["harness_agrees"] is False for r in rows)
    row = {**row, "metadata": json.dumps(meta, sort_keys=True, default=str)}
    if built is not None:
        messages, tools = built
        row.update(conversations=messages, tools=tools, n_turns=count_turns(messages))
    return row, rows


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text") or "" if isinstance(p, dict) else str(p) for p in content)
    return json.dumps(content)


def _tool_calls(calls: Any) -> list[dict] | None:
    if not isinstance(calls, list) or not calls:
        return None
    out = []
    for c in calls:
        c = c if isinstance(c, dict) else {}
        fn: dict = c["function"] if isinstance(c.get("function"), dict) else {}
        arguments = fn.get("arguments")
        out.append(
            {
                "id": c.get("id"),
                "type": c.get("type") or "function",
                "function": {
                    "name": fn.get("name"),
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            }
        )
    return out


def _calls_key(calls: list[dict] | None) -> list[tuple]:
    return [(c["function"]["name"], c["function"]["arguments"]) for c in calls or []]
