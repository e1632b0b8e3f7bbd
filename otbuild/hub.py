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

from dataclasses import dataclass
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
    """The repo files a dataset section reads: its `files` globs, else the record files of its
    split (HF's layout: SPLIT-*.ext at any depth, or everything under SPLIT/), else all of them."""
    if files:
        return list(files)
    if split:
        return [p for ext in forms for p in (f"{split}-*{ext}", f"*/{split}-*{ext}", f"{split}/*{ext}")]
    return [f"*{ext}" for ext in forms]


def where(repo: str, revision: str) -> str:
    return f"hf://datasets/{repo}@{revision}"


def resolve(repo: str, revision: str, allow: list[str]) -> HubFiles:
    """The commit `revision` names and the sha256 of each file matching `allow` (fetched into
    the HF cache when online). Raises StageError naming the repo and revision when neither the
    Hub nor the cache has them, or when no file matches."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import filter_repo_objects

    try:
        folder = Path(snapshot_download(repo, repo_type=REPO_TYPE, revision=revision, allow_patterns=allow))
    except Exception as e:  # LocalEntryNotFound, RepositoryNotFound, RevisionNotFound, IncompleteSnapshot, ...
        raise StageError(f"{where(repo, revision)}: not in the Hugging Face cache {_cache_dir()}, and the Hub "
                         f"could not provide it ({type(e).__name__}: {_first_line(e)}; fetch it where there is a "
                         f"network: `hf download {repo} --repo-type dataset --revision {revision}`)") from e
    present = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    matched = list(filter_repo_objects(present, allow_patterns=allow))
    if not matched:
        raise StageError(f"{where(repo, revision)} (commit {folder.name}): no file matches {allow}")
    return HubFiles(repo, folder.name, {f: file_sha256(folder / f) for f in matched}, folder)


def planned_files(planned: dict, allow: list[str]) -> HubFiles:
    """The files a plan resolved (`HubFiles.planned()`), read again at its commit from the HF
    cache and checked against the plan's digest."""
    found = resolve(planned["repo"], planned["commit"], allow)
    if found.planned() != planned:
        raise StageError(f"{where(planned['repo'], planned['commit'])}: the files matching {allow} differ from "
                         f"those planned (sha256 {found.planned()['files_sha256']}, planned "
                         f"{planned['files_sha256']}): the cache changed since the plan; plan again")
    return found


def _cache_dir() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [""])[0]
