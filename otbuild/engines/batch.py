"""Many independent prompts through one engine, for the LLM task stages (augment, scoring)."""

from __future__ import annotations

import asyncio

from otbuild.engines import Completion, EngineError, engine_settings, open_engine


def complete_all(settings: dict, requests: list[tuple[list[dict], dict]]) -> list[Completion | EngineError]:
    """Each request is (messages, body overrides such as seed). Results keep the order; a
    request that fails after the engine's retries gives its EngineError in its place."""
    return asyncio.run(_complete_all(settings, requests))


async def _complete_all(settings: dict, requests):
    engine = await open_engine(engine_settings(settings))
    try:
        async def one(messages, overrides):
            try:
                return await engine.complete(messages, **overrides)
            except EngineError as e:
                return e

        return await asyncio.gather(*(one(m, o) for m, o in requests))
    finally:
        await engine.aclose()
