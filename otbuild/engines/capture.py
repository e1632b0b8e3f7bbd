"""Put a capture proxy between an engine and its server."""

from __future__ import annotations

from otbuild.capture.proxy import CaptureProxy
from otbuild.settings.engines import LLM, concurrency
from otbuild.settings.trials import ShardedTrials

# a proxy waits on the server longer than any client request does: the client gives up first
UPSTREAM_GRACE_SEC = 60.0


def server_asks(settings: LLM) -> tuple[str, ...]:
    """What the proxy asks a vLLM that otbuild started for: the token ids, and each answer
    token's log-prob unless the stage says `capture_logprobs: false`."""
    if isinstance(settings, ShardedTrials) and not settings.capture_logprobs:
        return ("return_token_ids",)
    return ("return_token_ids", "logprobs")


def capture_engine(engine, settings: LLM, ask_tokens: bool = True) -> CaptureProxy | None:
    """A started proxy that `engine`'s requests go through from its first request on (a managed
    server's restarts included); None for an engine that asks no server (the oracle). With
    `ask_tokens`, the proxy asks a vLLM that otbuild started for token ids and log-probs
    (server_asks). Close
    it after the engine."""
    from otbuild.engines.managed import ManagedServerEngine
    from otbuild.engines.openai import OpenAIEngine

    connections, timeout = concurrency(settings) + 8, settings.request_timeout_sec + UPSTREAM_GRACE_SEC
    if isinstance(engine, ManagedServerEngine):
        ask = server_asks(settings) if ask_tokens and engine.name == "vllm" else ()
        proxy = CaptureProxy(trust_env=False, ask=ask, connections=connections, timeout=timeout).start()
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
    with `ask_tokens`, a vLLM that otbuild started (`managed`) is asked for token ids and log-probs
    (server_asks)."""
    return CaptureProxy(
        base_url,
        trust_env=not managed,
        ask=server_asks(settings) if ask_tokens and managed and settings.engine == "vllm" else (),
        connections=concurrency(settings) + 8,
        timeout=settings.request_timeout_sec + UPSTREAM_GRACE_SEC,
    ).start()
