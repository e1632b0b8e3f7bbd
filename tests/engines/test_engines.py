"""LLM engines: the openai client (retries, backoff, concurrency, keys) against local HTTP
servers, `otbuild serve` with a tiny model built here, and the vllm lifecycle with a fake
`vllm` executable. Network only on 127.0.0.1."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Literal

import pytest
from pydantic import ValidationError

from otbuild.engines import (
    ENGINES,
    LLM,
    ContextLengthExceededError,
    EngineError,
    make_engine,
    register,
)
from otbuild.engines.model_config import check_fits_model
from otbuild.engines.process import free_port
from otbuild.engines.vllm import vllm_command
from otbuild.errors import ConfigError
from otbuild.serve import READY
from otbuild.settings.engines import CONCURRENCY, ServerOptions, TransformersOptions, VLLMOptions
from otbuild.settings.recipe import AgentModel
from otbuild.settings.stages import RolloutSettings
from tests.conftest import REPO

psutil = pytest.importorskip("psutil")

MSG = [{"role": "user", "content": "list the files in /tmp"}]
OK = {
    "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ls /tmp"}}],
    "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
}


def openai(base_url, **kw):
    return make_engine(LLM(**{"engine": "openai", "base_url": base_url, "model": "m", "backoff_sec": 0.05, **kw}))


async def complete_with(engine, n=1, **kw):
    async with engine:
        return await asyncio.gather(*[engine.complete(MSG, **kw) for _ in range(n)])


# --- settings and registry ---------------------------------------------------------------


class Echo(LLM):
    """A new engine's section: the LLM's settings under its own engine name."""

    engine: Literal["echo"]


def test_registry_and_settings_errors(monkeypatch):
    with pytest.raises(ValidationError, match="temprature"):
        LLM(engine="openai", base_url="http://x/v1", model="m", temprature=1)
    with pytest.raises(ValidationError, match="engine 'openai' needs `base_url`"):
        LLM(engine="openai", model="m")
    with pytest.raises(ValidationError, match="tensor_parallel_sze"):
        LLM(engine="vllm", model="m", engine_args={"tensor_parallel_sze": 2})
    with pytest.raises(ValidationError, match="engine 'openai' starts no server"):
        LLM(engine="openai", base_url="http://x/v1", model="m", engine_args={"port": 1})
    with pytest.raises(ConfigError, match="OTB_NO_SUCH_KEY"):
        make_engine(LLM(engine="openai", base_url="http://x/v1", model="m", api_key_env="OTB_NO_SUCH_KEY"))
    # a stage's typed settings: the engine reads their LLM fields, the stage's own are not its
    rollout = RolloutSettings(
        engine="vllm",
        model="m",
        engine_args={"tensor_parallel_size": 2},
        max_episodes=50,
        shards=4,
        request_timeout_sec=60,
    )
    assert make_engine(rollout).options.tensor_parallel_size == 2
    with pytest.raises(ValidationError, match="tensor_parallel_size"):
        RolloutSettings(engine="vllm", model="m", engine_args={"tensor_parallel_size": "two"})
    assert make_engine(RolloutSettings(engine="oracle", shards=2)).name == "oracle"
    assert make_engine(AgentModel(engine="oracle")).name == "oracle"
    with pytest.raises(ConfigError, match="unknown engine 'echo'"):
        make_engine(Echo(engine="echo", model="m"))
    monkeypatch.setitem(ENGINES, "echo", None)
    register("echo", lambda s: ("echo", s.model))
    assert make_engine(Echo(engine="echo", model="m")) == ("echo", "m")
    e = make_engine(LLM(engine="vllm", model="org/M"))
    assert (e.name, e.model, e.provider) == ("vllm", "org/M", "hosted_vllm")
    teacher = AgentModel(engine="vllm", model="org/M", max_episodes=3, engine_args={"served_model_name": "t"})
    assert (make_engine(teacher).model, make_engine(teacher).settings.max_tokens) == ("t", 4096)


# Sections that extend the LLM section and declare one of its keys again, and why.
REDECLARED = {
    "AgentModel": {"engine", "model"},  # also the oracle, which needs no model
    "Augment": {"seed"},  # the augment's own seed (0: its pairings), also its requests'
    "EvalSettings": {"engine"},
}  # also `auto`: serve_with's, for the recipe's checkpoint


def _subclasses(cls: type) -> list[type]:
    """otbuild's subclasses of `cls` (not a test's)."""
    subs = [c for sub in cls.__subclasses__() for c in (sub, *_subclasses(sub))]
    return [c for c in subs if c.__module__.startswith("otbuild.")]


def test_each_engine_setting_is_declared_once():
    """One place per setting: a launch option is not also a client key, no model declares again
    a key of what it extends (but the sections above, knowingly), docs/engines.md names every
    key, and each engine's default concurrency is the one it states."""
    import otbuild.stages  # noqa: F401 (the LLM sections and settings of the recipe and its stages)

    for options in (VLLMOptions, TransformersOptions):
        assert not set(options.model_fields) & set(LLM.model_fields), options
    for model in (ServerOptions, TransformersOptions, VLLMOptions, LLM, *_subclasses(LLM)):
        inherited = {key for base in model.__mro__[1:] for key in getattr(base, "model_fields", {})}
        again = set(inspect.get_annotations(model)) & inherited
        assert again == REDECLARED.get(model.__name__, set()), (model, again)
    docs = (REPO / "docs" / "engines.md").read_text()
    settings = docs.split("## Settings")[1].split("\n## ")[0]
    for model in (LLM, VLLMOptions, TransformersOptions):
        assert not [key for key in model.model_fields if f"`{key}`" not in settings], model  # each documented
    stated = re.search(r"^\| `concurrency` \| ([^|]+) \|", docs, re.MULTILINE).group(1)
    assert {engine: int(n) for engine, n in re.findall(r"(\w+) (\d+)", stated)} == CONCURRENCY
    assert set(CONCURRENCY) == set(ENGINES) | {"auto"}  # auto: no engine of its own, resolved when it starts


# --- the openai engine against scripted servers -----------------------------------------


def test_completion_body_and_bearer_key(scripted, monkeypatch):
    srv = scripted([(200, OK)])
    monkeypatch.setenv("OTB_TEST_KEY", "sk-secret")
    engine = openai(srv.base_url, api_key_env="OTB_TEST_KEY", temperature=0.0, max_tokens=64, extra_body={"top_k": 5})
    [c] = asyncio.run(complete_with(engine, seed=3))
    assert (c.text, c.n_input_tokens, c.n_output_tokens, c.finish_reason) == ("ls /tmp", 7, 3, "stop")
    assert c.usage_reported
    [req] = srv.requests
    assert req["path"] == "/v1/chat/completions"
    assert req["headers"]["Authorization"] == "Bearer sk-secret"
    assert req["body"] == {"model": "m", "messages": MSG, "temperature": 0.0, "max_tokens": 64, "top_k": 5, "seed": 3}
    assert (engine.name, engine.provider) == ("openai", "openai")


def test_retries_429_and_503_then_success(scripted):
    srv = scripted([(429, {"error": "slow down"}), (503, {"error": "busy"}), (200, OK)])
    engine = openai(srv.base_url, max_retries=3)
    [c] = asyncio.run(complete_with(engine))
    assert c.text == "ls /tmp" and len(srv.requests) == 3
    assert engine.stats["retries"] == 2


def test_400_is_not_retried(scripted):
    srv = scripted([(400, {"error": {"message": "context length exceeded"}})])
    with pytest.raises(EngineError, match="rejected the request.*HTTP 400.*context length") as e:
        asyncio.run(complete_with(openai(srv.base_url, max_retries=5)))
    assert e.value.status == 400 and len(srv.requests) == 1


def test_context_overflow_is_told_apart(scripted):
    """How vLLM (old and new), OpenAI and SGLang say a request is over the context window."""
    overflows = [
        "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens "
        "(4000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.",
        "'max_tokens' or 'max_completion_tokens' is too large: 1000. This model's maximum context length is "
        "4096 tokens and your request has 3500 input tokens (1000 > 4096 - 3500).",
        "The decoder prompt (length 5000) is longer than the maximum model length of 4096.",
        "The input (5000 tokens) is longer than the model's context length (4096 tokens).",
    ]
    for message in overflows:
        srv = scripted([(400, {"object": "error", "message": message, "type": "BadRequestError", "code": 400})])
        with pytest.raises(ContextLengthExceededError, match="HTTP 400") as e:
            asyncio.run(complete_with(openai(srv.base_url)))
        assert e.value.status == 400 and len(srv.requests) == 1
    srv = scripted([(400, {"error": {"message": "temperature must be >= 0"}})])
    with pytest.raises(EngineError) as e:
        asyncio.run(complete_with(openai(srv.base_url)))
    assert type(e.value) is EngineError


def test_5xx_gives_up_after_max_retries(scripted):
    srv = scripted([(500, {"error": "boom"})])
    with pytest.raises(EngineError, match="after 3 attempt.*HTTP 500") as e:
        asyncio.run(complete_with(openai(srv.base_url, max_retries=2)))
    assert e.value.status == 500 and len(srv.requests) == 3


def test_connection_refused_retries_with_backoff():
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    engine = openai(url, max_retries=3, backoff_sec=0.1)
    t = time.monotonic()
    with pytest.raises(EngineError, match="after 4 attempt.*ConnectError") as e:
        asyncio.run(complete_with(engine))
    # equal jitter: each wait is at least half of 0.1, 0.2, 0.4
    assert time.monotonic() - t >= 0.35
    assert e.value.status is None and engine.stats["requests"] == 4


def test_timeout_is_retried(scripted):
    srv = scripted([(200, OK)], delay=0.5)
    with pytest.raises(EngineError, match="after 2 attempt.*Timeout"):
        asyncio.run(complete_with(openai(srv.base_url, max_retries=1, request_timeout_sec=0.1)))
    assert len(srv.requests) == 2


def test_missing_usage_is_flagged(scripted):
    srv = scripted([(200, {"choices": OK["choices"]})])
    engine = openai(srv.base_url)
    [c] = asyncio.run(complete_with(engine))
    assert (c.n_input_tokens, c.n_output_tokens, c.usage_reported) == (0, 0, False)
    assert engine.stats["usage_missing"] == 1


def test_concurrency_bound(scripted):
    srv = scripted([(200, OK)], delay=0.15)
    results = asyncio.run(complete_with(openai(srv.base_url, concurrency=3), n=10))
    assert len(results) == 10 and srv.max_in_flight == 3


def test_recipe_without_concurrency_gets_the_engines_default(tmp_path):
    """A recipe's unset `concurrency` means the engine's own default (vLLM batches 64 requests),
    for the engine's client and for the trials the rollout runs at once; set, it wins. It is
    execution-only: spelling it out keeps the stage's id."""
    from otbuild.plan import plan_recipe
    from otbuild.recipe.load import load_recipe
    from otbuild.settings.engines import CONCURRENCY, concurrency

    (tmp_path / "recipes").mkdir()

    def teacher(section: str):
        (tmp_path / "recipes" / "r.yaml").write_text(
            "sources:\n  a: {kind: synthetic, rank: 1, count: 4}\n" + f"teacher: {section}\n"
        )
        return next(n for n in plan_recipe(load_recipe("r", tmp_path)).nodes if n.stage == "rollout")

    vllm = teacher("{engine: vllm, model: Qwen/Qwen3-8B}")
    engine = make_engine(vllm.config)
    assert concurrency(engine.client_settings) == concurrency(vllm.config) == 64  # the client's, the trials'
    pinned = teacher("{engine: vllm, model: Qwen/Qwen3-8B, concurrency: 16}")
    assert concurrency(make_engine(pinned.config).client_settings) == concurrency(pinned.config) == 16
    assert pinned.id == vllm.id
    assert concurrency(teacher("{engine: transformers, model: some/dir}").config) == 2
    assert concurrency(teacher("{engine: openai, base_url: http://h/v1, model: m}").config) == 8
    assert concurrency(teacher("{engine: oracle}").config) == CONCURRENCY["oracle"] == 4
    typed = load_recipe("r", tmp_path).recipe.teacher  # the recipe's section reads the same
    assert concurrency(typed) == 4


# --- vllm command -------------------------------------------------------------------------


def test_vllm_command_glm47_awq(monkeypatch):
    monkeypatch.setattr("otbuild.engines.vllm.vllm_executable", lambda s: s.vllm_executable or "vllm")
    settings = LLM(
        engine="vllm",
        model="QuantTrio/GLM-4.7-AWQ",
        engine_args={
            "tensor_parallel_size": 4,
            "quantization": "awq",
            "max_model_len": 32768,
            "gpu_memory_utilization": 0.92,
            "enable_auto_tool_choice": True,
            "tool_call_parser": "glm47",
            "reasoning_parser": "glm45",
            "served_model_name": "glm-4.7",
            "extra_args": ["--enable-prefix-caching"],
        },
    )
    assert vllm_command(settings, 8123) == [
        "vllm",
        "serve",
        "QuantTrio/GLM-4.7-AWQ",
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--tensor-parallel-size",
        "4",
        "--data-parallel-size",
        "1",
        "--served-model-name",
        "glm-4.7",
        "--max-model-len",
        "32768",
        "--quantization",
        "awq",
        "--gpu-memory-utilization",
        "0.92",
        "--tool-call-parser",
        "glm47",
        "--reasoning-parser",
        "glm45",
        "--enable-auto-tool-choice",
        "--enable-prefix-caching",
    ]
    minimal = vllm_command(LLM(engine="vllm", model="m", engine_args={"data_parallel_size": 2}), 9)
    assert minimal == [
        "vllm",
        "serve",
        "m",
        "--host",
        "127.0.0.1",
        "--port",
        "9",
        "--tensor-parallel-size",
        "1",
        "--data-parallel-size",
        "2",
    ]
    as_float32 = vllm_command(LLM(engine="vllm", model="m", engine_args={"dtype": "float32"}), 9)
    assert as_float32[-2:] == ["--dtype", "float32"]


def test_the_vllm_to_run_is_the_one_named_else_on_path_else_the_projects(tmp_path, monkeypatch):
    """`engine: vllm` runs after `make setup` without naming an executable: `vllm` on PATH, else
    the project's .venv-vllm (the job's working directory), else otbuild's checkout's."""
    from otbuild.engines import resolve_auto
    from otbuild.engines import vllm as engine
    from otbuild.settings.engines import VLLMOptions

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setattr(engine, "CHECKOUT_VLLM", tmp_path / "checkout" / "vllm")
    opts = VLLMOptions()
    assert engine.vllm_executable(opts) is None
    auto = LLM(engine="auto", model="ckpt", engine_args={"dtype": "float32", "log_path": "s.log"})
    fallback = resolve_auto(auto)  # no vLLM here: otbuild serve, with the options every server takes
    assert (fallback.engine, fallback.engine_args) == ("transformers", {"log_path": "s.log"})
    with pytest.raises(EngineError, match="make vllm-env"):
        asyncio.run(make_engine(LLM(engine="vllm", model="m")).start())
    for exe in (tmp_path / "checkout" / "vllm", tmp_path / ".venv-vllm" / "bin" / "vllm", tmp_path / "bin" / "vllm"):
        exe.parent.mkdir(parents=True)
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
        assert engine.vllm_executable(opts) == str(exe)  # each one found before the last
    assert engine.vllm_executable(VLLMOptions(vllm_executable="/opt/v/vllm")) == "/opt/v/vllm"
    assert resolve_auto(auto) == auto.model_copy(update={"engine": "vllm"})


def test_vllm_settings_fit_the_model(tmp_path):
    """What vLLM would refuse after loading weights is a ConfigError up front."""

    def settings(model, **kw):
        llm = LLM(engine="vllm", model=model, engine_args=kw)
        check_fits_model(llm)
        return llm.launch

    assert settings("QuantTrio/GLM-4.7-AWQ", quantization="awq").quantization == "awq"
    with pytest.raises(ConfigError, match="'awq' does not fit 'zai-org/GLM-4.6-FP8'"):  # before any server starts
        make_engine(LLM(engine="vllm", model="zai-org/GLM-4.6-FP8", engine_args={"quantization": "awq"}))
    with pytest.raises(ConfigError, match="'awq' does not fit 'zai-org/GLM-4.6-FP8': by its name it is saved as FP8"):
        settings("zai-org/GLM-4.6-FP8", quantization="awq")
    with pytest.raises(
        ConfigError, match="'awq' needs a checkpoint saved as AWQ; by its name, 'moonshotai/Kimi-K2.5' is not"
    ):
        settings("moonshotai/Kimi-K2.5", quantization="awq")
    assert settings("Qwen/Qwen3-8B", quantization="fp8").quantization == "fp8"  # quantized on load
    qwen3 = tmp_path / "qwen3-ckpt"  # a checkpoint dir: its config.json is the evidence
    qwen3.mkdir()
    (qwen3 / "config.json").write_text(json.dumps({"model_type": "qwen3", "max_position_embeddings": 40960}))
    with pytest.raises(
        ConfigError,
        match=r"max_model_len 65536 exceeds .*max_position_embeddings 40960 "
        r"\(by its config.json\): .*rope_scaling",
    ):
        settings(str(qwen3), max_model_len=65536)
    with pytest.raises(ConfigError, match="needs a checkpoint saved as AWQ; by its config.json, .* is not"):
        settings(str(qwen3), quantization="awq")
    yarn = {"rope_scaling": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32768}}
    settings(str(qwen3), max_model_len=65536, hf_overrides=yarn)
    cmd = vllm_command(
        LLM(engine="vllm", model=str(qwen3), engine_args={"max_model_len": 65536, "hf_overrides": yarn}), 9
    )
    assert cmd[cmd.index("--max-model-len") + 1] == "65536"
    assert json.loads(cmd[cmd.index("--hf-overrides") + 1]) == yarn


def test_context_checked_by_model_family_without_config(tmp_path, monkeypatch):
    """On a machine without the model cached (a laptop validating for a GPU node), the
    context of the families the docs and recipes name comes from their model cards."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))

    def settings(model, **kw):
        llm = LLM(engine="vllm", model=model, engine_args=kw)
        check_fits_model(llm)
        return llm.launch

    for model in ("Qwen/Qwen3-8B", "/models/Qwen3-32B"):
        with pytest.raises(
            ConfigError,
            match=r"65536 exceeds .*max_position_embeddings 40960 \(by its "
            r"family's model card \(no config.json on this machine\)\)",
        ):
            settings(model, max_model_len=65536)
        assert settings(model, max_model_len=40960).max_model_len == 40960
    yarn = {"rope_scaling": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32768}}
    assert settings("Qwen/Qwen3-8B", max_model_len=65536, hf_overrides=yarn).max_model_len == 65536
    assert settings("Qwen/Qwen3-30B-A3B-Instruct-2507", max_model_len=262144).max_model_len == 262144
    assert settings("QuantTrio/GLM-4.7-AWQ", max_model_len=202752).max_model_len == 202752
    with pytest.raises(ConfigError, match="262144 exceeds .*GLM-4.7-AWQ.*202752"):
        settings("QuantTrio/GLM-4.7-AWQ", max_model_len=262144)
    with pytest.raises(ConfigError, match="200000 exceeds .*Kimi-K2-Instruct'.*131072"):
        settings("moonshotai/Kimi-K2-Instruct", max_model_len=200000)
    assert settings("moonshotai/Kimi-K2.5", max_model_len=200000).max_model_len == 200000
    assert settings("some-org/unknown-model", max_model_len=10**6).max_model_len == 10**6  # no evidence: vLLM decides


# --- serving the tiny model ---------------------------------------------------------------


def server_processes(marker: Path) -> list:
    """Live processes whose command line names `marker` (a unique tmp path)."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if p.info["status"] != psutil.STATUS_ZOMBIE and str(marker) in " ".join(p.info["cmdline"] or []):
            found.append(p)
    return found


def test_openai_engine_against_otbuild_serve(local_server, tiny_model, scripted):
    import httpx

    root = local_server.removesuffix("/v1")
    assert httpx.get(f"{root}/health", trust_env=False).json() == {"status": "ok"}
    models = httpx.get(f"{local_server}/models", trust_env=False).json()
    assert models["data"][0]["id"] == str(tiny_model)
    engine = make_engine(
        LLM(
            engine="openai", base_url=local_server, model=str(tiny_model), max_tokens=12, temperature=0.0, concurrency=2
        )
    )
    results = asyncio.run(complete_with(engine, n=4))
    for c in results:
        assert c.text and c.n_input_tokens > 5 and 0 < c.n_output_tokens <= 12
        assert c.finish_reason in ("stop", "length")
    assert len({c.text for c in results}) == 1  # greedy: the same answer every time
    sampled = asyncio.run(complete_with(engine, temperature=1.0, seed=7, n=2))
    assert sampled[0].text == sampled[1].text  # same seed, same sample
    # vLLM's token ids and log-probs, where asked for: the prompt as the server tokenized it,
    # the answer's ids and each one's sampled log-prob
    from transformers import AutoTokenizer

    [ids] = asyncio.run(complete_with(engine, temperature=1.0, seed=7, logprobs=True, return_token_ids=True))
    tok = AutoTokenizer.from_pretrained(tiny_model)
    text = tok.apply_chat_template(MSG, add_generation_prompt=True, tokenize=False)
    assert ids.text == sampled[0].text and ids.prompt_token_ids == tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids.token_ids) == len(ids.logprobs) == ids.n_output_tokens
    assert len(ids.prompt_token_ids) == ids.n_input_tokens
    assert tok.decode(ids.token_ids, skip_special_tokens=True) == ids.text and all(lp <= 0 for lp in ids.logprobs)
    assert results[0].token_ids is None and results[0].prompt_token_ids is None  # not asked: not given
    with pytest.raises(EngineError, match="HTTP 404.*does not exist") as e:
        asyncio.run(complete_with(make_engine(LLM(engine="openai", base_url=local_server, model="other"))))
    assert e.value.status == 404
    with pytest.raises(ContextLengthExceededError, match="HTTP 400.*maximum context length is 1600 tokens"):
        asyncio.run(complete_with(engine, max_tokens=5000))


def test_structured_regex_keeps_a_random_model_inside_the_answer_frame(local_server, tiny_model):
    """`structured_outputs: {regex}` (extra_body, as for vLLM): even random weights answer
    inside the language; other structured outputs are refused, not ignored."""
    import regex

    from otbuild.harness.protocol import ANSWER_REGEX

    def ask(pattern, **kw):
        engine = make_engine(
            LLM(
                engine="openai",
                base_url=local_server,
                model=str(tiny_model),
                temperature=1.0,
                seed=3,
                extra_body={"structured_outputs": {"regex": pattern}},
                **kw,
            )
        )
        return asyncio.run(complete_with(engine, n=3))

    assert {c.text for c in ask("(yes|no)", max_tokens=10)} <= {"yes", "no"}
    for c in ask(ANSWER_REGEX, max_tokens=30):
        assert regex.fullmatch(ANSWER_REGEX, c.text, partial=True), c.text
    assert not any(regex.fullmatch(ANSWER_REGEX, c.text, partial=True) for c in ask(None, max_tokens=30))
    with pytest.raises(EngineError, match="HTTP 400.*not a valid regular expression"):
        ask("(unclosed", max_tokens=5)
    engine = make_engine(
        LLM(
            engine="openai",
            base_url=local_server,
            model=str(tiny_model),
            extra_body={"structured_outputs": {"json": {"type": "object"}}},
        )
    )
    with pytest.raises(EngineError, match="HTTP 400.*only"):
        asyncio.run(complete_with(engine, max_tokens=5))


def test_transformers_engine_starts_and_stops_its_server(tiny_model):
    async def run():
        engine = make_engine(
            LLM(engine="transformers", model=str(tiny_model), max_tokens=8, engine_args={"device": "cpu"})
        )
        async with engine:
            c = await engine.complete(MSG)
            alive = server_processes(tiny_model)
        return engine, c, alive

    before = {p.pid for p in server_processes(tiny_model)}  # the session's shared server
    engine, c, alive = asyncio.run(run())
    assert (engine.name, engine.provider) == ("transformers", "transformers")
    assert c.n_output_tokens > 0 and {p.pid for p in alive} - before
    assert {p.pid for p in server_processes(tiny_model)} == before


# --- the vllm lifecycle with a fake `vllm` on PATH ----------------------------------------


@pytest.fixture
def fake_vllm(fake_vllm_bin, tmp_path, tiny_model):
    """A `vllm` on PATH that serves the tiny model with `otbuild serve`; returns its settings."""
    return LLM(
        engine="vllm",
        model=str(tiny_model),
        max_tokens=8,
        engine_args={
            "served_model_name": "tiny",
            "tensor_parallel_size": 4,
            "max_model_len": 1024,
            "log_path": str(tmp_path / "vllm.log"),
            "env": {"FAKE_VLLM_LOG": str(fake_vllm_bin)},
            "startup_timeout_sec": 60,
        },
    )


def with_args(llm: LLM, **args) -> LLM:
    return LLM(**{**llm.model_dump(), "engine_args": {**llm.engine_args, **args}})


def launched(settings) -> list[list[str]]:
    return [json.loads(line) for line in Path(settings.engine_args["env"]["FAKE_VLLM_LOG"]).read_text().splitlines()]


def test_vllm_lifecycle_success(fake_vllm, tiny_model):
    before = {p.pid for p in server_processes(tiny_model)}

    async def ok():
        async with make_engine(fake_vllm) as engine:
            c = await engine.complete(MSG)
            return engine, c, {p.pid for p in server_processes(tiny_model)} - before

    engine, c, started = asyncio.run(ok())
    assert (engine.model, engine.provider) == ("tiny", "hosted_vllm") and c.n_output_tokens > 0
    assert started and {p.pid for p in server_processes(tiny_model)} == before
    [argv] = launched(fake_vllm)
    assert argv[:2] == ["serve", str(tiny_model)] and "--tensor-parallel-size" in argv
    assert argv[argv.index("--max-model-len") + 1] == "1024"
    assert READY in Path(fake_vllm.engine_args["log_path"]).read_text()  # the server's log is kept


def test_vllm_stopped_after_an_exception_inside(fake_vllm, tiny_model):
    before = {p.pid for p in server_processes(tiny_model)}

    async def boom():
        async with make_engine(fake_vllm) as engine:
            await engine.complete(MSG)
            assert {p.pid for p in server_processes(tiny_model)} - before
            raise RuntimeError("the rollout failed")

    with pytest.raises(RuntimeError, match="the rollout failed"):
        asyncio.run(boom())
    assert {p.pid for p in server_processes(tiny_model)} == before


def test_vllm_startup_failure_reports_log_tail(fake_vllm):
    settings = with_args(fake_vllm, env={**fake_vllm.engine_args["env"], "FAKE_VLLM_FAIL": "1"})
    with pytest.raises(EngineError, match="(?s)exited with code 1.*CUDA out of memory"):
        asyncio.run(complete_with(make_engine(settings)))
    with pytest.raises(EngineError, match="cannot run"):
        asyncio.run(complete_with(make_engine(with_args(fake_vllm, vllm_executable="/nonexistent/vllm"))))


def test_sigterm_stops_the_vllm_server(fake_vllm, tiny_model, tmp_path):
    script = tmp_path / "rollout.py"
    script.write_text(
        textwrap.dedent(f"""
        import asyncio, json
        from otbuild.engines import LLM, open_engine

        async def main():
            engine = await open_engine(LLM.model_validate_json({json.dumps(fake_vllm.model_dump_json())}))
            try:
                await engine.complete([{{"role": "user", "content": "hi"}}])
                print("ready", flush=True)
                await asyncio.sleep(60)
            finally:
                await engine.aclose()

        asyncio.run(main())
    """)
    )
    before = {p.pid for p in server_processes(tiny_model)}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env={**os.environ})
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert {p.pid for p in server_processes(tiny_model)} - before
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 128 + signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()
    assert {p.pid for p in server_processes(tiny_model)} == before


def test_a_relative_model_path_not_there_yet_is_not_an_hf_id():
    """`../models/m` (to come before the build) was looked up in the HF cache as an id, and the
    hub's id check raised out of `otbuild validate` as a traceback."""
    from otbuild.engines.model_config import check_vllm_model, model_config

    assert model_config("../models/not-there-yet") is None
    check_vllm_model("../models/not-there-yet", None, 4096, None)  # nothing to check against: passes
