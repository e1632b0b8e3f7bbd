"""Source adapters: each turns some input into Harbor task records (or quarantined items).

Adapters are imported lazily so that planning a DAG never pays for them."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path

from otbuild.sources._rows import EXTENSIONS
from otbuild.tasks.table import Quarantined, TaskRecord

PATH_ADAPTERS = {
    "harbor-dir": "harbor_dir", "harbor-parquet": "harbor_parquet", "tb1-dir": "tb1_dir",
    "swe-instances": "swe_instances", "stackexchange": "stackexchange", "nl2bash": "nl2bash", "table": "table",
}  # fmt: skip
# What a kind's `path` names: a folder of task dirs (None), or record files by extension: one
# such file, or a folder holding them (recursively; harbor-parquet: at its top).
PATH_FORMS: dict[str, tuple[str, ...] | None] = {
    "harbor-dir": None, "tb1-dir": None, "harbor-parquet": (".parquet",),
    "swe-instances": (".jsonl", ".ndjson", ".json"), "stackexchange": (".xml", *EXTENSIONS),
    "nl2bash": EXTENSIONS,  # or a folder holding all.nl + all.cm, or an .nl/.cm file
    "table": EXTENSIONS,
}  # fmt: skip
# Settings keys every path source has; the others are the kind's options, passed to `read`.
COMMON_KEYS = {"kind", "rank", "path", "name", "allow_empty"}


def read_source(settings: dict) -> Iterator[TaskRecord | Quarantined]:
    kind = settings["kind"]
    if kind == "synthetic":
        from otbuild.sources.synthetic import generate

        return generate(settings["count"], settings["seed"], settings.get("families"), settings.get("difficulties"))
    module = importlib.import_module(f"otbuild.sources.{PATH_ADAPTERS[kind]}")
    options = {k: v for k, v in settings.items() if k not in COMMON_KEYS}
    return module.read(Path(settings["path"]), **options)


def path_problem(kind: str, path: Path) -> str | None:
    """Why a `kind` source cannot read `path` (a file where a folder is expected, a folder
    with nothing to read), or None. A path not there yet is fine: data may arrive later."""
    forms = PATH_FORMS.get(kind, ())
    if not path.exists() or (forms and path.is_file()):
        return None
    if forms is None:
        if not path.is_dir():
            return f"expected a folder of task dirs, found the file {path}"
        if not any(p.is_dir() and not p.name.startswith(".") for p in path.iterdir()):
            return f"expected a folder of task dirs, found none in {path}"
        return None
    if kind == "nl2bash" and (path / "all.nl").exists():
        return None
    return files_problem(path, forms, recursive=kind != "harbor-parquet")


def files_problem(path: Path, forms: tuple[str, ...], recursive: bool = True) -> str | None:
    """Why the folder `path` holds nothing to read (no file ending in one of `forms`), or None."""
    files = path.rglob("*") if recursive else path.glob("*")
    if path.is_dir() and not any(f.is_file() and f.name.lower().endswith(forms) for f in files):
        return f"expected a {'/'.join(forms)} file or a folder of them, found none in {path}"
    return None
