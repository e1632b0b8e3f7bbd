"""A recipe's error messages: each names the file that set the key (the recipe or one it
extends), the key path, what was found and what was expected, with a did-you-mean where a
value or key is close to one allowed."""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from otbuild.recipe.schema import Recipe
from otbuild.settings.engines import LaunchOptionsError


def file_for(loc: tuple, origin: dict, default: Path) -> Path:
    """The file that set the key at `loc` or the nearest section above it (`origin`: key path ->
    file, from reading the `extends:` chain), else `default`."""
    for n in range(len(loc), 0, -1):
        if loc[:n] in origin:
            return origin[loc[:n]]
    return default


def suggest(word: str, choices: list[str], what: str) -> str:
    """`; did you mean 'X'? (WHAT: choices)`: the close match if there is one, then every choice."""
    close = difflib.get_close_matches(word, choices, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{hint} ({what}: {', '.join(choices)})" if choices else hint


def format_error(err: Mapping[str, Any], origin: dict, path: Path) -> str:
    """One pydantic error of validating a Recipe, as a line naming its file and key."""
    model, loc, union = _walk(Recipe, err["loc"])
    if err["type"] == "union_tag_not_found":  # no `kind`: say which the section's keys point to
        return _describe(err, model, loc, origin, path) + _guess_kind(err.get("input"), union)
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, LaunchOptionsError):  # keys of an engine_args mapping, by its engine's options
        return launch_errors(cause, loc, origin, path)
    return _describe(err, model, loc, origin, path)


def launch_errors(error: LaunchOptionsError, loc: tuple, origin: dict, path: Path) -> str:
    """The errors of a mapping of launch options (an engine's, at `loc`), one line each."""
    return "\n".join(_describe(e, error.options, (*loc, *e["loc"]), origin, path) for e in error.errors)


def _describe(err: Mapping[str, Any], model: type[BaseModel] | None, loc: tuple, origin: dict, path: Path) -> str:
    """One error at `loc` (a key path in the recipe) of a key that `model` owns."""
    where = ".".join(str(p) for p in loc) or "(top level)"
    file = file_for(loc, origin, path)
    kind, found = err["type"], err.get("input")
    if kind == "extra_forbidden":
        key = str(loc[-1])
        allowed = sorted(model.model_fields) if model else []
        return f"{file}: {where}: unknown key" + suggest(key, allowed, "allowed keys")
    if kind == "missing":
        return f"{file}: {where}: required key is missing"
    if kind in ("union_tag_invalid", "union_tag_not_found"):  # the `kind` of a section with several kinds
        key = err["ctx"]["discriminator"].strip("'")
        tags = re.findall(r"'([^']*)'", (err.get("ctx") or {}).get("expected_tags", ""))
        file, where = file_for((*loc, key), origin, path), f"{where}.{key}"
        if kind == "union_tag_not_found":
            return f"{file}: {where}: required key is missing"
        return f"{file}: {where}: unknown {key} {err['ctx']['tag']!r}" + suggest(err["ctx"]["tag"], tags, f"{key}s")
    if kind == "literal_error" and isinstance(found, str):  # one of a few values: say which is close
        return f"{file}: {where}: unknown value {found!r}" + suggest(
            found, re.findall(r"'([^']*)'", err["ctx"]["expected"]), "expected one of"
        )
    msg = err["msg"].removeprefix("Value error, ")
    return f"{file}: {where}: {msg}; found {found!r}"


def _walk(model: type[BaseModel], raw_loc: tuple) -> tuple[type[BaseModel] | None, tuple, object]:
    """Follow a pydantic error location through the schema. Returns the model that owns the
    last key, the location without discriminator tags (which are not keys in the file) and the
    type found there."""
    t: object = model
    clean: list = []
    owner: type[BaseModel] | None = model
    for part in raw_loc:
        t = _unwrap(t)
        if isinstance(t, type) and issubclass(t, BaseModel):
            owner = t
            clean.append(part)
            field = t.model_fields.get(part)
            t = field.annotation if field else None
        elif typing.get_origin(t) is dict:
            clean.append(part)
            t = typing.get_args(t)[1]
        elif typing.get_origin(t) is list:
            clean.append(part)
            t = typing.get_args(t)[0]
        elif _is_union(t):  # discriminated union: `part` is the tag
            t = next((m for m in typing.get_args(t) if part in _kinds(m)), None)
        else:
            clean.append(part)
    return owner, tuple(clean), t


def _guess_kind(found, union) -> str:
    """For a section without `kind`: a key whose value is a kind (`type: synthetic`), else the
    one set of kinds whose keys hold all the section's keys; then every kind."""
    members = [m for m in typing.get_args(_unwrap(union)) if _kinds(m)]
    tags = [k for m in members for k in _kinds(m)]
    if not tags:
        return ""
    found = found if isinstance(found, dict) else {}
    named = [(k, v) for k, v in found.items() if isinstance(v, str) and v in tags]
    fit = [m for m in members if found and set(found) <= set(m.model_fields)]
    if named:
        hint = f"; did you mean `kind: {named[0][1]}` (found `{named[0][0]}: {named[0][1]}`)?"
    elif len(fit) == 1:
        hint = f"; its keys ({', '.join(found)}) fit kind {' or '.join(map(repr, _kinds(fit[0])))}"
    else:
        hint = ""
    return f"{hint} (kinds: {', '.join(tags)})"


def _unwrap(t):
    while typing.get_origin(t) is typing.Annotated:
        t = typing.get_args(t)[0]
    if _is_union(t):
        members = [a for a in typing.get_args(t) if a is not type(None)]
        if len(members) == 1:
            return _unwrap(members[0])
        return typing.Union[tuple(_unwrap(m) for m in members)]  # noqa: UP007 (built at run time)
    return t


def _is_union(t) -> bool:
    return typing.get_origin(t) in (typing.Union, types.UnionType)


def _kinds(model) -> tuple:
    field = getattr(model, "model_fields", {}).get("kind")
    return typing.get_args(field.annotation) if field else ()
