"""The `openai` engine: any OpenAI-compatible chat endpoint over httpx (no SDK).

Bounded concurrency (one semaphore per engine), retries with exponential backoff and jitter on
transport errors, timeouts, 429 and 5xx; other 4xx fail at once; no retry when `alive` says the
server behind `base_url` is gone (a managed server, otbuild/engines/managed.py). Failures raise EngineError;
a request the model's context window cannot hold raises its subclass ContextLengthExceededError.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections import Counter
from collections.abc import Callable

import httpx

from otbuild.capture import NO_ANSWER_HEADER, SCOPE_HEADER, call_scope
from otbuild.engines import request_policy
from otbuild.engines.base import Completion, ContextLengthExceededError, EngineError, backoff_delay
from otbuild.engines.toolcalls import tool_calls_of
from otbuild.errors import ConfigError
from otbuild.settings.engines import LLM, concurrency
from otbuild.tls import makes_tls

# How OpenAI-compatible servers say a request is over the context window: vLLM and OpenAI
# ("maximum context length", "context_length_exceeded"), vLLM's "maximum model length",
# SGLang ("the model's context length"), Anthropic-style gateways ("prompt is too long").
CONTEXT_OVERFLOW = re.compile(
    r"context[ _]length|maximum model length|prompt is too long|"
    r"context window",
    re.IGNORECASE,
)


class OpenAIEngine:
    """Chat completions against `base_url` (over the unix socket `uds` when given). One engine
    per event loop."""

    name = "openai"
    takes_tools = True  # sends `tools`, reads `message.tool_calls`

    def __init__(
        self,
        settings: LLM,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        name: str | None = None,
        provider: str = "openai",
        trust_env: bool = True,
        alive: Callable[[], None] | None = None,
        uds: str | None = None,
    ):
        self.settings = settings
        self.base_url = (base_url or settings.base_url or "").rstrip("/")
        if not self.base_url:
            raise ConfigError(f"engine {self.name!r}: `base_url` must be set")
        self.name = name or self.name
        self.model = settings.model
        self.provider = settings.provider or provider
        self.url = f"{self.base_url}/chat/completions"
        key_env = settings.api_key_env
        if key_env and api_key is None:
            api_key = os.environ.get(key_env)
            if not api_key:
                raise ConfigError(f"engine {self.name!r}: api_key_env {key_env!r} is not set")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._sem = asyncio.Semaphore(concurrency(settings))
        self._trust_env = trust_env
        self._alive = alive or (lambda: None)  # raises when the server behind base_url is gone
        self._uds = uds  # a local server's unix socket: base_url's host is only the Host header
        self._client: httpx.AsyncClient | None = None
        self._via_proxy = False
        self.stats: Counter = Counter()  # requests, retries, errors, usage_missing

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def send_via(self, proxy_url: str) -> None:
        """Send the requests to `proxy_url` (a capture proxy on loopback that forwards them to
        base_url, otbuild/capture/proxy.py) from the first request on: not over a unix socket,
        not through the environment's proxies. Errors still name base_url."""
        assert self._client is None, "send_via before the first request"
        self.url = f"{proxy_url.rstrip('/')}/chat/completions"
        self._uds, self._trust_env, self._via_proxy = None, False, True

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            n, t = concurrency(self.settings), self.settings.request_timeout_sec
            limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(t, connect=min(t, 30.0)),
                limits=limits,
                headers=self._headers,
                trust_env=self._trust_env,
                verify=self._makes_tls(),
                transport=httpx.AsyncHTTPTransport(uds=self._uds, limits=limits) if self._uds else None,
            )
        return self._client

    def _makes_tls(self) -> bool:
        return makes_tls(self.url, uds=self._uds, trust_env=self._trust_env)

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        delay = backoff_delay(attempt, self.settings.backoff_sec, self.settings.backoff_max_sec)
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.settings.backoff_max_sec))
        return delay

    async def complete(self, messages: list[dict], **kw) -> Completion:
        """One completion; `kw` overrides request body keys (temperature, max_tokens, ...)."""
        body = request_body(self.settings, messages, kw)
        attempts = self.settings.max_retries + 1
        last, status, retry_after = "", None, None
        for attempt in range(attempts):
            if attempt:
                self._alive()  # a managed server that died: no retry waits on its port
                self.stats["retries"] += 1
                await asyncio.sleep(self._delay(attempt, retry_after))
                self._alive()
            retry_after = None
            self.stats["requests"] += 1
            try:
                async with self._sem:
                    scope = call_scope.get()
                    r = await self._http().post(self.url, json=body, headers={SCOPE_HEADER: scope} if scope else None)
            except httpx.TransportError as e:  # connect/read errors and timeouts
                last, status = f"{type(e).__name__}: {e}".rstrip(": "), None
                continue
            if r.status_code == 200:
                return self._parse(r)
            if (
                r.status_code == 502 and self._via_proxy and (why := r.headers.get(NO_ANSWER_HEADER))
            ):  # nothing answered it
                last, status = why, None
                continue
            status, last = r.status_code, f"HTTP {r.status_code}: {r.text[:500]}"
            if r.status_code != 429 and r.status_code < 500:
                self.stats["errors"] += 1
                error = ContextLengthExceededError if CONTEXT_OVERFLOW.search(r.text) else EngineError
                raise error(f"{self._who()} rejected the request ({last})", status=status)
            retry_after = _seconds(r.headers.get("retry-after"))
        self.stats["errors"] += 1
        self._alive()
        raise EngineError(f"{self._who()}: no answer after {attempts} attempt(s); last error: {last}", status=status)

    def _who(self) -> str:
        return f"engine {self.name} ({self.model} at {self.base_url}{f' on {self._uds}' if self._uds else ''})"

    def _parse(self, r: httpx.Response) -> Completion:
        try:
            data = r.json()
            choice = data["choices"][0]
            message = choice["message"]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise EngineError(f"{self._who()}: malformed response ({e!r}): {r.text[:300]}") from e
        usage = data.get("usage") or {}
        if not usage:
            self.stats["usage_missing"] += 1
        tokens = (choice.get("logprobs") or {}).get("content")
        return Completion(
            text=message.get("content") or "",
            n_input_tokens=int(usage.get("prompt_tokens") or 0),
            n_output_tokens=int(usage.get("completion_tokens") or 0),
            finish_reason=choice.get("finish_reason"),
            usage_reported=bool(usage),
            reasoning=message.get("reasoning_content") or message.get("reasoning"),
            token_ids=choice.get("token_ids"),
            logprobs=[float(t["logprob"]) for t in tokens] if isinstance(tokens, list) else None,
            tool_calls=tool_calls_of(message),
            prompt_token_ids=data.get("prompt_token_ids"),
        )


def request_body(settings: LLM, messages: list[dict], kw: dict) -> dict:
    """The JSON body of one chat completion request: the settings' sampling keys (those set),
    then `extra_body`, then the request's own `kw` (each overriding what came before), shaped
    by the model's request policy (`request_policy`). A request offering `tools` lets the
    model choose (`tool_choice: auto`) unless the settings or `kw` say otherwise (`required`, a
    named function)."""
    body = {"model": settings.model, "messages": messages, "temperature": settings.temperature}
    for key in ("max_tokens", "top_p", "seed"):
        if getattr(settings, key) is not None:
            body[key] = getattr(settings, key)
    body = {**body, **settings.extra_body, **kw}
    if body.get("tools") and "tool_choice" not in body:
        body["tool_choice"] = "auto"
    return request_policy.apply(settings.request_params, settings.model, body)


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP date: fall back to our own backoff
