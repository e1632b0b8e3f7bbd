"""Engines that start their own server: the openai engine over a child process."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from otbuild.engines.base import Completion
from otbuild.engines.openai import OpenAIEngine
from otbuild.engines.process import install_sigterm_cleanup
from otbuild.settings.engines import LLM, client_settings


class ManagedServerEngine:
    """Starts the server on first use (or `async with`), stops it on `aclose()`.

    Subclasses set `name`, `default_provider` and implement `_launch() -> (base_url, stop)`,
    which blocks until the server is healthy and cleans up after itself when it fails.
    """

    name = ""
    default_provider = ""

    def __init__(self, settings: LLM):
        self.settings = settings
        self.options = settings.launch  # VLLMOptions, TransformersOptions
        self.client_settings = client_settings(settings)
        self.model = self.client_settings.model
        self.provider = settings.provider or self.default_provider
        self.base_url: str | None = None
        self._client: OpenAIEngine | None = None
        self._stop: Callable[[], None] | None = None
        self._lock = asyncio.Lock()

    def _launch(self) -> tuple[str, Callable[[], None]]:
        raise NotImplementedError

    async def start(self) -> None:
        async with self._lock:
            if self._client is not None:
                return
            install_sigterm_cleanup()  # here: signal handlers need the main thread
            self.base_url, self._stop = await asyncio.to_thread(self._launch)
            self._client = OpenAIEngine(self.client_settings, base_url=self.base_url, name=self.name,
                                        provider=self.provider, trust_env=False)

    async def complete(self, messages: list[dict], **kw) -> Completion:
        await self.start()
        return await self._client.complete(messages, **kw)

    async def aclose(self) -> None:
        client, stop = self._client, self._stop
        self._client = self._stop = None
        try:
            if client is not None:
                await client.aclose()
        finally:
            if stop is not None:
                await asyncio.to_thread(stop)

    async def __aenter__(self):
        await self.start()
        return self

    async def __aexit__(self, *exc):
        await self.aclose()
