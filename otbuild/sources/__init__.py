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
COMMON_KEYS = {"kind", "rank", "path", "name", "allow_empty", "sample"}
# Kinds naming a dataset by id rather than a path: resolved when planned (`resolve_dataset`).
DATASET_KINDS = {"hf-dataset", "harbor-dataset"}
HUB_KEYS = {"repo", "revision", "split", "files", "hub"}  # what an hf-dataset section says about its files


def read_source(settings: dict) -> Iterator[TaskRecord | Quarantined]:
    kind = settings["kind"]
    if kind == "synthetic":
        from otbuild.sources.synthetic import generate

        return generate(settings["count"], settings["seed"], settings.get("families"), settings.get("difficulties"))
    if kind == "hf-dataset":
        from otbuild.sources.harbor_parquet import read as read_parquet

        return (item for f in hub_files(settings, (".parquet",)) for item in read_parquet(f))
    if kind == "harbor-dataset":
        from otbuild.sources.harbor_dataset import read as read_dataset

        if "tasks" not in settings:  # the plan did not find them all: say what is still missing
            from otbuild.errors import StageError

            settings, _, missing = resolve_dataset(settings, {}, Path, ())
            if missing:
                raise StageError(f"source {settings['name']!r}: not downloaded: {missing[0]}")
        return read_dataset(settings["tasks"], settings["tasks_digest"], settings["dataset"])
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


def where(settings: dict) -> str:
    """What a file-reading section reads, for messages: its path or its dataset."""
    if settings["kind"] == "hf-dataset":
        from otbuild.hub import where as hub_where

        hub = settings.get("hub") or {}
        return hub_where(settings["repo"], hub.get("commit") or settings["revision"])
    return settings["dataset"] if settings["kind"] == "harbor-dataset" else settings["path"]


def hub_files(settings: dict, forms: tuple[str, ...]) -> list[Path]:
    """The local files of an hf-dataset section: those the plan resolved, else (the plan found
    them nowhere) resolved now, which fails naming the repo and revision."""
    from otbuild import hub

    planned = settings.get("hub") or _resolve_hub(settings, forms).as_dict()
    return hub.local_files(planned)


def _resolve_hub(settings: dict, forms: tuple[str, ...]):
    from otbuild import hub

    return hub.resolve(settings["repo"], settings["revision"], hub.patterns(settings.get("split"), settings.get("files"), forms))


def resolve_dataset(settings: dict, ident: dict, resolve_path, forms: tuple[str, ...]) -> tuple[dict, dict, list[str]]:
    """Plan a DATASET_KINDS section: its settings for the stage (what exactly to read), its
    identity (the resolved commit or version and the content's digests, not where it lies) and
    what is not there yet. Raises StageError for a registry that does not name the dataset."""
    from otbuild.errors import StageError

    settings, ident = dict(settings), dict(ident)
    if settings["kind"] == "hf-dataset":
        for key in HUB_KEYS:
            ident.pop(key, None)
        try:
            settings["hub"] = _resolve_hub(settings, forms).as_dict()
        except StageError as e:
            ident["hub"] = {"missing": where(settings)}
            return settings, ident, [str(e)]
        ident["hub"] = settings["hub"]
        return settings, ident, []
    from otbuild.sources.harbor_dataset import locate, tasks_digest

    for key in ("registry", "path"):
        ident.pop(key, None)
        if settings.get(key):
            settings[key] = str(resolve_path(settings[key]).expanduser().resolve())
    registry = Path(settings["registry"])
    if not registry.is_file():
        ident["missing"] = settings["registry"]
        return settings, ident, [settings["registry"]]
    root = Path(settings["path"]) if settings.get("path") else None
    dataset, dirs, absent = locate(settings["dataset"], registry, root)
    settings["dataset"] = ident["dataset"] = dataset
    if absent:
        ident["missing"] = dataset
        return settings, ident, [f"{dataset}: {len(absent)} of {len(dirs) + len(absent)} tasks (e.g. {absent[0]}) "
                                 f"in {root or '~/.cache/harbor/tasks'} (`harbor datasets download {dataset}`)"]
    settings["tasks"] = [str(d) for d in dirs]
    settings["tasks_digest"] = ident["tasks"] = tasks_digest(dirs)
    return settings, ident, []
