"""Datasets on the Hugging Face Hub, through huggingface_hub and its local cache.

When a recipe is planned, a repo's `revision` (a branch, tag or commit) is resolved to a
commit and its matching files are fetched into the HF cache (`snapshot_download`); offline
(`HF_HUB_OFFLINE=1`, or no connection) the library resolves the revision from the cache's
`refs/` instead. The commit and every file's sha256 go into the content id, so a moving `main`
is recorded, never trusted: a new commit with new files gives a new id. The build reads the
same files at that commit from the cache and checks their sha256 before using them; its
record lists them (stats `hub`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

from otbuild.errors import StageError
from otbuild.hashing import file_sha256, settings_hash

REPO_TYPE = "dataset"


@dataclass(frozen=True)
class HubFiles:
    repo: str
    commit: str
    files: dict[str, str]  # repo path -> sha256, sorted by path
    folder: Path  # the commit's snapshot in the HF cache

    def identity(self) -> dict:
        """What the content id holds: the commit and every file's sha256."""
        return {"repo": self.repo, "commit": self.commit, "files": self.files}

    def planned(self) -> dict:
        """What the stage is told (bounded, whatever the number of files): the commit and a
        digest of the files' sha256, which the build checks."""
        return {"repo": self.repo, "commit": self.commit, "files_sha256": settings_hash(self.files, 64)}

    @property
    def paths(self) -> list[Path]:
        return [self.folder / f for f in self.files]


def patterns(split: str | None, files: list[str] | None, forms: tuple[str, ...]) -> list[str]:
    """The repo files fetched for a dataset section: its `files` globs, else the card and every
    record file (`select` then keeps the split's, as `datasets` would)."""
    if files:
        return list(files)
    return ["README.md", *(f"*{ext}" for ext in forms)]


# How `datasets` finds a split when the card names no data files (datasets/data_files.py): a
# split's keywords, each between separators, in a directory name or a file name.
SPLIT_KEYWORDS = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "dev", "val"),
    "test": ("test", "testing", "eval", "evaluation"),
}
_SEP = "[-._ 0-9]"
_LAYOUTS = (  # tried in this order; the first that matches any split decides
    ("data/{kw}-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9]*.*",),
    ("**/{kw}/**", "**/{kw}" + _SEP + "*/**", "**/*" + _SEP + "{kw}/**", "**/*" + _SEP + "{kw}" + _SEP + "*/**"),
    ("**/{kw}" + _SEP + "*", "**/*" + _SEP + "{kw}" + _SEP + "*"),
)


def select(
    present: list[str], split: str | None, files: list[str] | None, forms: tuple[str, ...], card: str | None
) -> list[str]:
    """The record files of a split among a repo's files, as `datasets.load_dataset` picks them:
    `files` when given; else the card's `configs:` (the default config's `data_files` for the
    split); else the split's keyword in a sharded `data/SPLIT-NNNNN-of-NNNNN` name, then in a
    directory name, then in a file name (`train.jsonl`, `data/train.parquet`, `my_train-0.parquet`,
    `train/x.parquet`), all files being `train` when no name holds a split. No split: every record
    file (of the default config, when the card has one)."""
    records = [f for f in present if f.endswith(forms)]
    if files:
        return [f for f in present if any(fnmatch(f, g) for g in files)]
    config = _default_config(card)
    if config is not None:
        globs = _config_globs(config, split)
        return sorted({f for f in records if any(_glob(g).fullmatch(f) for g in globs)})
    if split is None:
        return records
    splits = {**{k: v for k, v in SPLIT_KEYWORDS.items()}, split: SPLIT_KEYWORDS.get(split, (split,))}
    for layout in _LAYOUTS:
        found = {
            s: [f for f in records if any(_glob(p.format(kw=kw)).fullmatch(f) for kw in kws for p in layout)]
            for s, kws in splits.items()
        }
        if any(found.values()):
            return found[split]
    return records if split == "train" else []  # no split in any name: all of it is train


def _default_config(card: str | None) -> dict | None:
    """The card's default data config (`default: true`, else named `default`, else the first)."""
    import yaml

    if not card or not card.startswith("---"):
        return None
    try:
        header = yaml.safe_load(card.split("---", 2)[1]) or {}
    except yaml.YAMLError:
        return None
    configs = [c for c in header.get("configs") or [] if isinstance(c, dict) and c.get("data_files")]
    if not configs:
        return None
    return next((c for c in configs if c.get("default")), None) or next(
        (c for c in configs if c.get("config_name") == "default"), configs[0]
    )


def _config_globs(config: dict, split: str | None) -> list[str]:
    """A config's data_files: a glob or list of them (the train split), or [{split, path}]."""
    data = config["data_files"]
    if isinstance(data, str | list) and not (isinstance(data, list) and data and isinstance(data[0], dict)):
        return ([data] if isinstance(data, str) else list(data)) if split in (None, "train") else []
    out = []
    for d in data:
        if split is None or d.get("split", "train") == split:
            out += [d["path"]] if isinstance(d["path"], str) else list(d["path"])
    return out


def _glob(pattern: str) -> re.Pattern:
    """A `datasets`/fsspec glob over repo paths: `**` spans directories, `*` and `?` do not."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[" and (j := pattern.find("]", i + 1)) > i:
            out, i = out + pattern[i : j + 1], j + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def where(repo: str, revision: str) -> str:
    return f"hf://datasets/{repo}@{revision}"


def resolve(repo: str, revision: str, allow: list[str], pick=None) -> HubFiles:
    """The commit `revision` names and the sha256 of each file matching `allow` (fetched into
    the HF cache when online), or of those `pick(files, card text)` keeps of them. Raises
    StageError naming the repo and revision when neither the Hub nor the cache has them, or when
    no file matches."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import filter_repo_objects

    try:
        folder = Path(snapshot_download(repo, repo_type=REPO_TYPE, revision=revision, allow_patterns=allow))
    except Exception as e:  # LocalEntryNotFound, RepositoryNotFound, RevisionNotFound, IncompleteSnapshot, ...
        raise StageError(
            f"{where(repo, revision)}: not in the Hugging Face cache {_cache_dir()}, and the Hub "
            f"could not provide it ({type(e).__name__}: {_first_line(e)}; fetch it where there is a "
            f"network: `hf download {repo} --repo-type dataset --revision {revision}`)"
        ) from e
    present = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    matched = list(filter_repo_objects(present, allow_patterns=allow))
    if pick is not None:
        card = folder / "README.md"
        matched = pick(matched, card.read_text(errors="replace") if card.is_file() else None)
    if not matched:
        raise StageError(f"{where(repo, revision)} (commit {folder.name}): no file matches {allow}")
    return HubFiles(repo, folder.name, {f: file_sha256(folder / f) for f in matched}, folder)


def planned_files(planned: dict, allow: list[str], pick=None) -> HubFiles:
    """The files a plan resolved (`HubFiles.planned()`), read again at its commit from the HF
    cache and checked against the plan's digest."""
    found = resolve(planned["repo"], planned["commit"], allow, pick)
    if found.planned() != planned:
        raise StageError(
            f"{where(planned['repo'], planned['commit'])}: the files matching {allow} differ from "
            f"those planned (sha256 {found.planned()['files_sha256']}, planned "
            f"{planned['files_sha256']}): the cache changed since the plan; plan again"
        )
    return found


def _cache_dir() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [""])[0]
