"""LLM engines: one async interface over hosted APIs, vLLM and transformers.

    async with make_engine(LLM(engine="vllm", model="...", ...)) as engine:
        completion = await engine.complete(messages)

or `engine = await open_engine(llm)` ... `await engine.aclose()`. `llm` is a recipe's LLM
section (`otbuild.settings.engines.LLM`) or a subclass of it (an AgentModel, ...): the engines read
its LLM fields: a stage passes its own typed settings (its StageDef's settings model).

`ENGINES` maps a section's `engine` to a factory `LLM -> Engine`, as a callable or a lazy
"module:attribute" path; new engines (e.g. the oracle) add an entry or `register()`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, TypeVar, cast

from otbuild.engines.base import Completion, ContextLengthExceededError, Engine, EngineError
from otbuild.errors import ConfigError
from otbuild.settings.engines import AUTO, LLM, VLLMOptions, server_fallback

Factory = Callable[[LLM], Engine]
L = TypeVar("L", bound=LLM)  # an LLM section (a stage's settings): resolve_auto gives back its own type

ENGINES: dict[str, str | Factory] = {
    "openai": "otbuild.engines.openai:OpenAIEngine",
    "vllm": "otbuild.engines.vllm:VLLMEngine",
    "transformers": "otbuild.engines.local:TransformersEngine",
    "oracle": "otbuild.harness.oracle:OracleEngine",
    "noop": "otbuild.harness.noop:NoopEngine",  # does nothing: the task_check stage's floor
}


def register(name: str, factory: str | Factory) -> None:
    ENGINES[name] = factory


def _resolve(factory: str | Factory) -> Factory:
    if callable(factory):
        return factory
    module, _, attr = factory.partition(":")
    obj: Any = importlib.import_module(module)  # then the factory named in it
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def resolve_auto(llm: L) -> L:
    """`llm` with engine `auto` made `vllm` where a `vllm` is installed (otbuild.engines.vllm:
    vllm_executable), else `transformers` (with the launch options every server takes); any
    other engine as it is."""
    if llm.engine != AUTO:
        return llm
    from otbuild.engines.vllm import vllm_executable

    if vllm_executable(cast(VLLMOptions, llm.launch)) is not None:  # auto takes vLLM's launch options
        return llm.model_copy(update={"engine": "vllm"})
    return llm.model_copy(update={"engine": "transformers", "engine_args": server_fallback(llm.engine_args)})


# the engines that start a model server of their own (vLLM, otbuild serve): its flags are theirs
SERVERS = ("vllm", "transformers")


def takes_tools(engine: str) -> bool:
    """Whether engine `engine` (a registry name, not auto) answers a request's `tools` with tool
    calls (its class's `takes_tools`): the harness's tools protocol needs it."""
    return engine in ENGINES and bool(getattr(_resolve(ENGINES[engine]), "takes_tools", False))


def tools_refusal(llm: LLM) -> str | None:
    """Why `llm`'s engine (auto as resolved here) cannot run the harness's tools protocol; None:
    it can. The offered tools are never silently dropped."""
    engine = resolve_auto(llm).engine
    if takes_tools(engine):
        return None
    return (
        f"harness.protocol is tools, but engine {engine!r} does not answer tool calls "
        "(it would drop the offered tools): use engine vllm or openai, or harness.protocol: terminus2"
    )


def refuse_tools(llm: LLM, where: str) -> None:
    """ConfigError naming `where` (the section) when `tools_refusal` has a reason."""
    if why := tools_refusal(llm):
        raise ConfigError(f"{where}: {why}")


def make_engine(llm: LLM) -> Engine:
    """The engine `llm.engine` names, configured by `llm` (an LLM section or a subclass);
    `auto`: the one resolve_auto picks here."""
    llm = resolve_auto(llm)
    if llm.engine not in ENGINES:
        raise ConfigError(f"unknown engine {llm.engine!r}; expected one of {', '.join(sorted(ENGINES))}")
    return _resolve(ENGINES[llm.engine])(llm)


async def open_engine(llm: LLM) -> Engine:
    """make_engine, then start its server if it manages one (the caller must `aclose()` it)."""
    engine = make_engine(llm)
    start = getattr(engine, "start", None)
    if start is not None:
        try:
            await start()
        except BaseException:
            await engine.aclose()
            raise
    return engine


__all__ = [
    "ENGINES",
    "LLM",
    "Completion",
    "ContextLengthExceededError",
    "Engine",
    "EngineError",
    "make_engine",
    "open_engine",
    "refuse_tools",
    "register",
    "resolve_auto",
    "takes_tools",
    "tools_refusal",
]
