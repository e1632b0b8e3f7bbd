"""vLLM settings checked against the model they serve, before anything starts: what vLLM would
refuse after minutes of loading weights, said at `otbuild validate` time.

- `quantization` names a checkpoint format: AWQ/GPTQ need a checkpoint saved that way, and a
  checkpoint saved in one format cannot be served as another. vLLM reads a checkpoint's own
  format from its config, so the setting is only needed to force one.
- `max_model_len` beyond the model's `max_position_embeddings` needs rope scaling
  (`hf_overrides: {rope_scaling: {rope_type: yarn, factor: F, original_max_position_embeddings: N}}`).

The model's `config.json` is read from a local dir or the local HF cache (never downloaded);
without it the model's name is the evidence (`GLM-4.7-AWQ`, `GLM-4.6-FP8`, `...-GPTQ-Int4`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from otbuild.errors import ConfigError

# Formats a checkpoint is saved in, as vLLM's `--quantization` and model names spell them.
FORMATS = ("awq", "gptq", "fp8")
NEEDS_CHECKPOINT = ("awq", "gptq")  # fp8 can also quantize a bf16 checkpoint on load


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


def check_vllm_model(model: str, quantization: str | None, max_model_len: int | None,
                     hf_overrides: dict | None) -> None:
    """Raise ConfigError when vLLM would refuse to serve `model` with these settings."""
    config = model_config(model)
    fmt = checkpoint_format(model, config)
    evidence = "its config.json" if config is not None else "its name"
    wanted = next((f for f in FORMATS if (quantization or "").lower().startswith(f)), None)
    if wanted and fmt and wanted != fmt:
        raise ConfigError(f"quantization {quantization!r} does not fit {model!r}: by {evidence} it is saved as "
                          f"{fmt.upper()}; leave quantization unset (vLLM reads the checkpoint's own)")
    if wanted in NEEDS_CHECKPOINT and not fmt and (config is not None or _names_a_model(model)):
        raise ConfigError(f"quantization {quantization!r} needs a checkpoint saved as {wanted.upper()}; by {evidence}, "
                          f"{model!r} is not: leave quantization unset, or serve a model saved as {wanted.upper()}")
    limit = (config or {}).get("max_position_embeddings")
    scaled = (hf_overrides or {}).get("rope_scaling") or (config or {}).get("rope_scaling")
    if max_model_len and isinstance(limit, int) and max_model_len > limit and not scaled:
        raise ConfigError(f"max_model_len {max_model_len} exceeds {model!r}'s max_position_embeddings {limit}: "
                          "lower it, or add rope scaling, e.g. hf_overrides: {rope_scaling: {rope_type: yarn, "
                          f"factor: {max_model_len / limit:g}, original_max_position_embeddings: {limit}}}}}")


def _names_a_model(model: str) -> bool:
    """An HF id (`org/name`) whose name can be read for a format tag (not a path on disk)."""
    return bool(re.fullmatch(r"[\w.-]+/[\w.-]+", model)) and not Path(model).exists()
