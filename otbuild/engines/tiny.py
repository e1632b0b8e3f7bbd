"""A tiny random chat model built from scratch (no download): for tests and the CPU smoke run.

A byte-level BPE tokenizer trained on generated text, a qwen-style chat template and a
2-layer Qwen2 model with hidden size 32, all deterministic for a given seed.
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


def make_tiny_model(dest: str | Path, *, seed: int = 0, vocab_size: int = 384) -> Path:
    """Write a model dir (config, weights, tokenizer, chat template) to `dest`; return it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    dest = Path(dest)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(corpus(), trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        bos_token=None, unk_token=None,
    )
    tok.chat_template = CHAT_TEMPLATE
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(dest)
    tok.save_pretrained(dest)
    return dest
