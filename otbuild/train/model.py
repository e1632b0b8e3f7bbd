"""The student: a model spec from the recipe -> a model dir on disk -> (model, tokenizer).

`tiny`: a Qwen3-architecture model built from its config, with a byte-level BPE tokenizer
trained on a bounded sample of the trace set's text (deterministic: same traces, same
vocabulary) and the qwen3 chat template's special tokens (otbuild.engines.tiny.make_tiny_model).
`pretrained`: a local model dir (or an HF id already in the local cache); never downloaded.
"""

from __future__ import annotations

from pathlib import Path

from otbuild.harness.protocol import iter_conversations
from otbuild.settings.recipe import PROMPTS
from otbuild.settings.train import ModelSpec
from otbuild.train.chat import QWEN3_SPECIAL, ensure_template, qwen3_template, tool_call_text

TOKENIZER_SAMPLE_CHARS = 8_000_000  # a tiny tokenizer trains on at most this much trace text


def sample_texts(traces, prompt: str = PROMPTS[0], max_chars: int = TOKENIZER_SAMPLE_CHARS) -> list[str]:
    """The messages of a bounded, deterministic sample of the trace parquet(s): every trace
    while the set is small, else every k-th (k from the parquet's uncompressed size), until
    `max_chars` characters are taken. An assistant's tool calls count as its text, laid out as
    the template renders them."""
    paths = [traces] if isinstance(traces, (str, Path)) else list(traces)
    size = sum(map(_conversation_bytes, paths))
    stride = max(1, -(-size // max_chars))
    texts, chars, i = [], 0, 0
    for convs in iter_conversations(paths, prompt=prompt):
        for conv in convs:
            if conv and i % stride == 0:
                texts += [(m.get("content") or "") + tool_call_text(m, "") for m in conv]
                chars += sum(map(len, texts[-len(conv) :]))
            i += 1
            if chars >= max_chars:
                return texts
    return texts


def _conversation_bytes(path) -> int:
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    return sum(
        meta.row_group(g).column(c).total_uncompressed_size
        for g in range(meta.num_row_groups)
        for c in range(meta.num_columns)
        if meta.row_group(g).column(c).path_in_schema.startswith("conversations")
    )


def materialise(spec: ModelSpec, dest: Path, traces=None, prompt: str = PROMPTS[0]) -> Path:
    """The base model dir for `spec` (a tiny one is built in `dest`, its tokenizer trained on a
    bounded sample of the trace parquet(s) `traces`)."""
    if spec.kind == "tiny":
        from otbuild.engines.tiny import make_tiny_model

        if (dest / "config.json").exists() and (dest / "tokenizer.json").exists():
            return dest
        texts = sample_texts(traces, prompt) if traces else []
        size = spec.model_dump(
            include={
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
                "max_position_embeddings",
                "head_dim",
            }
        )
        return make_tiny_model(
            dest,
            seed=spec.seed,
            vocab_size=spec.vocab_size,
            texts=texts or None,
            arch="qwen3",
            chat_template=qwen3_template(),
            special_tokens=QWEN3_SPECIAL,
            tokenizer=spec.tokenizer,
            **size,
        )
    return Path(spec.path)  # a dir, or an HF id resolved from the local cache


def load_tokenizer(path, template_mode: str = "auto"):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    source = ensure_template(tok, template_mode)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok, source


def load_model(path, dtype=None):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype or torch.float32)
