"""Both of the harness's protocols against the real vLLM server (its CPU build in .venv-vllm),
one server for the module, started as the managed vLLM engine starts it for the tools protocol
(`--enable-auto-tool-choice --tool-call-parser hermes`): every assistant turn a trace keeps,
its content and its tool calls, is the answer calls.parquet captured from vLLM, byte for byte.

A random tiny model rarely calls a tool on its own: the tools run names the `bash` function in
`tool_choice`, so vLLM decodes a call under its structured outputs and real tool calls come
back (a random model's arguments are rarely the object the tool asks for: the harness says
what was wrong, in the call's `tool` message)."""

from __future__ import annotations

import itertools
import json
import os
import time

import pyarrow.parquet as pq
import pytest

from otbuild.engines.process import ServerProcess, free_port
from otbuild.engines.vllm import vllm_command, vllm_executable
from otbuild.settings.engines import VLLMOptions
from otbuild.settings.stages import RolloutSettings
from tests.engines.test_vllm_live import SERVED, synthetic_tasks, tiny_qwen3
from tests.harness.test_harness import needs_sandbox

VLLM = vllm_executable(VLLMOptions())
pytestmark = [
    pytest.mark.slow,
    needs_sandbox,
    pytest.mark.skipif(VLLM is None, reason="no vLLM here: make vllm-env (scripts/vllm-env.sh)"),
]
ENGINE_ARGS = {**SERVED, "max_model_len": 4096, "tool_call_parser": "hermes"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(the tiny Qwen3, its server's base URL): one `vllm serve` for every test here."""
    model = tiny_qwen3(tmp_path_factory.mktemp("qwen3") / "model")
    settings = RolloutSettings(engine="vllm", model=str(model), protocol="tools", engine_args=ENGINE_ARGS)
    port = free_port()
    argv = vllm_command(settings, port)
    assert "--enable-auto-tool-choice" in argv and argv[argv.index("--tool-call-parser") + 1] == "hermes"
    server = ServerProcess(argv, name="vllm serve", env=dict(os.environ)).start()
    try:
        server.wait_healthy(f"http://127.0.0.1:{port}/health", time.monotonic() + 600)
        yield model, f"http://127.0.0.1:{port}/v1"
    finally:
        server.stop()


def _rollout(tmp_path, model, base_url, protocol: str, **extra) -> tuple[list[dict], list[dict]]:
    from otbuild.stages.rollout import run_shard

    settings = RolloutSettings(
        engine="openai",
        model=str(model),
        base_url=base_url,
        temperature=1.0,
        seed=3,
        max_tokens=32,
        max_episodes=4,
        concurrency=2,
        sandbox="bwrap",
        protocol=protocol,
        **extra,
    )
    out = tmp_path / protocol
    run_shard(settings, [synthetic_tasks(tmp_path / "tasks.parquet", 2)], out, 0)
    traces = pq.read_table(out / "shards" / "0-of-1.parquet").to_pylist()
    calls = pq.read_table(out / "shards" / "0-of-1.calls.parquet").to_pylist()
    return traces, calls


def _held_against_the_capture(traces: list[dict], calls: list[dict]) -> list[dict]:
    """Each trace's assistant turns against its trial's captured answers, in order; returns the turns."""
    turns = []
    for trace in traces:
        answered = [c for c in calls if c["trial_name"] == trace["trial_name"] and c["status"] == 200]
        mine = [m for m in trace["conversations"] if m["role"] == "assistant"]
        assert len(mine) == len(answered) == trace["n_turns"] > 0, trace["metadata"]
        for m, c in zip(mine, answered, strict=True):
            sent = json.loads(c["response"])["choices"][0]["message"]
            assert m["content"] == (sent.get("content") or "")
            wire = [{"id": t["id"], "type": t["type"], "function": t["function"]} for t in sent.get("tool_calls") or []]
            assert (m["tool_calls"] or []) == wire  # ids, names and arguments byte for byte
            assert c["harness_agrees"] is True
        turns += mine
    return turns


def test_terminus2_turns_are_vllms_answers_byte_for_byte(tmp_path, served):
    model, base_url = served
    traces, calls = _rollout(tmp_path, model, base_url, "terminus2")
    turns = _held_against_the_capture(traces, calls)
    assert all(t["tool_calls"] is None for t in turns) and all(t["tools"] is None for t in traces)
    assert all(json.loads(c["request"]).get("tools") is None for c in calls)


def test_tool_calls_are_vllms_byte_for_byte_and_answered_by_tool_messages(tmp_path, served):
    from transformers import AutoTokenizer

    model, base_url = served
    # a random model's JSON strings run on past max_tokens (a cut call is no call): closing
    # quotes and brackets made likely end each call within a few tokens
    tok = AutoTokenizer.from_pretrained(model)
    closing = {str(tok.convert_tokens_to_ids(t)): 6.0 for t in ('"', "}", "]")}
    named = {"tool_choice": {"type": "function", "function": {"name": "bash"}}, "logit_bias": closing}
    traces, calls = _rollout(tmp_path, model, base_url, "tools", extra_body=named)
    turns = _held_against_the_capture(traces, calls)
    assert all(t["tool_calls"] for t in turns), [c["response"][:300] for c in calls]  # every answer a tool call
    results = [m for t in traces for m in t["conversations"] if m["role"] == "tool"]
    assert results and all(m["content"] for m in results)  # each call answered (run, or what was wrong)
    for trace in traces:
        offered = json.loads(trace["tools"])
        assert [t["function"]["name"] for t in offered] == ["bash", "task_complete"]
        conv = trace["conversations"]
        for answer, reply in itertools.pairwise(conv):
            if answer["role"] == "assistant":  # its (one) call answered by a tool message with its id
                assert reply["role"] == "tool" and reply["tool_call_id"] == answer["tool_calls"][0]["id"]
    for c in calls:
        request = json.loads(c["request"])
        assert request["tools"] == offered and request["tool_choice"] == named["tool_choice"]
        for m in request["messages"]:  # the history sent back carries the calls and their ids
            assert m["role"] != "assistant" or m["tool_calls"]
