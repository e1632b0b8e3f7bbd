"""Source adapters: each turns some input into Harbor task records (or quarantined items).

Adapters are imported lazily so that planning a DAG never pays for them."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path

from otbuild.tasks.table import Quarantined, TaskRecord

PATH_ADAPTERS = {
    "harbor-dir": "harbor_dir", "harbor-parquet": "harbor_parquet", "tb1-dir": "tb1_dir",
    "swe-instances": "swe_instances", "stackexchange": "stackexchange", "nl2bash": "nl2bash", "table": "table",
}  # fmt: skip
# Settings keys every path source has; the others are the kind's options, passed to `read`.
COMMON_KEYS = {"kind", "rank", "path", "name"}


def read_source(settings: dict) -> Iterator[TaskRecord | Quarantined]:
    kind = settings["kind"]
    if kind == "synthetic":
        from otbuild.sources.synthetic import generate

        return generate(settings["count"], settings["seed"], settings.get("families"), settings.get("difficulties"))
    module = importlib.import_module(f"otbuild.sources.{PATH_ADAPTERS[kind]}")
    options = {k: v for k, v in settings.items() if k not in COMMON_KEYS}
    return module.read(Path(settings["path"]), **options)
