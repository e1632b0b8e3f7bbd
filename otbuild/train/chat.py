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

A conversation is rendered once to text, with the tools it was offered (the trace's `tools`
column); each assistant message's content, its tool-call blocks (`tool_call_text`) and the
end-of-turn token after them are located in that text, in order, and the tokens that start
inside those spans are the supervised ones. Everything else (system, the offered tools, user
turns, tool results, the template's role headers) carries no loss.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from otbuild.engines.toolcalls import arguments_object

TEMPLATE_PATH = Path(__file__).resolve().parents[1] / "templates" / "qwen3_chat.j2"
QWEN3_SPECIAL = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]
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
    """{role, content} messages, plus an assistant's `tool_calls` and a tool result's
    `tool_call_id` where the trace has them (a terminus-2 trace: neither). A call's arguments
    go to the template as the object their JSON text holds, as vLLM's chat path passes them (its
    renderers/chat_utils.py): the template writes them with tojson (json.dumps), so what otbuild
    trains on is what vLLM renders when the conversation comes back to it; text that is not a
    JSON object becomes {}, as vLLM makes it (`bad_tool_calls` finds such calls)."""
    out = []
    for m in conversation:
        msg = {"role": m["role"], "content": m.get("content") or ""}
        if m.get("tool_calls"):
            msg["tool_calls"] = [
                {
                    "id": c.get("id"),
                    "type": c.get("type") or "function",
                    "function": {"name": c["function"]["name"], "arguments": arguments_object(c) or {}},
                }
                for c in m["tool_calls"]
            ]
        if m.get("tool_call_id"):
            msg["tool_call_id"] = m["tool_call_id"]
        out.append(msg)
    return out


def bad_tool_calls(conversation) -> int:
    """The tool calls a template cannot render as the model would be shown them: no function
    name, or arguments that are not a JSON object (vLLM renders them as {})."""
    return sum(
        not isinstance((c.get("function") or {}).get("name"), str) or arguments_object(c) is None
        for m in conversation
        for c in m.get("tool_calls") or ()
    )


def tool_call_text(message: dict, answer: str) -> str:
    """An assistant message's tool calls as Qwen3's template writes them after its `answer`
    (the text outside any reasoning): one `<tool_call>` block each, newline-separated, the
    arguments as tojson writes the object (`clean`)."""
    blocks = [
        '<tool_call>\n{"name": "'
        + c["function"]["name"]
        + '", "arguments": '
        + json.dumps(arguments_object(c) or {}, ensure_ascii=False)
        + "}\n</tool_call>"
        for c in message.get("tool_calls") or ()
    ]
    return ("\n" if blocks and answer else "") + "\n".join(blocks)


def parse_tools(text: str | None) -> list[dict] | None:
    """A trace's `tools` column (a JSON array of OpenAI tool definitions) as the template takes
    it; null or empty: None (no tools block)."""
    if not text:
        return None
    tools = json.loads(text)
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ValueError("tools: not a JSON array of tool definitions")
    return tools or None


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


def render(
    tokenizer, conversation: list[dict], *, add_generation_prompt: bool = False, tools: list[dict] | None = None
) -> str:
    return tokenizer.apply_chat_template(
        clean(conversation), tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
    )


def assistant_spans(text: str, conversation: list[dict], eos: str | None) -> list[tuple[int, int]]:
    """Character spans of each assistant turn's content and tool-call blocks (+ the
    end-of-turn token) in `text`."""
    spans, cursor = [], 0
    for m in conversation:
        content = m.get("content") or ""
        if m["role"] == "assistant" and m.get("tool_calls"):
            content += tool_call_text(m, split_reasoning(content)[1])
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
        mask[np.searchsorted(starts, a) : np.searchsorted(starts, b)] = True
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


def byte_lengths(tokenizer) -> np.ndarray | None:
    """Per token id, the bytes of text it stands for, when the tokenizer is byte-level BPE
    (every character of a token's string is one byte; an added token is its text); else None."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    spec = json.loads(backend.to_str())
    pre = spec.get("pre_tokenizer") or {}
    kinds = {p.get("type") for p in pre.get("pretokenizers", [pre])}
    if (
        spec["model"].get("type") != "BPE"
        or "ByteLevel" not in kinds
        or (spec.get("decoder") or {}).get("type") != "ByteLevel"
    ):
        return None
    vocab = backend.get_vocab(with_added_tokens=True)
    table = np.zeros(max(vocab.values()) + 1, dtype=np.int64)
    for token, i in vocab.items():
        table[i] = len(token)
    for i, added in backend.get_added_tokens_decoder().items():
        table[i] = len(added.content.encode())
    return table


def _byte_spans(text: str, spans) -> list[tuple[int, int]]:
    """Character spans of `text` as UTF-8 byte spans."""
    if text.isascii():
        return spans
    cp = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    ends = np.zeros(len(cp) + 1, dtype=np.int64)
    np.cumsum(1 + (cp >= 0x80) + (cp >= 0x800) + (cp >= 0x10000), out=ends[1:])
    return [(int(ends[a]), int(ends[b])) for a, b in spans]


def tokenize_batch(
    tokenizer, conversations, source: str = "model", lengths: np.ndarray | None = None, tools: list | None = None
) -> list:
    """(input_ids int32, supervised bool) for each conversation, or the TemplateMismatch that
    made it unusable. One batched call of the fast tokenizer (in Rust, on every core).
    `tools`: per conversation, the tool definitions it was offered (None: none).

    `lengths` (byte_lengths(tokenizer), computed once by the caller): the tokens' byte offsets
    are summed from their ids, so the tokenizer need not track offsets (its faster call); a
    text whose tokens do not add up to its bytes (a normalizer changed it) is encoded again
    with offsets."""
    out: list[Any] = []  # each conversation's spans, then its (ids, mask); or its TemplateMismatch
    texts: list[str] = []
    at: list[int] = []
    for k, conv in enumerate(conversations):
        if bad_tool_calls(conv):
            out.append(TemplateMismatch("a tool call has no name or its arguments are not a JSON object"))
            continue
        conv = for_template(conv, source)
        text = render(tokenizer, conv, tools=tools[k] if tools else None)
        try:
            out.append(assistant_spans(text, conv, tokenizer.eos_token))
        except TemplateMismatch as e:
            out.append(e)
            continue
        texts.append(text)
        at.append(len(out) - 1)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # a slow (python) tokenizer
        for i, text in zip(at, texts, strict=True):
            enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            starts = np.asarray([o[0] for o in enc["offset_mapping"]], dtype=np.int64)
            out[i] = (np.asarray(enc["input_ids"], dtype=np.int32), span_mask(starts, out[i]))
        return out
    redo = list(range(len(texts)))
    if lengths is not None and texts:
        redo = []
        fast = getattr(backend, "encode_batch_fast", backend.encode_batch)  # tokenizers >= 0.21
        for k, enc in enumerate(fast(texts, add_special_tokens=False)):
            ids = np.asarray(enc.ids, dtype=np.int64)
            ends = np.cumsum(lengths[ids]) if len(ids) else np.zeros(0, dtype=np.int64)
            if (ends[-1] if len(ends) else 0) != len(texts[k].encode()):
                redo.append(k)
                continue
            starts = ends - lengths[ids]
            out[at[k]] = (ids.astype(np.int32), span_mask(starts, _byte_spans(texts[k], out[at[k]])))
    if redo:
        for k, enc in zip(redo, backend.encode_batch([texts[k] for k in redo], add_special_tokens=False), strict=True):
            out[at[k]] = (
                np.asarray(enc.ids, dtype=np.int32),
                _encoding_mask(enc, out[at[k]]) if enc.ids else np.zeros(0, dtype=bool),
            )
    return out


def tokenize_conversation(
    tokenizer, conversation, source: str = "model", tools: list[dict] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids int32, supervised bool) for one conversation (offered `tools`)."""
    (res,) = tokenize_batch(tokenizer, [conversation], source, byte_lengths(tokenizer), [tools])
    if isinstance(res, TemplateMismatch):
        raise res
    return res
