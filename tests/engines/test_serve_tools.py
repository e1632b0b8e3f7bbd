"""`otbuild serve` with tools, as vLLM takes them: the request's tools rendered by the chat
template, the answer's `<tool_call>` blocks read into `tool_calls` as vLLM's hermes parser reads
them (with --enable-auto-tool-choice --tool-call-parser hermes), and what vLLM refuses refused.
Real HTTP against a tiny student with otbuild's qwen3 template; a regular expression
(structured_outputs) makes its random weights write a tool call."""

from __future__ import annotations

import json
import re
import threading

import httpx
import pytest

from otbuild.train.chat import QWEN3_SPECIAL, qwen3_template
from otbuild.train.toy import TOY_TOOLS

ASK = [{"role": "user", "content": "List the files."}]
CALL = 'Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"command":"ls"}}\n</tool_call>'


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """(tokenizer, base URL with auto tool choice, base URL without, model dir), one model shared."""
    from otbuild.engines.tiny import make_tiny_model
    from otbuild.serve import ChatModel, ChatServer

    model_dir = make_tiny_model(
        tmp_path_factory.mktemp("tiny") / "m",
        arch="qwen3",
        chat_template=qwen3_template(),
        special_tokens=QWEN3_SPECIAL,
        max_position_embeddings=2048,
    )
    model = ChatModel(model_dir, "cpu")
    started = [ChatServer(("127.0.0.1", 0), model, "m", "hermes"), ChatServer(("127.0.0.1", 0), model, "m")]
    for s in started:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    yield model.tokenizer, *(f"{s.url}/v1" for s in started), model_dir
    for s in started:
        s.shutdown()
        s.server_close()


def _post(base: str, **body) -> httpx.Response:
    body = {"model": "m", "messages": ASK, "max_tokens": 60, "temperature": 0, **body}
    return httpx.post(f"{base}/chat/completions", json=body, trust_env=False, timeout=120)


def test_an_answers_tool_calls_come_back_as_vllms_hermes_parser_gives_them(servers):
    tok, auto, *_ = servers
    r = _post(auto, tools=TOY_TOOLS, structured_outputs={"regex": re.escape(CALL)}, max_tokens=300)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] == "Let me look.\n"  # the text before the first block, as vLLM's
    (call,) = message["tool_calls"]
    assert re.fullmatch(r"chatcmpl-tool-[0-9a-f]{32}", call["id"]) and call["type"] == "function"
    assert call["function"] == {"name": "bash", "arguments": '{"command": "ls"}'}  # json.dumps, as hermes
    prompt = tok.apply_chat_template(ASK, tools=TOY_TOOLS, tokenize=False, add_generation_prompt=True)
    assert "# Tools" in prompt and r.json()["usage"]["prompt_tokens"] == len(
        tok(prompt, add_special_tokens=False)["input_ids"]
    )


def test_a_history_with_tool_calls_renders_as_otbuilds_sft(servers):
    """An earlier call's arguments (any JSON layout) and its result: the prompt is the tokens
    otbuild's SFT trains on, up to the answer (the generation prompt)."""
    from otbuild.train.chat import tokenize_conversation

    tok, auto, *_ = servers
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command":"ls"}'}}
            ],
        },
        {"role": "tool", "content": "a.txt", "tool_call_id": "c1"},
    ]
    r = _post(auto, messages=history, tools=TOY_TOOLS, max_tokens=1)
    assert r.status_code == 200, r.text
    ids, _ = tokenize_conversation(tok, [*history, {"role": "assistant", "content": "x"}], "qwen3", TOY_TOOLS)
    answer_at = len(ids) - len(tok("x<|im_end|>\n", add_special_tokens=False)["input_ids"])
    assert r.json()["usage"]["prompt_tokens"] == answer_at


def test_plain_text_with_tools_offered_has_no_tool_calls(servers):
    _, auto, *_ = servers
    r = _post(auto, tools=TOY_TOOLS, structured_outputs={"regex": "All done\\."})
    message = r.json()["choices"][0]["message"]
    assert (message["content"], message["tool_calls"]) == ("All done.", [])
    assert r.json()["choices"][0]["finish_reason"] == "stop"


def test_what_vllm_refuses_is_refused(servers):
    _, auto, plain, _ = servers
    refusals = [
        (plain, {"tools": TOY_TOOLS}, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser'),
        (plain, {"tools": TOY_TOOLS, "tool_choice": "auto"}, '"auto" tool choice requires'),
        (auto, {"tools": []}, "`tools` must not be an empty array"),
        (auto, {"tool_choice": "auto"}, "When using `tool_choice`, `tools` must be set."),
        (auto, {"tools": TOY_TOOLS, "tool_choice": "sometimes"}, "Invalid value for `tool_choice`: sometimes!"),
        (auto, {"tools": TOY_TOOLS, "tool_choice": "required"}, "not supported by otbuild serve"),
    ]
    for base, body, message in refusals:
        r = _post(base, max_tokens=1, **body)
        assert r.status_code == 400 and message in r.json()["error"]["message"], (body, r.text)
    # tool_choice none: the tools are rendered, no calls read (as vLLM)
    r = _post(plain, tools=TOY_TOOLS, tool_choice="none", structured_outputs={"regex": re.escape(CALL)}, max_tokens=300)
    assert r.status_code == 200 and "tool_calls" not in r.json()["choices"][0]["message"]
    assert r.json()["choices"][0]["finish_reason"] == "stop"


def test_auto_tool_choice_needs_a_parser_as_vllms_flag(tmp_path, capsys):
    from otbuild.serve import main

    (tmp_path / "config.json").write_text(json.dumps({}))
    assert main([str(tmp_path), "--enable-auto-tool-choice"]) == 2
    assert "--enable-auto-tool-choice requires --tool-call-parser" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--enable-auto-tool-choice", "--tool-call-parser", "kimi_k2"])  # not one it reads


def test_the_transformers_engine_starts_its_server_with_the_tool_flags(servers):
    """engine_args `enable_auto_tool_choice` and `tool_call_parser` (vLLM's names, carried when
    `auto` falls back to otbuild serve) start `otbuild serve` reading tool calls."""
    from pydantic import ValidationError

    from otbuild.engines.local import start_local_server
    from otbuild.settings.engines import TransformersOptions, server_fallback

    with pytest.raises(ValidationError, match="needs tool_call_parser"):
        TransformersOptions(enable_auto_tool_choice=True)
    vllm_args = {"enable_auto_tool_choice": True, "tool_call_parser": "hermes", "tensor_parallel_size": 2, "port": 0}
    options = TransformersOptions(**server_fallback(vllm_args))
    assert (options.enable_auto_tool_choice, options.tool_call_parser) == (True, "hermes")
    *_, model_dir = servers
    base, stop = start_local_server(model_dir, device="cpu", tool_call_parser=options.tool_call_parser)
    try:
        r = _post(
            base, model=str(model_dir), tools=TOY_TOOLS, structured_outputs={"regex": re.escape(CALL)}, max_tokens=300
        )
    finally:
        stop()
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "bash"
