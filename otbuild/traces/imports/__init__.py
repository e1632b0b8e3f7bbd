"""Trace importers: existing agent trajectories as trace rows (TRACE_SCHEMA).

Each importer module has `read(path: Path, cfg) -> Iterator[dict | Quarantined]`, where
`path` is a trajectory file or a folder of them, `cfg` the importer's options (its model in
IMPORT_OPTIONS, otbuild/settings/recipe.py: the import's section is one), and each dict has
exactly TRACE_SCHEMA's keys (turns counted with `count_turns`, like otbuild's own rollouts). An
importer whose rows relate across files (Harbor's export: a trial's episodes in several
shards) also has `read_many(paths, cfg)`, which reads the files as one table. Importers are
loaded lazily.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path

from otbuild.settings.recipe import IMPORT_OPTIONS
from otbuild.tasks.table import Quarantined

IMPORTERS = {
    "mini-swe-agent": "mini_swe_agent",
    "swe-agent": "swe_agent",
    "messages-jsonl": "messages_jsonl",
    "harbor-traces": "harbor_traces",
}
# The files each importer reads in a folder (a file `path` is read whatever its name).
PATH_FORMS = {
    "mini-swe-agent": (".traj.json",),
    "swe-agent": (".traj",),
    "messages-jsonl": (".jsonl", ".ndjson", ".json", ".parquet"),
    "harbor-traces": (".parquet", ".jsonl", ".ndjson", ".json"),
}


def importer(kind: str):
    if kind not in IMPORTERS:
        raise ValueError(f"unknown trace import kind {kind!r}; choose from {sorted(IMPORTERS)}")
    return importlib.import_module(f"otbuild.traces.imports.{IMPORTERS[kind]}")


def read_traces(cfg, paths: list[Path] | None = None) -> Iterator[dict | Quarantined]:
    """The rows of one import (its settings: otbuild/stages/trace_import.py TraceImportSettings):
    the trajectory files (or folders of them) of its `path`, or `paths` (an hf-dataset's files,
    read by the importer its `format` names)."""
    if cfg.kind == "hf-dataset":
        kind, options = cfg.format, format_options(cfg)
    else:
        kind, options = cfg.kind, cfg
    module = importer(kind)
    paths = [Path(cfg.path)] if paths is None else [Path(p) for p in paths]
    if hasattr(module, "read_many"):
        from otbuild.traces.imports._common import files

        return module.read_many([f for p in paths for f in files(p, PATH_FORMS[kind])], options)
    return (item for p in paths for item in module.read(p, options))


def format_options(cfg):
    """An hf-dataset import's options for the importer of its `format`: what the section
    sets; a field it leaves None has that importer's default (IMPORT_OPTIONS)."""
    model = IMPORT_OPTIONS[cfg.format]
    return model(**{k: v for k, v in cfg if k in model.model_fields and v is not None})
