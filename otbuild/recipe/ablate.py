"""Ablation grids: `ablate: {setting.path: [values]}` -> one candidate recipe per combination.

A mapping value merges into the setting as `extends` does (`null` deletes a key), so one axis
can set what belongs together: `ablate: {teacher: [{model: A}, {model: B, engine_args: {...}}]}`."""

from __future__ import annotations

import copy
import itertools
import json
from dataclasses import replace
from typing import Any

from otbuild.errors import ConfigError
from otbuild.recipe.load import LoadedRecipe, validate
from otbuild.recipe.read import merge


def candidates(loaded: LoadedRecipe) -> list[tuple[str, LoadedRecipe]]:
    """(name, recipe) for every point of the `ablate` grid, in grid order; each validated in full."""
    data = copy.deepcopy(loaded.data)
    data.pop("ablate")
    return [(name, cand) for name, _, cand in grid_candidates(loaded, data, loaded.recipe.ablate, "ablate")]


def search_stage(loaded: LoadedRecipe, step: int, fixed: dict) -> tuple[list[tuple[str, dict, LoadedRecipe]], str]:
    """Stage `step` (from 1) of the recipe's search: (name, values, recipe) of each candidate,
    with the earlier stages' winning values (`fixed`) set, and the default candidate's name: the
    recipe's own value of each key where the grid has it, else the grid's first value."""
    data = copy.deepcopy(loaded.data)
    data.pop("search")
    data.pop("decision", None)
    for key, value in fixed.items():
        set_value(data, key, value, loaded)
    grid = loaded.recipe.search[step - 1]
    out = grid_candidates(loaded, data, grid, f"search stage {step}")
    default = {key: own if (own := _get(data, key)) in values else values[0] for key, values in grid.items()}
    return out, next(name for name, values, _ in out if values == default)


def grid_candidates(loaded: LoadedRecipe, data: dict, grid: dict, what: str) -> list[tuple[str, dict, LoadedRecipe]]:
    """(name, values, recipe) for every point of `grid` over the document `data`, in grid order."""
    out: list[tuple[str, dict, LoadedRecipe]] = []
    for values in itertools.product(*grid.values()):
        cand = copy.deepcopy(data)
        for key, value in zip(grid, values):
            set_value(cand, key, value, loaded)
        name = point_name(grid, values)
        if any(name == n for n, _, _ in out):
            raise ConfigError(
                f"{loaded.path}: {what}: two candidates are both named [{name}] "
                "(a mapping is named by its first setting: make those differ)"
            )
        recipe = validate(cand, {}, loaded.path, context=f"{what} candidate [{name}]: ")
        out.append((name, dict(zip(grid, values)), replace(loaded, data=cand, recipe=recipe)))
    return out


def point_name(keys, values) -> str:
    """A grid point's name: `key=value,...` (a candidate's label part)."""
    return ",".join(f"{k}={_show(v)}" for k, v in zip(keys, values))


def points(grid: dict) -> list[str]:
    """The names of a grid's points, in grid order."""
    return [point_name(grid, values) for values in itertools.product(*grid.values())]


def _get(data: dict, dotted: str):
    """The document's value at `dotted` (None where it is not set)."""
    node: Any = data
    for key in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def set_value(data: dict, dotted: str, value, loaded: LoadedRecipe) -> None:
    *parents, last = dotted.split(".")
    node = data
    for i, key in enumerate(parents):
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{loaded.path}: ablate.{dotted}: {'.'.join(parents[: i + 1])} is not a mapping")
    if isinstance(value, dict) and isinstance(node.get(last), dict):  # merged as `extends` merges
        value = merge(node[last], value, {}, loaded.path, ())
    node[last] = value


def _show(value) -> str:
    """A value in a candidate's name; a mapping is named by its first setting. A name is one
    part of a label (a path under results/): `/` becomes `--`, as in `org--model`."""
    if isinstance(value, dict) and value:
        return _show(next(iter(value.values())))
    return (value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))).replace("/", "--")
