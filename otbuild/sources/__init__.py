"""Source adapters: each turns some input into Harbor task records (or quarantined items).

Adapters are imported lazily so that planning a DAG never pays for them."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path

from otbuild.tasks.table import Quarantined, TaskRecord

PATH_ADAPTERS = {"harbor-dir": "harbor_dir", "harbor-parquet": "harbor_parquet", "tb1-dir": "tb1_dir"}


def read_source(settings: dict) -> Iterator[TaskRecord | Quarantined]:
    kind = settings["kind"]
    if kind == "synthetic":
        from otbuild.sources.synthetic import generate

        return generate(settings["count"], settings["seed"], settings.get("families"), settings.get("difficulties"))
    module = importlib.import_module(f"otbuild.sources.{PATH_ADAPTERS[kind]}")
    return module.read(Path(settings["path"]))
