"""Ablation grids: `ablate: {setting.path: [values]}` -> one candidate recipe per combination."""

from __future__ import annotations

import copy
import itertools
import json
from dataclasses import replace

from otbuild.errors import ConfigError
from otbuild.recipe.load import LoadedRecipe, validate


def candidates(loaded: LoadedRecipe) -> list[tuple[str, LoadedRecipe]]:
    """(name, recipe) for every point of the grid, in grid order; each validated in full."""
    grid = loaded.recipe.ablate
    out = []
    for values in itertools.product(*grid.values()):
        data = copy.deepcopy(loaded.data)
        data.pop("ablate")
        for key, value in zip(grid, values):
            _set(data, key, value, loaded)
        name = ",".join(f"{k}={_show(v)}" for k, v in zip(grid, values))
        recipe = validate(data, {}, loaded.path, context=f"ablate candidate [{name}]: ")
        out.append((name, replace(loaded, data=data, recipe=recipe)))
    return out


def _set(data: dict, dotted: str, value, loaded: LoadedRecipe) -> None:
    *parents, last = dotted.split(".")
    node = data
    for i, key in enumerate(parents):
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{loaded.path}: ablate.{dotted}: {'.'.join(parents[: i + 1])} is not a mapping")
    node[last] = value


def _show(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
