"""The engine interface: what every LLM backend gives a rollout."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Completion:
    """One chat completion. Token counts come from the server's `usage`."""

    text: str
    n_input_tokens: int
    n_output_tokens: int
    finish_reason: str | None  # "stop", "length", ... as the server said
    usage_reported: bool = True  # False: the server sent no `usage`, the counts are 0
    reasoning: str | None = None  # `reasoning_content`, when a reasoning parser split it off
    token_ids: list[int] | None = None  # the answer's token ids, where the server returns them (return_token_ids)
    logprobs: list[float] | None = None  # each answer token's log-prob as sampled, where asked for (logprobs: true)
    prompt_token_ids: list[int] | None = None  # the prompt as the server tokenized it (return_token_ids)
    # the answer's native tool calls, as the server sent them: [{id, type, function: {name,
    # arguments}}], `arguments` the model's JSON text byte for byte; None: no tool call
    tool_calls: list[dict] | None = None


class EngineError(Exception):
    """An infrastructure failure (after retries): recorded as the trial's exception, apart from
    task failures. `status` is the last HTTP status, None when no response came back."""

    def __init__(self, message: str, *, status: int | None = None):
        super().__init__(message)
        self.status = status


class ContextLengthExceededError(EngineError):
    """The request does not fit the model's context window (prompt + max_tokens): not an
    infrastructure failure but the end of a trial, which the harness records as a task failure
    (as Harbor's terminus-2 does)."""


def backoff_delay(attempt: int, base_sec: float, max_sec: float) -> float:
    """Before retry `attempt` (1, 2, ...): exponential backoff with equal jitter (half fixed,
    half random), `base_sec` doubling, capped at `max_sec`."""
    cap = min(max_sec, base_sec * 2 ** (attempt - 1))
    return cap / 2 + random.uniform(0, cap / 2)


@runtime_checkable
class Engine(Protocol):
    """An LLM backend. Use as `async with make_engine(settings) as engine:` (starts a managed
    server, if any, and always stops it), or call `aclose()` yourself."""

    name: str  # "openai", "vllm", "transformers", "oracle"
    model: str
    provider: str  # the trace's model_provider column
    # an engine that answers a request's `tools` with tool calls sets `takes_tools = True`;
    # one that does not is refused for harness.protocol: tools (engines.takes_tools)

    async def complete(self, messages: list[dict], **kw) -> Completion: ...

    async def aclose(self) -> None: ...
