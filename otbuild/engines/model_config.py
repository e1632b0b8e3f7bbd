"""vLLM settings checked against the model they serve, before anything starts: what vLLM would
refuse after minutes of loading weights, said at `otbuild validate` time.

- `quantization` names a checkpoint format: AWQ/GPTQ need a checkpoint saved that way, and a
  checkpoint saved in one format cannot be served as another. vLLM reads a checkpoint's own
  format from its config, so the setting is only needed to force one.
- `max_model_len` beyond the model's `max_position_embeddings` needs rope scaling
  (`hf_overrides: {rope_scaling: {rope_type: yarn, factor: F, original_max_position_embeddings: N}}`).

The model's `config.json` is read from a local dir or the local HF cache (never downloaded);
without it the model's name is the evidence (`GLM-4.7-AWQ`, `GLM-4.6-FP8`, `...-GPTQ-Int4`), and
the context of the families in KNOWN_CONTEXT. Errors say which evidence they used.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import cast

from otbuild.errors import ConfigError
from otbuild.settings.engines import LLM, VLLMOptions

# Formats a checkpoint is saved in, as vLLM's `--quantization` and model names spell them.
FORMATS = ("awq", "gptq", "fp8")
NEEDS_CHECKPOINT = ("awq", "gptq")  # fp8 can also quantize a bf16 checkpoint on load

# The context (config.json's max_position_embeddings) of the families the docs and recipes
# name, from their model cards: the check's evidence when config.json is not on this machine
# (a GPU node's cache). Patterns match the model's name in lower case; the first match wins.
KNOWN_CONTEXT = (
    (r"^qwen3-.*(2507|coder|next)", 262_144),  # Qwen3 2507 / Coder / Next: 262,144 native
    (r"^qwen3-", 40_960),  # Qwen3: 32,768 native (+8,192 for the answer), 131,072 with YaRN x4
    (r"^glm-4\.5", 131_072),  # GLM-4.5, GLM-4.5-Air: 128K
    (r"^glm-4\.[67]", 202_752),  # GLM-4.6, GLM-4.7 (and their FP8/AWQ uploads): 200K
    (r"^kimi-k2-(instruct|base)$", 131_072),  # the first Kimi K2: 128K
    (r"^kimi-k2", 262_144),  # Kimi K2 0905, K2 Thinking, K2.5: 256K
)


def model_config(model: str) -> dict | None:
    """The model's config.json: a local dir, else the local HF cache; None if neither has it."""
    path = Path(model) / "config.json"
    if not path.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache
        except ImportError:
            return None
        found = try_to_load_from_cache(model, "config.json") if _names_a_model(model) else None
        if not isinstance(found, str):
            return None
        path = Path(found)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def checkpoint_format(model: str, config: dict | None) -> str | None:
    """The format the checkpoint is saved in: its config's quant_method, else its name's tag."""
    if config is not None:
        method = str((config.get("quantization_config") or {}).get("quant_method") or "").lower()
        return next((f for f in FORMATS if method.startswith(f)), None)
    tags = [f for f in FORMATS if re.search(rf"(?<![a-z0-9]){f}(?![a-z])", Path(model).name.lower())]
    return tags[0] if len(tags) == 1 else None


def check_vllm_model(
    model: str, quantization: str | None, max_model_len: int | None, hf_overrides: dict | None
) -> None:
    """Raise ConfigError when vLLM would refuse to serve `model` with these settings."""
    config = model_config(model)
    fmt = checkpoint_format(model, config)
    evidence = "its config.json" if config is not None else "its name"
    wanted = next((f for f in FORMATS if (quantization or "").lower().startswith(f)), None)
    if wanted and fmt and wanted != fmt:
        raise ConfigError(
            f"quantization {quantization!r} does not fit {model!r}: by {evidence} it is saved as "
            f"{fmt.upper()}; leave quantization unset (vLLM reads the checkpoint's own)"
        )
    if wanted in NEEDS_CHECKPOINT and not fmt and (config is not None or _names_a_model(model)):
        raise ConfigError(
            f"quantization {quantization!r} needs a checkpoint saved as {wanted.upper()}; by {evidence}, "
            f"{model!r} is not: leave quantization unset, or serve a model saved as {wanted.upper()}"
        )
    limit, source = context_limit(model, config)
    scaled = (hf_overrides or {}).get("rope_scaling") or (config or {}).get("rope_scaling")
    if max_model_len and limit and max_model_len > limit and not scaled:
        raise ConfigError(
            f"max_model_len {max_model_len} exceeds {model!r}'s max_position_embeddings {limit} "
            f"(by {source}): lower it, or add rope scaling, e.g. hf_overrides: {{rope_scaling: "
            f"{{rope_type: yarn, factor: {max_model_len / limit:g}, "
            f"original_max_position_embeddings: {limit}}}}}"
        )


def context_limit(model: str, config: dict | None) -> tuple[int | None, str]:
    """The model's max_position_embeddings and where it came from: its config.json, else the
    model card of its family (KNOWN_CONTEXT); (None, ...) when neither knows."""
    if config is not None:
        limit = config.get("max_position_embeddings")
        return (limit if isinstance(limit, int) else None), "its config.json"
    name = Path(model).name.lower()
    for pattern, limit in KNOWN_CONTEXT:
        if re.search(pattern, name):
            return limit, "its family's model card (no config.json on this machine)"
    return None, "nothing: no config.json here and an unknown family"


def _names_a_model(model: str) -> bool:
    """An HF id (`org/name`) whose name can be read for a format tag (not a path on disk)."""
    return bool(re.fullmatch(r"[\w.-]+/[\w.-]+", model)) and not Path(model).exists()


def check_fits_model(llm: LLM) -> None:
    """A vLLM engine's options against its model's own config:
    what vLLM would refuse after loading the weights is a ConfigError up front."""
    if llm.engine == "vllm":
        o = cast(VLLMOptions, llm.launch)
        check_vllm_model(llm.model, o.quantization, o.max_model_len, o.hf_overrides)
