"""What a plan finds outside the project for a node's `external` fields (otbuild/settings/base.py):
files by their content, a dataset on the Hub by its commit and files' digests, a Harbor dataset
by its version and its task dirs' digest. A node's id holds these instead of where the data
lies; data not there yet still plans, under an id that says what is missing (and changes once
it arrives)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from otbuild.errors import StageError
from otbuild.hashing import content_digest
from otbuild.settings.base import EXTERNAL, fields_with


def find(config: Any, resolve) -> tuple[Any, dict, list[tuple[str | None, str, bool]]]:
    """The node's settings with paths made absolute and what the plan resolved filled in, what
    its id holds for the external fields, and what is missing: (key or None, what, needed).
    `resolve(path)`: a recipe path, relative to the project. Raises StageError for a Harbor
    registry that does not name the dataset."""
    if config.kind == "hf-dataset":
        return _hub(config)
    if config.kind == "harbor-dataset":
        return _harbor(config, resolve)
    update: dict[str, str] = {}
    found: dict = {}
    missing: list[tuple[str | None, str, bool]] = []
    for key in sorted(fields_with(type(config), EXTERNAL)):
        if (value := getattr(config, key)) is None:
            continue
        path = resolve(value)
        update[key] = str(path.resolve())
        if path.exists():
            found[key] = {"sha256": content_digest(path)}
        else:
            found[key] = {"missing": update[key]}
            missing.append((key, str(path), True))
    return config.model_copy(update=update), found, missing


def _hub(config) -> tuple[Any, dict, list]:
    """The commit and files of a dataset on the Hub (or in its local cache); the job may still
    fetch what is not in the cache, so what is missing does not stop a build."""
    from otbuild.sources import hub_files, where
    from otbuild.traces.imports import PATH_FORMS

    forms = PATH_FORMS[config.format] if hasattr(config, "format") else (".parquet",)
    try:
        found = hub_files(config, forms)
    except StageError as e:
        return config, {"hub": {"missing": where(config)}}, [(None, str(e), False)]
    return config.model_copy(update={"hub": found.planned()}), {"hub": found.identity()}, []


def _harbor(config, resolve) -> tuple[Any, dict, list]:
    """A Harbor dataset: NAME@VERSION from the registry, its task dirs where Harbor downloaded
    them, and their digest."""
    from otbuild.sources import locate_harbor
    from otbuild.sources.harbor_dataset import HARBOR_TASK_CACHE, tasks_digest

    update = {
        key: str(resolve(str(Path(v).expanduser())).resolve())
        for key in ("registry", "path")
        if (v := getattr(config, key))
    }
    update["root"] = update.get("path") or str(HARBOR_TASK_CACHE.expanduser())
    config = config.model_copy(update=update)
    dataset, dirs, missing = locate_harbor(config)  # StageError: the registry does not name it
    config = config.model_copy(update={"dataset": dataset})
    if missing:
        return config, {"missing": missing}, [(None, missing, True)]
    digest = tasks_digest(dirs)
    return config.model_copy(update={"tasks_digest": digest}), {"tasks": digest}, []
