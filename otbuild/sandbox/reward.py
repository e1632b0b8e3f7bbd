"""Reading the verifier's reward from a trial root, without trusting what is there."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from otbuild.sandbox import safefs

MAX_BYTES = 1 << 20


def read_reward(root: Path) -> float | dict[str, float] | None:
    """`logs/verifier/reward.txt` (a float) and/or `reward.json` (a flat dict of numbers): the
    float alone, the dict alone, or with both the dict whose "reward" is reward.txt's (metrics
    beside the reward, e.g. the synthetic verifiers' partial credit); None when neither
    exists. Raises ValueError for a malformed reward. Symlinks are refused (the sandbox could
    plant one pointing at a host file)."""
    found: dict[str, Any] = {}  # file name -> its parsed value (a float or a flat dict)
    for name, parse in (("reward.txt", _float), ("reward.json", _flat_dict)):
        data = _read_no_follow(Path(root), ("logs", "verifier", name))
        if data is not None:
            found[name] = parse(data.decode("utf-8", errors="replace"), name)
    if "reward.json" not in found:
        return found.get("reward.txt")
    if "reward.txt" not in found:
        return found["reward.json"]
    return {**found["reward.json"], "reward": found["reward.txt"]}


def _float(text: str, name: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError(f"{name}: not a number: {text[:80]!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"{name}: not a finite number: {value}")
    return value


def _flat_dict(text: str, name: str) -> dict[str, float]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{name}: not JSON ({e})") from None
    if not isinstance(obj, dict) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in obj.values()
    ):
        raise ValueError(f"{name}: not a flat dict of numbers")
    return {str(k): float(v) for k, v in obj.items()}


def _read_no_follow(root: Path, parts: tuple[str, ...]) -> bytes | None:
    try:
        return safefs.read_file(root, "/".join(parts), MAX_BYTES)
    except OSError as e:  # a link where a folder or the file should be, a pipe, ...
        raise ValueError(f"{'/'.join(parts)}: {e.strerror}") from None
