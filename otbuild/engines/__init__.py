"""LLM engines: one async interface over hosted APIs, vLLM and transformers.

    async with make_engine({"engine": "vllm", "model": "...", ...}) as engine:
        completion = await engine.complete(messages)

or `engine = await open_engine(settings)` ... `await engine.aclose()`. A recipe section with
other keys beside the engine's goes through `engine_settings(section)` first.

`ENGINES` maps a recipe's `engine` key to a factory `settings dict -> Engine`, as a callable
or a lazy "module:attribute" path; new engines (e.g. the oracle) add an entry or `register()`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from otbuild.engines.base import Completion, ContextLengthExceededError, Engine, EngineError
from otbuild.engines.settings import engine_settings
from otbuild.errors import ConfigError

Factory = Callable[[dict], Engine]

ENGINES: dict[str, str | Factory] = {
    "openai": "otbuild.engines.openai:OpenAIEngine.from_settings",
    "vllm": "otbuild.engines.vllm:VLLMEngine.from_settings",
    "transformers": "otbuild.engines.local:TransformersEngine.from_settings",
    "oracle": "otbuild.engines.oracle:OracleEngine",
}


def register(name: str, factory: str | Factory) -> None:
    ENGINES[name] = factory


def _resolve(factory: str | Factory) -> Factory:
    if callable(factory):
        return factory
    module, _, attr = factory.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def make_engine(settings: dict) -> Engine:
    """The engine named by settings["engine"], configured from the other keys."""
    name = settings.get("engine")
    if name not in ENGINES:
        raise ConfigError(f"unknown engine {name!r}; expected one of {', '.join(sorted(ENGINES))}")
    return _resolve(ENGINES[name])(settings)


async def open_engine(settings: dict) -> Engine:
    """make_engine, then start its server if it manages one (the caller must `aclose()` it)."""
    engine = make_engine(settings)
    start = getattr(engine, "start", None)
    if start is not None:
        try:
            await start()
        except BaseException:
            await engine.aclose()
            raise
    return engine


__all__ = ["ENGINES", "Completion", "ContextLengthExceededError", "Engine", "EngineError",
           "engine_settings", "make_engine", "open_engine", "register"]
