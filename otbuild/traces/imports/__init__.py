"""Trace importers: existing agent trajectories as trace rows (TRACE_SCHEMA).

Each importer module has `read(path: Path, **options) -> Iterator[dict | Quarantined]`, where
`path` is a trajectory file or a folder of them, and each dict has exactly TRACE_SCHEMA's keys
(turns counted with `count_turns`, like otbuild's own rollouts). Importers are loaded lazily.
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
}
# The files each importer reads in a folder (a file `path` is read whatever its name).
PATH_FORMS = {
    "mini-swe-agent": (".traj.json",),
    "swe-agent": (".traj",),
    "messages-jsonl": (".jsonl", ".ndjson", ".json", ".parquet"),
}


def importer(kind: str):
    if kind not in IMPORTERS:
        raise ValueError(f"unknown trace import kind {kind!r}; choose from {sorted(IMPORTERS)}")
    return importlib.import_module(f"otbuild.traces.imports.{IMPORTERS[kind]}")


def read_traces(kind: str, path: Path, **options) -> Iterator[dict | Quarantined]:
    return importer(kind).read(Path(path), **options)
