"""The request policy: which body fields a model takes, by its name (or `request_params`).

OpenAI's reasoning models (gpt-5*, o1, o3, o4-*) refuse `max_tokens` (they take
`max_completion_tokens`) and every sampling knob but its default value, with an HTTP 400. So
`standard` models get the body as set, `reasoning` models get `max_completion_tokens` and no
sampling knobs; `auto` (the default) picks by model name; an endpoint whose names we cannot
know (an Azure deployment, a proxy's alias) sets `request_params` explicitly.
"""

from __future__ import annotations

import re

POLICIES = ("auto", "standard", "reasoning")
# gpt-5, gpt-5-nano, gpt-5.1-codex, o1-mini, o3, o4-mini, optionally after a provider prefix
# ("openai/gpt-5"); gpt-5-chat-* is the non-reasoning chat model.
REASONING_MODEL = re.compile(r"^(?:[\w.-]+/)?(?:gpt-5(?!-chat)|o[134])(?:$|[-.:_])", re.IGNORECASE)
# Fields a reasoning model accepts only at their default (OpenAI: "Only the default (1) value
# is supported"), with that default.
SAMPLING_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
SAMPLING_ONLY = ("logprobs", "top_logprobs", "logit_bias")  # refused outright


def is_reasoning_model(model: str) -> bool:
    return bool(REASONING_MODEL.match(model or ""))


def resolve(policy: str, model: str) -> str:
    """`standard` or `reasoning` for this model."""
    if policy not in POLICIES:
        raise ValueError(f"request_params must be one of {', '.join(POLICIES)}, not {policy!r}")
    if policy == "auto":
        return "reasoning" if is_reasoning_model(model) else "standard"
    return policy


def apply(policy: str, model: str, body: dict) -> dict:
    """The body as the model takes it: for reasoning models `max_tokens` becomes
    `max_completion_tokens` and the sampling knobs are left out."""
    if resolve(policy, model) == "standard":
        return body
    out = {k: v for k, v in body.items() if k not in SAMPLING_DEFAULTS and k not in SAMPLING_ONLY}
    if "max_tokens" in out:
        out["max_completion_tokens"] = out.pop("max_tokens")
    return out


def refusal(model: str, body: dict) -> tuple[str, str, str] | None:
    """What OpenAI's API says to a body a reasoning model refuses: (param, code, message), or
    None when the model takes it. Stand-in servers use it to be as strict as the API."""
    if not is_reasoning_model(model):
        return None
    if "max_tokens" in body:
        return (
            "max_tokens",
            "unsupported_parameter",
            (
                "Unsupported parameter: 'max_tokens' is not supported "
                "with this model. Use 'max_completion_tokens' instead."
            ),
        )
    for key, default in SAMPLING_DEFAULTS.items():
        if key in body and body[key] != default:
            return (
                key,
                "unsupported_value",
                (
                    f"Unsupported value: '{key}' does not support {body[key]} with "
                    f"this model. Only the default ({default:g}) value is supported."
                ),
            )
    for key in SAMPLING_ONLY:
        if key in body:
            return (key, "unsupported_parameter", f"Unsupported parameter: '{key}' is not supported with this model.")
    return None


def not_sent(policy: str, model: str, section: dict) -> list[str]:
    """The recipe's sampling settings in `section` that this model will not be sent."""
    if resolve(policy, model) == "standard":
        return []
    return [k for k in SAMPLING_DEFAULTS if k in section]
