"""Datasets on the Hugging Face Hub, through huggingface_hub and its local cache.

When a recipe is planned, a repo's `revision` (a branch, tag or commit) is resolved to a
commit and its matching files are fetched into the HF cache (`snapshot_download`); offline
(`HF_HUB_OFFLINE=1`, or no connection) the library resolves the revision from the cache's
`refs/` instead. The commit and every file's sha256 go into the content id, so a moving `main`
is recorded, never trusted: a new commit with new files gives a new id. The build reads the
same files at that commit from the cache and checks their sha256 before using them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from otbuild.errors import StageError
from otbuild.hashing import file_sha256

REPO_TYPE = "dataset"


@dataclass(frozen=True)
class HubFiles:
    repo: str
    commit: str
    files: dict[str, str]  # repo path -> sha256, sorted by path

    def as_dict(self) -> dict:
        return {"repo": self.repo, "commit": self.commit, "files": self.files}


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
    return HubFiles(repo, folder.name, {f: file_sha256(folder / f) for f in matched})


def local_files(hub: dict) -> list[Path]:
    """The files a planned dataset read (`HubFiles.as_dict()`), from the HF cache at its commit,
    each checked against its planned sha256."""
    from huggingface_hub import hf_hub_download

    out = []
    for name, sha in hub["files"].items():
        try:
            path = Path(hf_hub_download(hub["repo"], name, repo_type=REPO_TYPE, revision=hub["commit"]))
        except Exception as e:
            raise StageError(f"{where(hub['repo'], hub['commit'])}: {name} is not in the Hugging Face cache "
                             f"({_cache_dir()}) and the Hub could not provide it: {type(e).__name__}: "
                             f"{_first_line(e)}") from e
        if (actual := file_sha256(path)) != sha:
            raise StageError(f"{where(hub['repo'], hub['commit'])}: {name} has sha256 {actual}, planned {sha}: "
                             "the cache changed since the plan; plan again")
        out.append(path)
    return out


def _cache_dir() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [""])[0]
