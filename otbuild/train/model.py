"""The student: a model spec from the recipe -> a model dir on disk -> (model, tokenizer).

`tiny`: a Qwen3-architecture model built from its config, with a byte-level BPE tokenizer
trained on the trace set's text (deterministic: same traces, same vocabulary) and the qwen3
chat template's special tokens (otbuild.engines.tiny.make_tiny_model). `pretrained`: a local
model dir (or an HF id already in the local cache); never downloaded by otbuild.
"""

from __future__ import annotations

from pathlib import Path

from otbuild.train.chat import QWEN3_SPECIAL, ensure_template, qwen3_template


def trace_texts(conversations) -> list[str]:
    return [m.get("content") or "" for conv in conversations for m in conv]


def materialise(spec: dict, dest: Path, conversations=None) -> Path:
    """The base model dir for `spec` (a tiny one is built in `dest`)."""
    if spec["kind"] == "tiny":
        from otbuild.engines.tiny import make_tiny_model

        if (dest / "config.json").exists() and (dest / "tokenizer.json").exists():
            return dest
        texts = trace_texts(conversations or [])
        size = {k: spec[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                     "num_attention_heads", "num_key_value_heads",
                                     "max_position_embeddings") if k in spec}
        return make_tiny_model(dest, seed=spec.get("seed", 0), vocab_size=spec.get("vocab_size", 1024),
                               texts=texts or None, arch="qwen3", chat_template=qwen3_template(),
                               special_tokens=QWEN3_SPECIAL, tokenizer=spec.get("tokenizer", "bytelevel"), **size)
    path = Path(spec["path"])
    return path if path.exists() else Path(spec["path"])  # an HF id: resolved from the local cache


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
