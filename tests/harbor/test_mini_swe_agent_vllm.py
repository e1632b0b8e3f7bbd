"""mini-swe-agent through Harbor against the real vLLM server: `engine: vllm` (the vLLM that
otbuild starts and stops with the shard), so the shard's capture proxy asks vLLM for token ids
and log-probs on every call the agent makes from inside its sandbox.

The model is the tiny random Qwen3 (tests/engines/test_vllm_live.py's, its context raised to
8192 for mini-swe-agent's first prompt), served as trained (float32, eager) with vLLM's hermes
tool parser on (mini-swe-agent sends `tools`). It never writes a valid `bash` tool call, so the
agent answers each turn with its format error (and drops the answer from its conversation) until
it gives up after three or Harbor's agent timeout ends the trial: a failure, by design; the
reward is not read. What is checked is the record:

- every assistant turn of the trace (content, tool calls) is the captured answer, byte for byte,
  and every answer the agent got is, as its own log kept it (`harness_agrees`);
- every call vLLM answered carries its prompt's token ids and as many completion token ids as
  log-probs, as many as its usage counts;
- vLLM's own rendering of the last call's request (its chat path offline: the messages parsed
  and the chat template applied with the request's tools, as its chat completions and /tokenize
  do; tests/support/vllm_chat_tokens.py) is that call's captured prompt: the train-serve
  contract on this path, without a second server start.

Needs .venv-vllm, .venv-harbor and .venv-agents/mini-swe-agent.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from otbuild.engines.vllm import vllm_executable
from otbuild.harbor.job import AGENTS_DIR, DEFAULT_HARBOR
from otbuild.sandbox import backend_problem
from otbuild.settings.engines import VLLMOptions
from tests.conftest import REPO, snakemake

HARBOR = Path(os.environ.get("OTBUILD_HARBOR") or DEFAULT_HARBOR)
MINI = Path(os.environ.get("OTBUILD_AGENTS") or AGENTS_DIR) / "mini-swe-agent"
VLLM = vllm_executable(VLLMOptions())
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(VLLM is None, reason="no vLLM here: make vllm-env (scripts/vllm-env.sh)"),
    pytest.mark.skipif(not HARBOR.is_file(), reason=f"Harbor is not installed at {HARBOR}: scripts/harbor-env.sh"),
    pytest.mark.skipif(
        not (MINI / "sandbox-bin" / "mini-swe-agent").is_file(),
        reason=f"mini-swe-agent is not installed at {MINI}: scripts/agents-env.sh",
    ),
    pytest.mark.skipif(bool(backend_problem("bwrap")), reason=f"no bwrap here: {backend_problem('bwrap')}"),
]
# served as trained, uncompiled; vLLM's tool parser for Qwen3's <tool_call> layout
SERVED = {"dtype": "float32", "enforce_eager": True, "enable_auto_tool_choice": True, "tool_call_parser": "hermes"}
MAX_TOKENS = 32  # each answer's bound (Harbor's MiniSweAgentOptions.max_tokens)
AGENT_TIMEOUT_SEC = 45  # the trial's bound: the agent loops on format errors until then (its start ~10 s)


ENDS_TURN = 8  # one token id in this many ends the model's answer (see `qwen3`)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> Path:
    """The tiny random Qwen3 with a context of 8192, its answers ending as a trained model's do,
    in a few tokens and not cut off at max_tokens: one token id in ENDS_TURN is an end-of-turn
    token in its generation_config.json (vLLM stops on each: the id is the answer's last token
    id and log-prob, its text is not in the content). A random model almost never samples
    <|im_end|>."""
    from tests.engines.test_vllm_live import tiny_qwen3

    model = tiny_qwen3(tmp_path_factory.mktemp("qwen3") / "model", context=8192)
    path = model / "generation_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    size = json.loads((model / "config.json").read_text())["vocab_size"]
    eos = config.get("eos_token_id")
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    path.write_text(json.dumps({**config, "eos_token_id": eos + list(range(3, size, ENDS_TURN))}))
    return model


def vllm_tokenize(model: Path, request: dict) -> list[int]:
    """vLLM's own prompt for a chat request (its messages and tools, a generation prompt after
    them), through its chat path offline in .venv-vllm."""
    from tests.contracts.test_vllm import run_in_vllm

    conv = {"messages": request["messages"], "tools": request.get("tools"), "add_generation_prompt": True}
    given = {"model": str(model), "conversations": [conv], "answers": []}
    (prompt,) = run_in_vllm("vllm_chat_tokens.py", given, model.parent / "vllm-prompt.json")["prompts"]
    assert "ids" in prompt, prompt
    return prompt["ids"]


def test_mini_swe_agent_on_vllm_trains_on_the_tokens_vllm_served(project, qwen3):
    """A real snakemake build of one task whose teacher is Harbor's mini-swe-agent on the vLLM
    otbuild starts; its trace and calls.parquet against each other and against vLLM."""
    (project / "recipes" / "mini.yaml").write_text(
        "sources:\n  synth: {kind: synthetic, count: 1, seed: 3}\n"
        f"teacher: {{engine: vllm, model: '{qwen3}', sandbox: harbor, agent_timeout_sec: {AGENT_TIMEOUT_SEC},\n"
        f"          engine_args: {json.dumps(SERVED)},\n"
        "          harbor: {agent: mini-swe-agent, environment: otbuild,\n"
        f"                   agent_kwargs: {{max_tokens: {MAX_TOKENS}}}}}}}\n"
    )
    # PYTHONPATH: Harbor imports this checkout's environment class
    ran, _ = snakemake(project, "mini", env={"PYTHONPATH": str(REPO)})
    assert ran["rollout"] == 1
    out = project / "results" / "mini" / "teacher"
    [row] = pq.read_table(out / "traces.parquet").to_pylist()
    calls = pq.read_table(out / "calls.parquet").to_pylist()
    meta = json.loads(row["metadata"])
    assert row["agent"] == "mini-swe-agent" and meta["trace_from"] == "capture", meta
    answered = [c for c in calls if c["status"] == 200 and c["delivered"]]
    assert len(answered) >= 2, [(c["status"], c["content"]) for c in calls]  # a first answer, a reply to it
    assert {c["scope"] for c in calls} == {row["trial_name"]} and {c["trial"] for c in calls} == {0}

    # every assistant turn is a captured answer, byte for byte (content and tool calls), in call
    # order, the last turn the last answer; mini-swe-agent sends back only the answers it acted on
    # (a random model's have no tool call: it drops them, so the trace has its last answer alone)
    def said(turn: dict) -> tuple:
        return turn["content"], [
            (t["id"], t["function"]["name"], t["function"]["arguments"]) for t in turn["tool_calls"] or []
        ]

    def captured(call: dict) -> tuple:
        return said({"content": call["content"] or "", "tool_calls": json.loads(call["tool_calls"] or "null")})

    turns = [said(m) for m in row["conversations"] if m["role"] == "assistant"]
    answers = [captured(c) for c in answered]
    assert turns and turns[-1] == answers[-1] and row["n_turns"] == len(turns)
    rest = iter(answers[:-1])
    assert all(any(turn == a for a in rest) for turn in turns[:-1]), (turns, answers)
    # every answer the agent got, as its own log kept it (the ones it refused too), is the capture's
    assert [c["harness_agrees"] for c in answered] == [True] * len(answered), [
        (c["content"], c["harness_agrees"]) for c in calls
    ]
    assert meta["harness_disagrees"] == 0
    last = json.loads(answered[-1]["request"])
    assert json.loads(row["tools"]) == last["tools"] and last["tools"][0]["function"]["name"] == "bash"

    # vLLM's own token ids and log-probs on every answered call, as many as its usage counts
    for c in answered:
        assert c["prompt_token_ids"] and len(c["prompt_token_ids"]) == c["prompt_tokens"], c["call_idx"]
        assert c["completion_token_ids"] and len(c["completion_token_ids"]) == len(c["logprobs"])
        assert len(c["completion_token_ids"]) == c["completion_tokens"] <= MAX_TOKENS
        assert all(lp <= 0.0 for lp in c["logprobs"])
    stats = json.loads((out / "provenance.json").read_text())["stats"]["capture"]
    assert stats["with_token_ids"] == len(answered) and stats["calls"] == len(calls)

    # the train-serve contract: vLLM's tokenization of what the model was sent is its prompt
    assert vllm_tokenize(qwen3, last) == answered[-1]["prompt_token_ids"]
