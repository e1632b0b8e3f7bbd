"""Chat templates, reasoning blocks and the assistant-token mask.

`chat_template` (the recipe's `sft.model.chat_template`):
- `qwen3_thinking`: otbuild's qwen3 template (otbuild/templates/qwen3_chat.j2); every assistant
  turn keeps its reasoning, laid out as Qwen3 writes it (`<think>\\nR\\n</think>\\n\\nANSWER`).
  The paper's 32B student.
- `qwen3`: the same template with every `<think>...</think>` block removed before training
  (the answers alone): the non-thinking student (the paper's 8B).
- `auto`: the base model's own template when it has one, else `qwen3_thinking`. The model's
  template must render each assistant turn verbatim: Qwen3's own strips the reasoning of every
  assistant turn before the last user message, so multi-turn reasoning traces fail with
  `TemplateMismatch` there (counted by reason and skipped, never mis-masked; SFT fails when
  more than `max_dropped_fraction` of the traces are dropped).

A conversation is rendered once to text; each assistant message's content (and the
end-of-turn token after it) is located in that text, in order, and the tokens that start
inside those spans are the supervised ones. Everything else (system, user, tool turns, the
template's role headers) carries no loss.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

TEMPLATE_PATH = Path(__file__).resolve().parents[1] / "templates" / "qwen3_chat.j2"
QWEN3_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
                 "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
TEMPLATES = ("auto", "qwen3", "qwen3_thinking")


class TemplateMismatch(ValueError):
    pass


def qwen3_template() -> str:
    return TEMPLATE_PATH.read_text()


def ensure_template(tokenizer, mode: str = "auto") -> str:
    """Give `tokenizer` a chat template; return which one ("model", "qwen3" or "qwen3_thinking")."""
    if mode not in TEMPLATES:
        raise ValueError(f"unknown chat_template {mode!r}; expected one of {list(TEMPLATES)}")
    own = getattr(tokenizer, "chat_template", None)
    if mode == "auto" and own and own != qwen3_template():
        return "model"
    tokenizer.chat_template = qwen3_template()
    return "qwen3_thinking" if mode == "auto" else mode


def clean(conversation) -> list[dict]:
    return [{"role": m["role"], "content": m.get("content") or ""} for m in conversation]


def split_reasoning(content: str) -> tuple[str | None, str]:
    """(reasoning, answer) of an assistant message, as Qwen3's template splits them; no
    `</think>`: (None, content)."""
    if "</think>" not in content:
        return None, content
    parts = content.split("</think>")
    return parts[0].rstrip("\n").split("<think>")[-1].lstrip("\n"), parts[-1].lstrip("\n")


def for_template(conversation, source: str) -> list[dict]:
    """The messages a template renders: reasoning in Qwen3's layout (`qwen3_thinking`), removed
    (`qwen3`), or left as written (the model's own template)."""
    out = clean(conversation)
    if source == "model":
        return out
    for m in out:
        if m["role"] == "assistant":
            reasoning, answer = split_reasoning(m["content"])
            if reasoning is not None and source == "qwen3":
                m["content"] = answer
            elif reasoning is not None:
                m["content"] = "<think>\n" + reasoning.strip("\n") + "\n</think>\n\n" + answer
    return out


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


def span_mask(starts: np.ndarray, spans) -> np.ndarray:
    """Tokens whose first character lies in one of `spans` (starts: non-decreasing offsets)."""
    mask = np.zeros(len(starts), dtype=bool)
    for a, b in spans:
        mask[np.searchsorted(starts, a):np.searchsorted(starts, b)] = True
    return mask


def _first_token_from(enc, char: int, n: int) -> int | None:
    """The first token of a backend `Encoding` that starts at or after `char` (None: unknown)."""
    t = enc.char_to_token(char)
    if t is None:
        return n if char >= enc.token_to_chars(n - 1)[1] else None
    return t if enc.token_to_chars(t)[0] >= char else t + 1


def _encoding_mask(enc, spans) -> np.ndarray:
    """span_mask from a handful of char -> token look-ups instead of every token's offsets."""
    n = len(enc.ids)
    mask = np.zeros(n, dtype=bool)
    for a, b in spans:
        lo, hi = (_first_token_from(enc, c, n) for c in (a, b))
        if lo is None or hi is None:  # a character no token covers: fall back to every offset
            starts = np.fromiter((o[0] for o in enc.offsets), dtype=np.int64, count=n)
            return span_mask(starts, spans)
        mask[lo:hi] = True
    return mask


def tokenize_batch(tokenizer, conversations, source: str = "model") -> list:
    """(input_ids int32, supervised bool) for each conversation, or the TemplateMismatch that
    made it unusable. One batched call of the fast tokenizer (in Rust, on every core)."""
    out, texts, at = [], [], []
    for conv in conversations:
        conv = for_template(conv, source)
        text = render(tokenizer, conv)
        try:
            out.append(assistant_spans(text, conv, tokenizer.eos_token))
        except TemplateMismatch as e:
            out.append(e)
            continue
        texts.append(text)
        at.append(len(out) - 1)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and texts:
        for i, enc in zip(at, backend.encode_batch(texts, add_special_tokens=False), strict=True):
            out[i] = (np.asarray(enc.ids, dtype=np.int32), _encoding_mask(enc, out[i]) if enc.ids else
                      np.zeros(0, dtype=bool))
    else:  # a slow (python) tokenizer
        for i, text in zip(at, texts, strict=True):
            enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            starts = np.asarray([o[0] for o in enc["offset_mapping"]], dtype=np.int64)
            out[i] = (np.asarray(enc["input_ids"], dtype=np.int32), span_mask(starts, out[i]))
    return out


def tokenize_conversation(tokenizer, conversation, source: str = "model") -> tuple[np.ndarray, np.ndarray]:
    """(input_ids int32, supervised bool) for one conversation."""
    (res,) = tokenize_batch(tokenizer, [conversation], source)
    if isinstance(res, TemplateMismatch):
        raise res
    return res
