"""Trace sets for tests and benchmarks, without running a sandbox: each synthetic task's
reference solution as a terminus-2 conversation (one command per assistant turn, a canned
observation per user turn), in the trace parquet's schema."""

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


def write_toy_traces(dest: Path, n: int, seed: int = 0, full_prompt: bool = True) -> Path:
    write_traces(dest, trace_rows(n, seed, full_prompt))
    return dest
