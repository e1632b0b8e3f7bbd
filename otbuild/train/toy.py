"""Trace sets for tests and benchmarks, without running a sandbox: each synthetic task's
reference solution as a terminus-2 conversation (one command per assistant turn, a canned
observation per user turn), or as a native tool-calling one (`tool_trace_rows`: each command a
`bash` tool call, its output a `tool` message), in the trace parquet's schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from otbuild.harness import protocol
from otbuild.harness.oracle_steps import split_commands
from otbuild.sources.synthetic import generate
from otbuild.tasks.taskdir import SOLUTION
from otbuild.traces.table import TRACE_SCHEMA, write_traces


def conversation(instruction: str, steps: list[str], full_prompt: bool = True) -> list[dict]:
    """full_prompt: the harness's terminus-2 first prompt; else the instruction alone (short)."""
    first = protocol.first_prompt(instruction, "root@box:/app# ") if full_prompt else instruction
    conv = [{"role": "user", "content": first}]
    for i, step in enumerate(steps + [""]):
        done = i == len(steps)
        answer = {
            "analysis": f"Step {i + 1}." if not done else "Done.",
            "plan": f"Run: {step.splitlines()[0]}" if not done else "Finish.",
            "commands": [] if done else [{"keystrokes": step + "\n", "duration": 1.0}],
            "task_complete": done,
        }
        conv.append({"role": "assistant", "content": json.dumps(answer, indent=2)})
        if not done:
            conv.append({"role": "user", "content": f"New Terminal Output:\n{step}\nroot@box:/app# "})
    return conv


# the tools a toy tool-calling trace was offered (OpenAI tool definitions)
TOY_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command in the task's terminal and return its output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "the command line"}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "task_complete",
            "description": "Say the task is done.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]


def tool_conversation(instruction: str, steps: list[str]) -> list[dict]:
    """The solution as tool calls: a reasoning block and a `bash` call per step (arguments as
    vLLM's hermes parser writes them: json.dumps), its output as the `tool` message, then
    `task_complete` and a closing answer."""
    conv: list[dict] = [{"role": "user", "content": instruction}]
    calls = [("bash", {"command": step}) for step in steps] + [("task_complete", {})]
    for i, (name, args) in enumerate(calls):
        call_id = f"call_{i}"
        conv.append(
            {
                "role": "assistant",
                "content": f"<think>\nStep {i + 1}: {name}.\n</think>\n\n" + ("Running it." if i % 2 else ""),
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
                    }
                ],
            }
        )
        output = f"{args['command'].splitlines()[0]}\nroot@box:/app# " if name == "bash" else "done"
        conv.append({"role": "tool", "content": output, "tool_call_id": call_id})
    conv.append({"role": "assistant", "content": "<think>\nAll steps ran.\n</think>\n\nDone."})
    return conv


def tool_trace_rows(n: int, seed: int = 0) -> list[dict]:
    """Toy traces of a tool-calling harness: `tool_conversation`s with their `tools` column."""
    rows = []
    for row, rec in zip(trace_rows(n, seed, full_prompt=False), generate(n, seed), strict=True):
        conv = tool_conversation(rec.task.instruction, split_commands(rec.task.text(SOLUTION) or ""))
        row.update(conversations=conv, tools=json.dumps(TOY_TOOLS), n_turns=sum(m["role"] == "assistant" for m in conv))
        rows.append(row)
    return rows


def trace_rows(n: int, seed: int = 0, full_prompt: bool = True) -> list[dict]:
    rows = []
    for i, rec in enumerate(generate(n, seed)):
        conv = conversation(rec.task.instruction, split_commands(rec.task.text(SOLUTION) or ""), full_prompt)
        row: dict[str, Any] = {k: None for k in TRACE_SCHEMA.names}
        row.update(
            conversations=conv,
            task=rec.task.name,
            task_id=rec.task.task_id(),
            reward=1.0,
            n_turns=sum(m["role"] == "assistant" for m in conv),
            sample_idx=0,
            trial_name=f"toy-{i}",
            source="toy",
            timed_out=False,
            is_subagent=False,
        )
        rows.append(row)
    return rows


def write_toy_traces(dest: Path, n: int, seed: int = 0, full_prompt: bool = True, tools: bool = False) -> Path:
    """`tools`: tool-calling traces (`tool_trace_rows`) instead of terminus-2 ones."""
    write_traces(dest, tool_trace_rows(n, seed) if tools else trace_rows(n, seed, full_prompt))
    return dest
