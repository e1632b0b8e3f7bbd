"""Ablation grids: `ablate: {setting.path: [values]}` -> one candidate recipe per combination.

A mapping value merges into the setting as `extends` does (`null` deletes a key), so one axis
can set what belongs together: `ablate: {teacher: [{model: A}, {model: B, engine_args: {...}}]}`."""

from __future__ import annotations

import copy
import itertools
import json
from dataclasses import replace

from otbuild.errors import ConfigError
from otbuild.recipe.load import LoadedRecipe, _merge, validate


def candidates(loaded: LoadedRecipe) -> list[tuple[str, LoadedRecipe]]:
    """(name, recipe) for every point of the grid, in grid order; each validated in full."""
    grid = loaded.recipe.ablate
    out: list[tuple[str, LoadedRecipe]] = []
    for values in itertools.product(*grid.values()):
        data = copy.deepcopy(loaded.data)
        data.pop("ablate")
        for key, value in zip(grid, values):
            _set(data, key, value, loaded)
        name = ",".join(f"{k}={_show(v)}" for k, v in zip(grid, values))
        if any(name == n for n, _ in out):
            raise ConfigError(f"{loaded.path}: ablate: two candidates are both named [{name}] "
                              "(a mapping is named by its first setting: make those differ)")
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
    if isinstance(value, dict) and isinstance(node.get(last), dict):  # merged as `extends` merges
        value = _merge(node[last], value, {}, loaded.path, ())
    node[last] = value


def _show(value) -> str:
    """A value in a candidate's name; a mapping is named by its first setting."""
    if isinstance(value, dict) and value:
        return _show(next(iter(value.values())))
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
