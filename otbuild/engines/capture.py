"""Put a capture proxy between an engine and its server."""

from __future__ import annotations

from otbuild.capture.proxy import CaptureProxy
from otbuild.settings.engines import LLM, concurrency

# a proxy waits on the server longer than any client request does: the client gives up first
UPSTREAM_GRACE_SEC = 60.0


def capture_engine(engine, settings: LLM, ask_tokens: bool = True) -> CaptureProxy | None:
    """A started proxy that `engine`'s requests go through from its first request on (a managed
    server's restarts included); None for an engine that asks no server (the oracle). With
    `ask_tokens`, the proxy asks a vLLM that otbuild started for token ids and log-probs. Close
    it after the engine."""
    from otbuild.engines.managed import ManagedServerEngine
    from otbuild.engines.openai import OpenAIEngine

    connections, timeout = concurrency(settings) + 8, settings.request_timeout_sec + UPSTREAM_GRACE_SEC
    if isinstance(engine, ManagedServerEngine):
        ask = ask_tokens and engine.name == "vllm"
        proxy = CaptureProxy(trust_env=False, ask_tokens=ask, connections=connections, timeout=timeout).start()
        engine.capture = proxy
        client = engine._client  # started already (open_engine): route it now, as start() does later
        if client is not None and engine.base_url:
            proxy.upstream = engine.base_url
            client.send_via(proxy.url())
        return proxy
    if isinstance(engine, OpenAIEngine):
        proxy = CaptureProxy(
            engine.base_url, uds=engine._uds, trust_env=engine._trust_env, connections=connections, timeout=timeout
        ).start()
        engine.send_via(proxy.url())
        return proxy
    return None


def harbor_proxy(base_url: str, settings: LLM, *, managed: bool, ask_tokens: bool = True) -> CaptureProxy:
    """A started proxy in front of `base_url` for Harbor's agents (they take its `url(scope)`);
    with `ask_tokens`, a vLLM that otbuild started (`managed`) is asked for token ids and log-probs."""
    return CaptureProxy(
        base_url,
        trust_env=not managed,
        ask_tokens=ask_tokens and managed and settings.engine == "vllm",
        connections=concurrency(settings) + 8,
        timeout=settings.request_timeout_sec + UPSTREAM_GRACE_SEC,
    ).start()
