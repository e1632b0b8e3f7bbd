"""Source adapters: each turns some input into Harbor task records (or quarantined items).

A PATH_ADAPTERS module has `read(cfg) -> Iterator[TaskRecord | Quarantined]`, `cfg` being its
source's settings (otbuild/stages/source.py SourceSettings: its recipe section, whose fields
hold every option's default). Adapters are imported lazily so that planning a DAG never pays for them."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path

from otbuild.records import EXTENSIONS
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


def read_source(cfg) -> Iterator[TaskRecord | Quarantined]:
    """The items of a source (its settings: otbuild/stages/source.py SourceSettings)."""
    if cfg.kind == "synthetic":
        from otbuild.sources.synthetic import generate

        return generate(cfg.count, cfg.seed, cfg.families, cfg.difficulties)
    if cfg.kind == "hf-dataset":
        from otbuild.sources.harbor_parquet import read_path

        return (item for f in hub_files(cfg, (".parquet",)).paths for item in read_path(f))
    if cfg.kind == "harbor-dataset":
        from otbuild.sources.harbor_dataset import read as read_dataset

        return read_dataset(*harbor_tasks(cfg))
    module = importlib.import_module(f"otbuild.sources.{PATH_ADAPTERS[cfg.kind]}")
    return module.read(cfg)


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


def where(cfg) -> str:
    """What a file-reading section reads, for messages: its path or its dataset."""
    if cfg.kind == "hf-dataset":
        from otbuild.hub import where as hub_where

        return hub_where(cfg.repo, (cfg.hub or {}).get("commit") or cfg.revision)
    return cfg.dataset if cfg.kind == "harbor-dataset" else cfg.path


def hub_files(cfg, forms: tuple[str, ...]):
    """The files of an hf-dataset section (`otbuild.hub.HubFiles`): those the plan resolved,
    checked again; else (the plan found them nowhere) resolved now, which fails naming the
    repo and revision when they are still not there."""
    from otbuild import hub

    allow = hub.patterns(cfg.split, cfg.files, forms)
    pick = None if cfg.files else (lambda present, card: hub.select(present, cfg.split, None, forms, card))
    if cfg.hub:
        return hub.planned_files(cfg.hub, allow, pick)
    return hub.resolve(cfg.repo, cfg.revision, allow, pick)


def harbor_tasks(cfg) -> tuple[list[Path], str | None, str]:
    """A harbor-dataset section's task dirs, located again as planned; the digest the plan
    recorded (None: it found them nowhere); NAME@VERSION. Raises StageError naming what is
    still not there."""
    from otbuild.errors import StageError

    dataset, dirs, missing = locate_harbor(cfg)
    if missing:
        raise StageError(f"source {cfg.name!r}: not downloaded: {missing}")
    return dirs, cfg.tasks_digest, dataset


def locate_harbor(cfg) -> tuple[str, list[Path], str | None]:
    """NAME@VERSION, its task dirs, and what is missing (None: nothing)."""
    from otbuild.sources.harbor_dataset import locate

    registry, root = Path(cfg.registry), Path(cfg.root)
    if registry.is_dir():  # as Harbor's --registry-path: the file or the folder holding it
        registry = registry / "registry.json"
    if not registry.is_file():
        return cfg.dataset, [], f"Harbor's registry {registry}"
    dataset, dirs, absent = locate(cfg.dataset, registry, root)
    if absent:
        return (
            dataset,
            dirs,
            (
                f"{dataset}: {len(absent)} of {len(dirs) + len(absent)} tasks (e.g. {absent[0]}) "
                f"in {root} (`harbor datasets download {dataset}`)"
            ),
        )
    return dataset, dirs, None
