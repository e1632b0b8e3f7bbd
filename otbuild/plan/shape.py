"""The pipeline's shape, from the registry's declarations (`StageDef.section`, `consumes`,
`produces`): which stages a recipe plans (its sections that are set, in pipeline order) and what
each consumes. The plan (otbuild/plan/) walks it to wire each stage's inputs, and reports from
it, naming the key's file, an input no earlier section brings and data brought that no stage
uses (the checks across sections, otbuild/recipe/checks.py, leave these to it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from otbuild.stagekit import section_key, section_of
from otbuild.stages import STAGES, StageDef

__all__ = ["gaps", "planned", "section_key", "section_of"]


def planned(recipe: Any) -> list[tuple[StageDef, Any]]:
    """(stage, its recipe section) of each data stage the recipe sets, in pipeline order."""
    return [
        (d, section)
        for d in STAGES.values()
        if d.produces and (section := section_of(recipe, section_key(d))) is not None
    ]


def bringers(kind: str) -> list[str]:
    """The sections that bring data of `kind` in (they make it from nothing of that kind)."""
    return [section_key(d) for d in STAGES.values() if d.produces == kind and kind not in d.consumes]


def users(kind: str | None) -> list[str]:
    """The sections that turn data of `kind` into something else."""
    return [section_key(d) for d in STAGES.values() if kind in d.consumes and d.produces != kind]


@dataclass(frozen=True)
class Gap:
    key: str  # the recipe key to name
    why: str


def gaps(recipe: Any) -> list[Gap]:
    """What does not fit together, in pipeline order: nothing to start from; an input that no
    earlier section brings; then data a section brings that no stage uses and that is not
    what the recipe ends with."""
    stages = planned(recipe)
    if not any(not d.consumes for d, _ in stages):
        starts = " or ".join(
            f"`{section_key(d)}` ({d.produces})" for d in STAGES.values() if d.produces and not d.consumes
        )
        return [Gap("", f"nothing to build from: add {starts}")]
    out: list[Gap] = []
    origin: dict[str | None, str] = {}  # kind -> the section that brought it in
    unused: dict[str | None, str] = {}  # kind -> its origin, while no later stage has used it
    for d, _ in stages:
        for kind in d.consumes:
            if kind not in origin:
                out.append(Gap(section_key(d), f"needs {kind}: add {_either(bringers(kind))}"))
            unused.pop(kind, None)
        origin.setdefault(d.produces, section_key(d))
        unused[d.produces] = origin[d.produces]
    last = stages[-1][0].produces
    out += [
        Gap(
            key,
            f"no stage uses these {kind} (the recipe ends in {last}): add {_either(users(kind))}, or remove `{key}`",
        )
        for kind, key in unused.items()
        if kind != last
    ]
    return out


def _either(keys: list[str]) -> str:
    return " or ".join(f"`{k}`" for k in keys)
