"""A Harbor task directory held in memory, and its gzip-tar form (HF `task_binary`).

The tar is deterministic (sorted entries, zero mtimes/owners, gzip mtime 0), so a task
dir -> parquet -> dir round trip is byte-identical and equal dirs give equal binaries.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import stat
import tarfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, cast

INSTRUCTION = "instruction.md"
TASK_TOML = "task.toml"
DOCKERFILE = "environment/Dockerfile"
SOLUTION = "solution/solve.sh"
TESTS = "tests/test.sh"
STEPS = "steps"  # a multi-step task's steps/<name>/ (instruction.md, tests/, solution/, workdir/)
WORKDIR = "workdir"  # in a step view: files staged into the agent's working dir before the step


class TaskFormatError(ValueError):
    """A task dir or task binary that cannot be used; the message says where and why."""


@dataclass(frozen=True)
class TaskFile:
    data: bytes
    executable: bool = False


@dataclass
class TaskDir:
    """`name` is Harbor's `path` column; `files` maps relative POSIX paths to contents."""

    name: str
    files: dict[str, TaskFile] = field(default_factory=dict)

    def add(self, relpath: str, data: bytes | str, executable: bool = False) -> None:
        if isinstance(data, str):
            data = data.encode()
        self.files[_safe_relpath(relpath)] = TaskFile(data, executable)

    def text(self, relpath: str) -> str | None:
        f = self.files.get(relpath)
        return None if f is None else f.data.decode("utf-8", errors="replace")

    @property
    def instruction(self) -> str:
        """instruction.md; a multi-step task's step instructions in order, a blank line apart."""
        if INSTRUCTION in self.files or not self.step_names():
            return self.text(INSTRUCTION) or ""
        return "\n\n".join(self.step(n).instruction for n in self.step_names())

    def step_names(self) -> list[str]:
        """The names of task.toml's `[[steps]]` in order (none for a single-step task or a
        task.toml that does not parse: otbuild/tasks/task_toml.py says why)."""
        try:
            steps = tomllib.loads(self.text(TASK_TOML) or "").get("steps")
        except tomllib.TOMLDecodeError:
            return []
        if not isinstance(steps, list):
            return []
        return [s["name"] for s in steps if isinstance(s, dict) and isinstance(s.get("name"), str)]

    def step(self, name: str) -> TaskDir:
        """Step `name` of a multi-step task as a task of its own, laid out as Harbor runs it:
        its instruction.md; its tests/ and solution/ where the step has them, else the task's
        shared ones; its files to stage under workdir/; everything else (task.toml,
        environment/) the task's."""
        own = f"{STEPS}/{name}/"
        view = TaskDir(
            self.name,
            {rel: f for rel, f in self.files.items() if not rel.startswith(f"{STEPS}/") and rel != INSTRUCTION},
        )
        for shared in ("tests", "solution"):
            if any(rel.startswith(f"{own}{shared}/") for rel in self.files):
                view.files = {rel: f for rel, f in view.files.items() if not rel.startswith(f"{shared}/")}
        for rel, f in self.files.items():
            if rel.startswith(own):
                view.files[rel[len(own) :]] = f
        return view

    # -- disk ---------------------------------------------------------------
    @classmethod
    def from_dir(cls, path: Path, name: str | None = None) -> TaskDir:
        path = Path(path)
        if not path.is_dir():
            raise TaskFormatError(f"{path}: not a directory")
        task = cls(name or path.name)
        for p in sorted(path.rglob("*")):
            if p.is_symlink():
                raise TaskFormatError(f"{p}: symlinks are not allowed in task dirs")
            if p.is_file():
                mode = p.stat().st_mode
                task.add(p.relative_to(path).as_posix(), p.read_bytes(), bool(mode & stat.S_IXUSR))
        return task

    def write(self, dest: Path) -> Path:
        dest = Path(dest)
        for rel, f in sorted(self.files.items()):
            p = dest / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(f.data)
            p.chmod(0o755 if f.executable else 0o644)
        return dest

    # -- gzip tar ---------------------------------------------------------------
    def pack(self) -> bytes:
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for rel in sorted(self.files):
                f = self.files[rel]
                info = tarfile.TarInfo(rel)
                info.size = len(f.data)
                info.mode = 0o755 if f.executable else 0o644
                info.mtime = 0
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                tar.addfile(info, io.BytesIO(f.data))
        return gzip.compress(raw.getvalue(), compresslevel=6, mtime=0)

    @classmethod
    def unpack(cls, name: str, data: bytes) -> TaskDir:
        """Read a task binary. Entries under a single top-level `name/` dir are accepted too."""
        task = cls(name)
        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
                members = [m for m in tar.getmembers() if m.isfile()]
                for m in tar.getmembers():
                    if m.issym() or m.islnk() or m.isdev():
                        raise TaskFormatError(f"task {name!r}: link or device entry {m.name!r}")
                prefix = _common_prefix(name, [m.name for m in members])
                for m in members:
                    fobj = cast(IO[bytes], tar.extractfile(m))  # a regular file member: never None
                    rel = m.name[len(prefix) :] if prefix else m.name
                    task.add(rel.removeprefix("./"), fobj.read(), bool(m.mode & stat.S_IXUSR))
        except (tarfile.TarError, OSError, EOFError) as e:
            raise TaskFormatError(f"task {name!r}: corrupt task_binary ({e})") from e
        return task

    # -- identity -----------------------------------------------------------
    def task_id(self) -> str:
        """Hash of normalised content: file paths, exec bits and bytes, with text line
        endings normalised and instruction whitespace collapsed."""
        h = hashlib.sha256()
        for rel in sorted(self.files):
            f = self.files[rel]
            data = f.data.replace(b"\r\n", b"\n")
            if rel == INSTRUCTION:
                data = normalise_instruction(data.decode("utf-8", "replace")).encode()
            h.update(f"{rel}\0{int(f.executable)}\0{len(data)}\0".encode())
            h.update(data)
        return h.hexdigest()[:16]


def normalise_instruction(text: str) -> str:
    """Whitespace-collapsed, lower-cased instruction: the key for dedup and task ids."""
    return " ".join(text.split()).lower()


def _safe_relpath(rel: str) -> str:
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise TaskFormatError(f"unsafe path in task: {rel!r}")
    return p.as_posix()


def _common_prefix(name: str, names: list[str]) -> str:
    for candidate in (f"{name}/", f"./{name}/"):
        if names and all(n.startswith(candidate) for n in names):
            return candidate
    return ""
