"""Source adapter: a benchmark from Harbor's registry (terminal-bench@2.0,
swebench-verified@1.0, ...), read offline where Harbor downloaded its tasks.

Harbor's `registry.json` lists datasets: `name`, `version` and `tasks` (`name`, `git_url`,
`git_commit_id`, `path` in that repository; no `git_url`: a local path). `harbor datasets
download NAME@VERSION` writes each task dir in one of two layouts, both read here:
- cache (`--cache`, and what `harbor run -d` uses): `~/.cache/harbor/tasks/<key>/<dir>/`, where
  `<key>` is Harbor's shortuuid of the task's git id (`harbor_cache_key`) and `<dir>` the last
  part of the task's `path`;
- export (the default): `OUT/<dataset>/<dir>/` (`path: OUT/<dataset>`).
With no version, Harbor's choice is made: `head`, else the highest PEP 440 version, else the
last by name. The plan records the version and a digest of the task dirs (their content, not
where they lie); every task of the dataset must be there.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from otbuild.errors import StageError
from otbuild.hashing import content_digest
from otbuild.tasks.harbor_meta import harbor_record, load_dir
from otbuild.tasks.table import Quarantined, TaskRecord

HARBOR_TASK_CACHE = Path("~/.cache/harbor/tasks")
_BASE57 = "23456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def read(tasks: list[Path], digest: str | None, where: str) -> Iterator[TaskRecord | Quarantined]:
    """The task dirs of a dataset, after checking they still hold what was planned (`digest`;
    None: the plan found them nowhere, so they are what is there now)."""
    if digest is not None and tasks_digest(tasks) != digest:
        raise StageError(f"{where}: the downloaded task dirs changed since the plan; plan again")
    for t in tasks:
        task = load_dir(t)
        yield task if isinstance(task, Quarantined) else harbor_record(task)


def locate(dataset: str, registry: Path, root: Path) -> tuple[str, list[Path], list[str]]:
    """NAME@VERSION (resolved), the task dirs found under `root`, and the names of those not there."""
    name, _, version = dataset.partition("@")
    try:
        specs = [d for d in json.loads(registry.read_text()) if d.get("name") == name]
    except (OSError, ValueError, AttributeError) as e:
        raise StageError(f"{registry}: not a Harbor registry.json (a list of datasets): {e}") from e
    if not specs:
        raise StageError(f"{registry}: no dataset named {name!r}")
    version = version or _harbor_version([str(d.get("version")) for d in specs])
    spec = next((d for d in specs if str(d.get("version")) == version), None)
    if spec is None:
        raise StageError(
            f"{registry}: dataset {name!r} has no version {version!r} "
            f"(it has {', '.join(sorted(str(d.get('version')) for d in specs))})"
        )
    found, missing = [], []
    for task in spec.get("tasks") or []:
        dir_ = _task_dir(task, root, registry.parent)
        (found.append(dir_) if dir_ else missing.append(str(task.get("name") or task.get("path"))))
    return f"{name}@{version}", found, missing


def tasks_digest(dirs: list[Path]) -> str:
    """sha256 over each task dir's name and content digest, in the registry's order."""
    h = hashlib.sha256()
    for d in dirs:
        h.update(f"{d.name}\0{content_digest(d)}\n".encode())
    return h.hexdigest()


def harbor_cache_key(git_url: str, git_commit_id: str | None, path: str) -> str:
    """The folder Harbor's cache layout puts a git task in: shortuuid (uuid5, base57, 22 chars)
    of the task id's text, `git_url='...' git_commit_id='...' path=PosixPath('...')`."""
    text = f"git_url={git_url!r} git_commit_id={git_commit_id!r} path=PosixPath({str(PurePosixPath(path))!r})"
    namespace = uuid.NAMESPACE_URL if text.lower().startswith(("http://", "https://")) else uuid.NAMESPACE_DNS
    number, digits = uuid.uuid5(namespace, text).int, []
    while number:
        number, d = divmod(number, len(_BASE57))
        digits.append(_BASE57[d])
    return "".join(reversed(digits + [_BASE57[0]] * (22 - len(digits))))


def _task_dir(task: dict, root: Path, registry_dir: Path) -> Path | None:
    path = str(task.get("path") or "")
    if not task.get("git_url"):  # a local task: its own path
        local = registry_dir / Path(path).expanduser()
        return local if local.is_dir() else None
    leaf = PurePosixPath(path).name
    for candidate in (root / harbor_cache_key(task["git_url"], task.get("git_commit_id"), path) / leaf, root / leaf):
        if candidate.is_dir():
            return candidate
    return None


def _harbor_version(versions: list[str]) -> str:
    from packaging.version import InvalidVersion, Version

    if "head" in versions:
        return "head"
    parsed = []
    for v in versions:
        try:
            parsed.append((Version(v), v))
        except InvalidVersion:
            pass
    return max(parsed)[1] if parsed else max(versions)
