"""Chat templates and the assistant-token mask.

The template is the base model's own when it has one, else otbuild's qwen3-style template
(otbuild/templates/qwen3_chat.j2). A conversation is rendered once to text; each assistant
message's content (and the end-of-turn token after it) is located in that text, in order, and
the tokens that start inside those spans are the supervised ones. Everything else (system,
user, tool turns, the template's role headers) carries no loss. This works for any template
that renders an assistant's content verbatim; a template that rewrites it makes the example
fail with `TemplateMismatch` (counted and skipped, never silently mis-masked).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

TEMPLATE_PATH = Path(__file__).resolve().parents[1] / "templates" / "qwen3_chat.j2"
QWEN3_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
                 "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


class TemplateMismatch(ValueError):
    pass


def qwen3_template() -> str:
    return TEMPLATE_PATH.read_text()


def ensure_template(tokenizer, mode: str = "auto") -> str:
    """Give `tokenizer` a chat template; return which one ("model" or "qwen3")."""
    if mode == "auto" and getattr(tokenizer, "chat_template", None):
        return "model"
    tokenizer.chat_template = qwen3_template()
    return "qwen3"


def clean(conversation) -> list[dict]:
    return [{"role": m["role"], "content": m.get("content") or ""} for m in conversation]


def render(tokenizer, conversation: list[dict], *, add_generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(clean(conversation), tokenize=False,
                                         add_generation_prompt=add_generation_prompt)


def assistant_spans(text: str, conversation: list[dict], eos: str | None) -> list[tuple[int, int]]:
    """Character spans of each assistant turn's content (+ the end-of-turn token) in `text`."""
    spans, cursor = [], 0
    for m in conversation:
        content = m.get("content") or ""
        at = text.find(content, cursor) if content else cursor
        if m["role"] == "assistant":
            if at < 0:
                raise TemplateMismatch("an assistant message is not rendered verbatim by the chat template")
            end = at + len(content)
            if eos and text.startswith(eos, end):
                end += len(eos)
            spans.append((at, end))
            cursor = end
        elif at >= 0:
            cursor = at + len(content)
    return spans


def tokenize_conversation(tokenizer, conversation) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids int32, supervised bool) for one conversation."""
    conversation = clean(conversation)
    text = render(tokenizer, conversation)
    spans = assistant_spans(text, conversation, tokenizer.eos_token)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = np.asarray(enc["input_ids"], dtype=np.int32)
    starts = np.asarray([o[0] for o in enc["offset_mapping"]], dtype=np.int64)
    mask = np.zeros(len(ids), dtype=bool)
    for a, b in spans:
        mask |= (starts >= a) & (starts < b)
    return ids, mask
