"""A Harbor trial's trace from its captured calls (otbuild/harbor/captured.py), on handwritten
calls and an agent log: the last call's request and answer, the tools, each answer held
against the agent's own record of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from otbuild.harbor.captured import apply
from otbuild.harbor.job import AgentNotInstalled, agent_venv, job_config
from otbuild.traces.table import count_turns
from tests.conftest import REPO

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


def call(idx: int, messages: list[dict], content: str, command: str, status: int = 200) -> dict:
    tool_calls = [
        {
            "id": f"c{idx}",
            "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": command})},
        }
    ]
    return {
        "scope": "task__A",
        "call_idx": idx,
        "status": status,
        "delivered": True,
        "request": json.dumps({"model": "m", "messages": messages, "tools": TOOLS}),
        "content": content,
        "reasoning": None,
        "tool_calls": json.dumps(tool_calls),
    }


def trial(tmp_path, logged: list[dict]) -> dict:
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "mini-swe-agent.trajectory.json").write_text(json.dumps({"messages": logged}))
    meta = {"harbor_trial_dir": str(tmp_path)}
    return {"agent": "mini-swe-agent", "trial_name": "task__A", "conversations": [], "metadata": json.dumps(meta)}


def test_the_trace_is_the_last_calls_request_and_answer_and_the_agents_log_is_held_against_each(tmp_path):
    first = [{"role": "system", "content": "sys"}, {"role": "user", "content": [{"type": "text", "text": "do it"}]}]
    a0 = {"role": "assistant", "content": "look", "tool_calls": json.loads(call(0, [], "", "ls")["tool_calls"])}
    second = [*first, a0, {"role": "tool", "tool_call_id": "c0", "content": "out"}]
    calls = [call(0, first, "look", "ls"), call(1, second, "", "echo COMPLETE")]
    logged = [{"role": "assistant", "content": "look", "tool_calls": a0["tool_calls"]}]
    logged.append(
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "bash", "arguments": "{}"}}]}
    )
    row, rows = apply(trial(tmp_path, logged), calls, 7, keep_reasoning=True)
    conv = row["conversations"]
    assert [m["role"] for m in conv] == ["system", "user", "assistant", "tool", "assistant"]
    assert conv[1]["content"] == "do it" and conv[3]["tool_call_id"] == "c0"
    assert conv[-1]["tool_calls"][0]["function"]["arguments"] == json.dumps({"command": "echo COMPLETE"})
    assert json.loads(row["tools"]) == TOOLS and row["n_turns"] == count_turns(conv) == 2
    # the agent logged the second answer's arguments otherwise: counted, on that call
    assert [r["harness_agrees"] for r in rows] == [True, False] and {r["trial"] for r in rows} == {7}
    meta = json.loads(row["metadata"])
    assert meta["trace_from"] == "capture" and meta["harness_disagrees"] == 1


def test_answers_the_agent_refused_are_held_against_the_capture_from_its_log(tmp_path):
    """mini-swe-agent drops an answer without a tool call (or cut off at max_tokens) from its
    conversation: the user message it sends instead keeps the response (`extra.response`).
    Those answers count as logged, in order, beside the assistant messages."""
    first = [{"role": "system", "content": "sys"}, {"role": "user", "content": "do it"}]

    def refused(content: str) -> dict:
        message = {"role": "assistant", "content": content, "tool_calls": None}
        response = {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
        return {"role": "user", "content": "Tool call error: no tool calls", "extra": {"response": response}}

    calls = [call(0, first, "no tool \x1d", "ls"), call(1, first, "again", "ls"), call(2, first, "", "ls")]
    for c in calls[:2]:
        c["tool_calls"] = None
    logged = [first[0], refused("no tool \x1d"), refused("agin"), {"role": "user", "extra": {"response": "repr"}}]
    logged.append({"role": "exit", "content": "RepeatedFormatError", "extra": {"exit_status": "RepeatedFormatError"}})
    row, rows = apply(trial(tmp_path, logged), calls, 0, keep_reasoning=True)
    # the second was logged otherwise; the third's response is no record otbuild reads
    assert [r["harness_agrees"] for r in rows] == [True, False, False]
    assert json.loads(row["metadata"])["harness_disagrees"] == 2
    assert [m["role"] for m in row["conversations"]] == ["system", "user", "assistant"]


def test_without_an_answered_call_the_agents_own_conversation_stays(tmp_path):
    mine = trial(tmp_path, [])
    mine["conversations"] = [{"role": "user", "content": "task", "tool_calls": None, "tool_call_id": None}]
    row, rows = apply(mine, [call(0, [], "", "ls", status=500)], 0, keep_reasoning=True)
    assert row["conversations"] == mine["conversations"] and json.loads(row["metadata"])["trace_from"] == "agent"
    assert [r["harness_agrees"] for r in rows] == [None]


def test_installed_agents_skip_harbors_install_and_others_are_refused(tmp_path):
    cfg = job_config(tmp_path, tmp_path, "j", agent="mini-swe-agent", model="openai/m")
    assert cfg["agents"][0]["kwargs"]["skip_install"] is True
    assert (
        "skip_install"
        not in job_config(tmp_path, tmp_path, "j", agent="mini-swe-agent", model="openai/m", environment="docker")[
            "agents"
        ][0]["kwargs"]
    )
    with pytest.raises(ValueError, match="'claude-code' is not one otbuild runs"):
        job_config(tmp_path, tmp_path, "j", agent="claude-code", model="openai/m")
    with pytest.raises(AgentNotInstalled, match="scripts/agents-env.sh"):
        agent_venv("mini-swe-agent", tmp_path)


def test_a_harbor_agent_otbuild_does_not_run_is_a_config_error_naming_the_key(tmp_path):
    (tmp_path / "r.yaml").write_text(
        "sources:\n  synth: {kind: synthetic, count: 2, seed: 21}\n"
        "teacher: {engine: openai, base_url: 'http://127.0.0.1:9/v1', model: m, sandbox: harbor,\n"
        "          harbor: {agent: claude-code, environment: otbuild}}\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "otbuild", "plan", str(tmp_path / "r.yaml")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "teacher.harbor.agent" in proc.stderr + proc.stdout and "mini-swe-agent" in proc.stderr + proc.stdout
