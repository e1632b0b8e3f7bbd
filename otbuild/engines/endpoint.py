"""Fail fast on an endpoint that cannot serve a run: a wrong key, an unknown model, a bad
request, a server that is not there. Used by every stage that runs trials against a model
(rollouts, eval; otbuild's harness or Harbor's), so that a build with a wrong key fails at
once naming the API's answer instead of recording thousands of failed trials.

- `FirstRequest(engine)`: the engine with its first request alone. The others wait until a
  request has had an answer; if the first is refused (a 4xx but 429 and a context overflow) or
  nothing answers it (the engine already retried transport errors, 429 and 5xx) the run stops
  with EndpointError; a 5xx after the retries is that trial's failure, and the next request
  goes alone in turn. Later, a 401, 403 or 404 (a key revoked, a model unloaded mid-run)
  still stops the run; other errors are the trial's (an infrastructure failure, retried and
  counted: otbuild/stagekit/failures.py).
- `probe(engine)` / `check_endpoint(llm)`: one small request before a run whose requests are
  not made by otbuild (Harbor's agents), with the same verdict.
"""

from __future__ import annotations

import asyncio

from otbuild.engines.base import Completion, ContextLengthExceededError, Engine, EngineError
from otbuild.errors import StageError

# answers that no retry and no other trial will change: the key, the permission, the model
FATAL_STATUSES = frozenset({401, 403, 404})
PROBE_MESSAGES = [{"role": "user", "content": "Reply with the single word OK."}]


class EndpointError(StageError):
    """The model's endpoint refused the run or could not be reached: the stage fails, naming
    the API's answer (`status`: its HTTP status, None when nothing answered)."""

    def __init__(self, message: str, *, status: int | None = None):
        super().__init__(message)
        self.status = status


def refused(e: EngineError) -> bool:
    """A 4xx about the request itself (its key, model, fields), not about this one conversation
    (too long for the context) nor a rate limit."""
    return (
        e.status is not None
        and 400 <= e.status < 500
        and e.status != 429
        and not isinstance(e, ContextLengthExceededError)
    )


def endpoint_error(e: EngineError, first: bool) -> EndpointError:
    what = "the first request" if first else f"a request (HTTP {e.status}: nothing later can succeed)"
    hints: dict[int | None, str] = {
        401: " (check the API key: api_key_env)",
        403: " (the key may not use this model)",
        404: " (check `model` and `base_url`)",
    }
    hint = hints.get(e.status, "")
    return EndpointError(f"{what} failed, so the run stops{hint}: {e}", status=e.status)


class FirstRequest:
    """An engine whose first request goes alone (this module's docstring). Everything but
    `complete` is the engine's own."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._lock = asyncio.Lock()
        self._answered = False
        self._refusal: EndpointError | None = None  # the run stops: no request after it

    def __getattr__(self, name):
        return getattr(self._engine, name)

    async def complete(self, messages: list[dict], **kw) -> Completion:
        if not self._answered:
            async with self._lock:  # a cancelled first request lets the next one go alone
                if self._refusal is not None:
                    raise self._refusal
                if not self._answered:
                    try:
                        completion = await self._engine.complete(messages, **kw)
                    except EngineError as e:
                        if refused(e) or e.status is None:
                            self._refusal = endpoint_error(e, first=True)
                            raise self._refusal from e
                        self._answered = isinstance(e, ContextLengthExceededError)  # it answered
                        raise
                    self._answered = True
                    return completion
        try:
            return await self._engine.complete(messages, **kw)
        except EngineError as e:
            if e.status in FATAL_STATUSES and not isinstance(e, ContextLengthExceededError):
                raise endpoint_error(e, first=False) from e
            raise


async def probe(engine) -> Completion:
    """One small request to `engine` through FirstRequest: EndpointError when the endpoint
    refuses it or is not there (a 5xx after the retries raises the engine's EngineError)."""
    return await FirstRequest(engine).complete(PROBE_MESSAGES)


def check_endpoint(llm) -> None:
    """probe() the endpoint an LLM section names (engine openai: a hosted API or a server
    already running); a managed engine (vllm, transformers) is probed once started, with
    probe(engine). Raises EndpointError."""
    from otbuild.engines import make_engine

    async def run():
        engine = make_engine(llm)
        try:
            await probe(engine)
        finally:
            await engine.aclose()

    asyncio.run(run())
