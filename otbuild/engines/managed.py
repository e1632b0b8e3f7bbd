"""Engines that start their own server: the openai engine over a child process.

A server that dies while the engine is open (its process killed, a crashed engine core) is
noticed by the client before it retries, so no request waits on a dead port: the requests in
flight fail with ServerDiedError (an infrastructure failure of their trials, retried as the
stage's failure policy says) and the next request starts the server again, up to the launch
options' `max_restarts`; after that the engine is gone and every request raises
ServerGoneError, which stops the stage naming the server's log tail.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, cast

import httpx

from otbuild.engines.base import Completion, EngineError
from otbuild.engines.openai import OpenAIEngine
from otbuild.engines.process import ServerProcess, install_sigterm_cleanup, server_http
from otbuild.errors import StageError
from otbuild.settings.engines import LLM, TransformersOptions, VLLMOptions, client_settings

if TYPE_CHECKING:
    from otbuild.capture.proxy import CaptureProxy


class ServerDiedError(EngineError):
    """The engine's own server exited while it was being asked (the client's retries stop)."""


class ServerGoneError(StageError):
    """The server died more often than `max_restarts` allows: the stage stops, naming its log."""


class ManagedServerEngine:
    """Starts the server on first use (or `async with`), stops it on `aclose()`.

    Subclasses set `name`, `default_provider` and implement `_launch() -> (base_url, server)`,
    which blocks until the server is healthy and stops it when it fails to get there.
    """

    name = ""
    default_provider = ""
    takes_tools = False  # answers a request's `tools` with tool calls (Completion.tool_calls)

    def __init__(self, settings: LLM):
        self.settings = settings
        # a managed engine's section starts a server: its launch options are never None (subclasses narrow them)
        self.options = cast("VLLMOptions | TransformersOptions", settings.launch)
        self.client_settings = client_settings(settings)
        self.model = self.client_settings.model
        self.provider = settings.provider or self.default_provider
        self.base_url: str | None = None
        self.version: str | None = None  # the engine's release, as its server says (GET /version)
        self.restarts = 0  # times the server was started again after it died
        self._client: OpenAIEngine | None = None
        self._server: ServerProcess | None = None
        self._gone: ServerGoneError | None = None
        self._lock = asyncio.Lock()
        self.capture: CaptureProxy | None = None  # the requests go through it (otbuild/engines/capture.py)

    def _launch(self) -> tuple[str, ServerProcess]:
        raise NotImplementedError

    def died(self) -> str | None:
        """Why the server is not there any more (ServerProcess.gone); None while it runs."""
        return self._server.gone() if self._server is not None else None

    async def start(self) -> None:
        async with self._lock:
            if self._gone is not None:
                raise self._gone
            if self._client is not None:
                why = self.died()
                if why is None:
                    return
                await self._close()
                if self.restarts >= self.options.max_restarts:
                    self._gone = ServerGoneError(
                        f"the server died {self.restarts + 1} time(s), more than "
                        f"max_restarts ({self.options.max_restarts}) allows: {why}"
                    )
                    raise self._gone
                self.restarts += 1
            install_sigterm_cleanup()  # here: signal handlers need the main thread
            base_url, self._server = await asyncio.to_thread(self._launch)
            self.base_url = base_url
            self.version = await asyncio.to_thread(server_version, base_url.removesuffix("/v1"))
            self._client = OpenAIEngine(
                self.client_settings,
                base_url=self.base_url,
                name=self.name,
                provider=self.provider,
                trust_env=False,
                alive=self._alive,
            )
            if self.capture is not None:  # a restarted server may have another port: the proxy follows
                self.capture.upstream = self.base_url
                self._client.send_via(self.capture.url())

    def _alive(self) -> None:
        if (why := self.died()) is not None:
            raise ServerDiedError(why)

    async def complete(self, messages: list[dict], **kw) -> Completion:
        await self.start()
        assert self._client is not None  # start() made it
        return await self._client.complete(messages, **kw)

    async def _close(self) -> None:
        client, server = self._client, self._server
        self._client = self._server = None
        try:
            if client is not None:
                await client.aclose()
        finally:
            if server is not None:
                await asyncio.to_thread(server.stop)

    async def aclose(self) -> None:
        await self._close()

    async def __aenter__(self):
        await self.start()
        return self

    async def __aexit__(self, *exc):
        await self.aclose()


def server_version(root: str, uds: str | None = None) -> str | None:
    """The engine's release as the server at `root` (on its unix socket `uds`, if any) says it."""
    try:
        with server_http(uds, timeout=10.0) as http:
            r = http.get(f"{root}/version")
        return str(r.json()["version"]) if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None
