"""Trace importers: existing agent trajectories as trace rows (TRACE_SCHEMA).

Each importer module has `read(path: Path, **options) -> Iterator[dict | Quarantined]`, where
`path` is a trajectory file or a folder of them, and each dict has exactly TRACE_SCHEMA's keys
(turns counted with `count_turns`, like otbuild's own rollouts). An importer whose rows relate
across files (Harbor's export: a trial's episodes in several shards) also has
`read_many(paths, **options)`, which reads the files as one table. Importers are loaded lazily.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path

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


def read_traces(kind: str, paths: Path | list[Path], **options) -> Iterator[dict | Quarantined]:
    """The rows of the trajectory files (or folders of them) of one import."""
    module = importer(kind)
    paths = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    if hasattr(module, "read_many"):
        from otbuild.traces.imports._common import files

        return module.read_many([f for p in paths for f in files(p, PATH_FORMS[kind])], **options)
    return (item for p in paths for item in module.read(p, **options))
