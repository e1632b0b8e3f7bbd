"""A tiny random chat model built from scratch (no download): for tests and the CPU smoke run.

A byte-level BPE tokenizer trained on generated text, a qwen-style chat template and a
2-layer Qwen2 model with hidden size 32, all deterministic for a given seed.

`make_tiny_model` is also the SFT stage's `tiny` student (otbuild/train/model.py): there the
tokenizer is trained on the trace set (`texts`), the architecture is Qwen3 and the size and
chat template come from the recipe. Its defaults are the engine tests' model.
"""

from __future__ import annotations

import itertools
from pathlib import Path

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def corpus() -> list[str]:
    """A few hundred lines of terminal-task flavoured text."""
    verbs = ["list", "count", "find", "sort", "copy", "remove", "compress", "print", "check"]
    things = ["files", "lines", "logs", "words", "archives", "scripts", "tests", "tasks"]
    places = ["/tmp", "/app", "the home dir", "the repo", "data/", "the output"]
    cmds = ["ls -la", "wc -l", "grep -r", "sort -u", "tar czf", "python3 -c", "cat", "echo ok"]
    lines = [f"{v} the {t} in {p}" for v, t, p in itertools.product(verbs, things, places)]
    lines += [f'{{"analysis": "run {c}", "commands": [{{"keystrokes": "{c}\\n"}}]}}' for c in cmds]
    return lines


TOKENIZERS = ("bytelevel", "names")


def train_tokenizer(
    texts,
    *,
    vocab_size: int,
    special_tokens: list[str] | None = None,
    chat_template: str = CHAT_TEMPLATE,
    eos_token: str = "<|im_end|>",
    pad_token: str = "<|endoftext|>",
    kind: str = "bytelevel",
):
    """A byte-level BPE tokenizer trained on `texts` (deterministic for the same texts).

    `kind`: `bytelevel` (GPT-2's pre-tokenizer: a word carries the space before it) or
    `names`, for tiny students that must copy names: every whitespace and punctuation
    character (but `_`) and every run of digits is a piece of its own before BPE, so
    `reports_42` is the same tokens (`reports_`, `42`) in "`/app/reports_42/`" as in
    "mv reports_42/ x": copying a name is copying its tokens, and its number follows a
    token that is unique in the task (a one-step induction)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    if kind == "names":
        bpe.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(r"\p{N}+|[^\p{L}\p{N}_]"), "isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    elif kind == "bytelevel":
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        raise ValueError(f"unknown tokenizer kind {kind!r}; choose from {list(TOKENIZERS)}")
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens or SPECIAL),
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(texts, trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=eos_token,
        pad_token=pad_token,
        bos_token=None,
        unk_token=None,
    )
    tok.chat_template = chat_template
    return tok


def make_tiny_model(
    dest: str | Path,
    *,
    seed: int = 0,
    vocab_size: int = 384,
    texts=None,
    arch: str = "qwen2",
    chat_template: str | None = None,
    special_tokens: list[str] | None = None,
    hidden_size: int = 32,
    intermediate_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    max_position_embeddings: int = 1024,
    tokenizer: str = "bytelevel",
    head_dim: int | None = None,
) -> Path:
    """Write a model dir (config, weights, tokenizer, chat template) to `dest`; return it.

    `texts` (default: `corpus()`) trains the tokenizer (`tokenizer`: its kind, see
    `train_tokenizer`); `arch` is "qwen2" or "qwen3"; `head_dim` (qwen3; None:
    hidden_size // num_attention_heads) is the attention heads' width, which vLLM's kernels
    must support (VLLM_HEAD_DIMS in otbuild/settings/train.py)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    dest = Path(dest)
    tok = train_tokenizer(
        corpus() if texts is None else texts,
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        chat_template=chat_template or CHAT_TEMPLATE,
        kind=tokenizer,
    )
    config_cls, model_cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}[arch]
    extra = {"head_dim": head_dim or hidden_size // num_attention_heads} if arch == "qwen3" else {}
    config = config_cls(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        **extra,
    )
    torch.manual_seed(seed)
    model = model_cls(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(dest)
    tok.save_pretrained(dest)
    return dest
