"""Stages that installed packages add: each entry point of the group `otbuild.stages` names a
`StageDef` (otbuild/stages/__init__.py places them in pipeline order; the recipe loader reads
their sections). Found here, below both, so each asks the same list."""

from __future__ import annotations

from functools import cache
from importlib.metadata import entry_points
from typing import Any

ENTRY_POINTS = "otbuild.stages"  # docs/architecture.md, "Adding a stage"


@cache
def added_stages() -> tuple[Any, ...]:
    """The StageDefs the installed packages' entry points name, as loaded (checked by the registry)."""
    return tuple(ep.load() for ep in entry_points(group=ENTRY_POINTS))


def added_sections() -> dict[str, Any]:
    """Recipe key -> the settings model of an added stage's section."""
    return {d.section or d.name: d.settings for d in added_stages()}
