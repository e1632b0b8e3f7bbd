"""Tool-calling traces in otbuild's SFT: the offered tools, an assistant's tool calls and the tool
results rendered as Qwen3's chat template lays them out; the loss on the assistant's text and
its tool-call blocks, never on a tool result; old traces exactly as before; a real SFT step."""

from __future__ import annotations

import json

import numpy as np
import pytest

from otbuild.engines.tiny import corpus, train_tokenizer
from otbuild.settings.stages import SftSettings
from otbuild.traces.table import TRACE_SCHEMA, write_traces
from otbuild.train.chat import QWEN3_SPECIAL, TemplateMismatch, qwen3_template, render, tokenize_conversation
from otbuild.train.tokenized import TokenizedSet, build_tokenized_set
from otbuild.train.toy import TOY_TOOLS, write_toy_traces

BASH = TOY_TOOLS[0]


def _call(i: int, name: str, args: str) -> dict:
    return {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": args}}


# a system prompt; reasoning, text and two parallel calls; their two results; a call with no
# text; its result; a closing answer
CONVERSATION = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "List files."},
    {
        "role": "assistant",
        "content": "<think>\nlook first\n</think>\n\nI'll list.",
        "tool_calls": [_call(1, "bash", '{"command": "ls"}'), _call(2, "bash", '{"command": "pwd"}')],
    },
    {"role": "tool", "content": "a b", "tool_call_id": "c1"},
    {"role": "tool", "content": "/app", "tool_call_id": "c2"},
    {"role": "assistant", "content": "", "tool_calls": [_call(3, "task_complete", "{}")]},
    {"role": "tool", "content": "done", "tool_call_id": "c3"},
    {"role": "assistant", "content": "Done."},
]
TOOLS_BLOCK = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    + json.dumps(BASH, ensure_ascii=False)
    + "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n"
)
# Qwen3's own template (Qwen/Qwen3-8B tokenizer_config.json) on CONVERSATION, reasoning kept
QWEN3_TEXT = (
    "<|im_start|>system\nYou are an agent.\n\n" + TOOLS_BLOCK + "<|im_start|>user\nList files.<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nlook first\n</think>\n\nI'll list.\n"
    '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "bash", "arguments": {"command": "pwd"}}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\n<tool_response>\na b\n</tool_response>\n<tool_response>\n/app\n</tool_response><|im_end|>\n"
    '<|im_start|>assistant\n<tool_call>\n{"name": "task_complete", "arguments": {}}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\n<tool_response>\ndone\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\nDone.<|im_end|>\n"
)
# what the loss is on: each assistant turn's text and tool-call blocks, and its <|im_end|>
SUPERVISED = [
    (
        "<think>\nlook first\n</think>\n\nI'll list.\n"
        '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "bash", "arguments": {"command": "pwd"}}\n</tool_call><|im_end|>'
    ),
    '<tool_call>\n{"name": "task_complete", "arguments": {}}\n</tool_call><|im_end|>',
    "Done.<|im_end|>",
]


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(corpus(), vocab_size=400, special_tokens=QWEN3_SPECIAL, chat_template=qwen3_template())


def _runs(tok, ids: np.ndarray, mask: np.ndarray) -> list[str]:
    """The supervised tokens' text, one string per contiguous run."""
    edges = np.flatnonzero(np.diff(np.r_[0, mask.astype(int), 0]))
    return [tok.decode(ids[a:b].tolist()) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def test_a_tool_conversation_renders_as_qwen3_lays_it_out(tok):
    assert render(tok, CONVERSATION, tools=[BASH]) == QWEN3_TEXT
    # no system message: the tools block is the system turn
    assert render(tok, CONVERSATION[1:2], tools=[BASH]) == "<|im_start|>system\n" + TOOLS_BLOCK + (
        "<|im_start|>user\nList files.<|im_end|>\n"
    )


def test_only_the_assistants_text_and_tool_calls_carry_loss(tok):
    ids, mask = tokenize_conversation(tok, CONVERSATION, "qwen3_thinking", [BASH])
    assert tok.decode(ids.tolist()) == QWEN3_TEXT
    assert _runs(tok, ids, mask) == SUPERVISED
    supervised = tok.decode(ids[mask].tolist())
    assert "tool_response" not in supervised and "/app" not in supervised and "# Tools" not in supervised


def test_non_thinking_drops_the_reasoning_and_keeps_the_tool_calls(tok):
    ids, mask = tokenize_conversation(tok, CONVERSATION, "qwen3", [BASH])
    assert _runs(tok, ids, mask) == [SUPERVISED[0].split("</think>\n\n", 1)[1], *SUPERVISED[1:]]


def test_a_conversation_without_tools_renders_as_it_always_has(tok):
    conv = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {"role": "assistant", "content": "A", "tool_calls": None, "tool_call_id": None},  # the parquet's nulls
        {"role": "tool", "content": "T"},
    ]
    expected = (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nT\n</tool_response><|im_end|>\n"
    )
    assert render(tok, conv) == render(tok, conv, tools=[]) == expected


def test_arguments_are_rendered_as_vllm_renders_them(tok):
    """A call's arguments as the JSON object they hold, written with tojson: vLLM's chat path
    parses them and its template writes them so (tests/contracts/test_vllm.py), whatever layout
    the teacher wrote them in; arguments that are not a JSON object drop the conversation (vLLM
    would render {})."""
    conv = [CONVERSATION[1], {"role": "assistant", "content": "", "tool_calls": [_call(1, "bash", '{"command":"ls"}')]}]
    ids, mask = tokenize_conversation(tok, conv, "qwen3", [BASH])
    assert _runs(tok, ids, mask) == [
        '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>'
    ]
    for name, bad in (("bash", '{"command": "ls"'), ("bash", "[1]"), ("bash", ""), (None, "{}")):
        conv[1]["tool_calls"] = [_call(1, name, bad)]
        with pytest.raises(TemplateMismatch, match="no name or its arguments are not a JSON object"):
            tokenize_conversation(tok, conv, "qwen3", [BASH])


def test_tokenized_set_reads_the_tools_column(tmp_path, tok):
    traces = write_toy_traces(tmp_path / "kept.parquet", 4, tools=True)
    stats = build_tokenized_set(traces, tok, "qwen3_thinking", 4096, tmp_path / "tok", workers=1)
    assert stats["sequences"] == 4 and not any(stats["dropped"].values())
    seqs = TokenizedSet(tmp_path / "tok")
    for i in range(len(seqs)):
        ids, mask = seqs.seq(i)
        text, supervised = tok.decode(ids.tolist()), _runs(tok, ids, mask)
        assert text.startswith("<|im_start|>system\n# Tools\n") and '"name": "bash"' in text
        assert all(r.endswith("<|im_end|>") and "<tool_response>" not in r for r in supervised)
        assert sum("<tool_call>" in r for r in supervised) == len(supervised) - 1  # the closing answer has none


def test_a_broken_tools_column_fails_naming_the_row(tmp_path, tok):
    row = dict.fromkeys(TRACE_SCHEMA.names)
    row.update(conversations=CONVERSATION, task="t", trial_name="t-0", sample_idx=0, tools='{"not": "a list"}')
    write_traces(tmp_path / "kept.parquet", [row])
    with pytest.raises(ValueError, match=r"trace row 0: its `tools` column"):
        build_tokenized_set(tmp_path / "kept.parquet", tok, "qwen3_thinking", 4096, tmp_path / "tok", workers=1)


def test_sft_trains_on_tool_calling_traces(tmp_path):
    """otbuild's trainer on the tiny student, a tool-calling trace set: the loss falls."""
    from otbuild.train.sft import train

    traces = write_toy_traces(tmp_path / "kept.parquet", 8, tools=True)
    settings = SftSettings(
        model={"kind": "tiny", "vocab_size": 500, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1},
        learning_rate=3e-3,
        global_batch_size=4,
        per_device_batch_size=2,
        epochs=3,
        cutoff_len=1024,
        zero_stage=0,
        gradient_checkpointing=False,
        save_steps=1000,
    )
    stats = train(settings, [traces], tmp_path / "ck")
    log = [json.loads(x) for x in (tmp_path / "ck" / "train_log.jsonl").read_text().splitlines()]
    assert len(log) == 6 and stats["tokens_seen"] == sum(r["tokens"] for r in log)
    assert log[-1]["loss"] < log[0]["loss"]


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from otbuild.engines.tiny import make_tiny_model
    from otbuild.train.rl.policy import Policy

    path = make_tiny_model(
        tmp_path_factory.mktemp("tiny") / "m",
        arch="qwen3",
        chat_template=qwen3_template(),
        special_tokens=QWEN3_SPECIAL,
    )
    model, tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    return Policy(model, tok, temperature=1.0, max_tokens=8, max_context=4096)


def test_the_rl_policy_is_prompted_as_sft_trains(policy):
    """Before each assistant turn of a tool conversation, the policy's prompt (with the offered
    tools) is the SFT sequence's tokens up to that turn's supervised tokens."""
    ids, mask = tokenize_conversation(policy.tok, CONVERSATION, "qwen3_thinking", [BASH])
    starts = np.flatnonzero(np.diff(np.r_[0, mask.astype(int)]) == 1)
    turns = [i for i, m in enumerate(CONVERSATION) if m["role"] == "assistant"]
    assert len(starts) == len(turns) == 3
    for k, at in zip(turns, starts, strict=True):
        assert policy.prompt_ids(CONVERSATION[:k], [BASH]) == ids[:at].tolist(), k


def test_the_rl_policy_reads_its_tool_calls_as_vllm(policy):
    import asyncio

    from otbuild.train.rl.policy import PolicyEngine

    tok = policy.tok
    said = 'Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"command":"ls"}}\n</tool_call>'
    ids = tok(said, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    text, calls = policy.answer(ids, [BASH])
    assert text == "Let me look.\n" and [c["function"] for c in calls] == [
        {"name": "bash", "arguments": '{"command": "ls"}'}
    ]
    assert policy.answer(ids, None) == ('Let me look.\n\n{"name": "bash", "arguments": {"command":"ls"}}\n', None)
    engine = PolicyEngine(policy)
    c = asyncio.run(engine.complete(CONVERSATION[:2], seed=1, tools=[BASH]))
    assert engine.turns[0].prompt_ids == policy.prompt_ids(CONVERSATION[:2], [BASH])
    assert c.finish_reason in ("stop", "length", "tool_calls") and (c.tool_calls is None) == (
        c.finish_reason != "tool_calls"
    )
