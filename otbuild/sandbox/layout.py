"""Task -> trial root: where the task's files live inside the sandbox.

The trial root mirrors the sandbox's private filesystem: `root/app` is `/app`, `root/tmp` is
`/tmp`, `root/root` is `$HOME`, `root/logs/{agent,verifier}` are `/logs/...`, `root/tests` and
`root/solution` appear only when asked for. Environment files are placed as the Dockerfile's
COPY/WORKDIR lines say (Harbor convention), relative to the build context `environment/`.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from otbuild.sandbox.errors import SandboxError
from otbuild.tasks.taskdir import DOCKERFILE, TaskDir

ENV_PREFIX = "environment/"
DEFAULT_WORKDIR = "/app"
# Top-level sandbox dirs that come from the host (read-only) or the sandbox itself.
SYSTEM_TOPS = {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "proc", "dev", "sys"}
# Private writable dirs every trial has (beside the task's own COPY targets).
BASE_DIRS = ("tmp", "root", "logs/agent", "logs/verifier", "var/tmp")


class LayoutError(SandboxError, ValueError):
    """A task whose environment cannot be laid out in a local sandbox."""


@dataclass
class Layout:
    """What the Dockerfile asks for: the working dir, env vars, files by sandbox path."""

    workdir: str = DEFAULT_WORKDIR
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, tuple[bytes, bool]] = field(default_factory=dict)  # abs path -> (data, exec)

    def tops(self) -> set[str]:
        """Top-level sandbox dirs the trial owns (bound read-write)."""
        paths = [self.workdir, *self.files, *(f"/{d}" for d in BASE_DIRS)]
        return {PurePosixPath(p).parts[1] for p in paths}


def plan(task: TaskDir) -> Layout:
    """Read `environment/Dockerfile` (WORKDIR, COPY, ENV); without one, the environment
    files go to /app."""
    context = {
        rel[len(ENV_PREFIX):]: (f.data, f.executable)
        for rel, f in task.files.items()
        if rel.startswith(ENV_PREFIX)
    }
    layout = Layout()
    text = task.text(DOCKERFILE)
    if text is None:
        for rel, entry in context.items():
            layout.files[f"{DEFAULT_WORKDIR}/{rel}"] = entry
    else:
        _apply_dockerfile(layout, text, context)
    for path in [layout.workdir, *layout.files]:
        top = PurePosixPath(path).parts[1] if path != "/" else ""
        if not top or top in SYSTEM_TOPS:
            raise LayoutError(f"task {task.name!r}: {path} is outside what a local sandbox can "
                              f"provide (not under /{'/, /'.join(sorted(SYSTEM_TOPS))})")
    return layout


def _apply_dockerfile(layout: Layout, text: str, context: dict[str, tuple[bytes, bool]]) -> None:
    layout.workdir = "/"
    for line in re.sub(r"\\[ \t]*\r?\n", " ", text).splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        op, _, rest = line.strip().partition(" ")
        op, rest = op.upper(), rest.strip()
        if op == "WORKDIR":
            layout.workdir = _abs(layout.workdir, rest)
        elif op == "ENV":
            layout.env.update(_env_pairs(rest))
        elif op in ("COPY", "ADD"):
            _copy(layout, rest, context)
    if layout.workdir == "/":
        layout.workdir = DEFAULT_WORKDIR


def _copy(layout: Layout, rest: str, context: dict[str, tuple[bytes, bool]]) -> None:
    args = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
    if any(a.startswith("--from") for a in args):
        raise LayoutError(f"COPY --from is not supported locally: {rest}")
    args = [a for a in args if not a.startswith("--")]
    if len(args) < 2:
        raise LayoutError(f"bad COPY line: {rest}")
    *sources, dest = args
    dest_abs = _abs(layout.workdir, dest)
    into_dir = dest.endswith("/") or len(sources) > 1
    for src in sources:
        src = PurePosixPath(src).as_posix().lstrip("/")
        src = "" if src in (".", "./") else src.removeprefix("./").rstrip("/")
        matched = False
        for rel, entry in context.items():
            if src == "" or _match(rel, src):  # a file (or a glob over files)
                inner = rel if src == "" else PurePosixPath(rel).name
                target = f"{dest_abs}/{inner}" if (into_dir or src == "" or _is_glob(src)) else dest_abs
            elif rel.startswith(src + "/") or (_is_glob(src) and _glob_dir(rel, src)):
                target = f"{dest_abs}/{_strip_dir(rel, src)}"  # a dir: its contents go to dest
            else:
                continue
            matched = True
            layout.files[str(PurePosixPath(target))] = entry
        if not matched:
            raise LayoutError(f"COPY source {src!r} is not in the task's environment/")


def _match(rel: str, pattern: str) -> bool:
    """Docker-style: `*` does not cross `/`."""
    same_depth = len(PurePosixPath(rel).parts) == len(PurePosixPath(pattern).parts)
    return same_depth and fnmatch.fnmatchcase(rel, pattern)


def _is_glob(s: str) -> bool:
    return any(c in s for c in "*?[")


def _glob_dir(rel: str, pattern: str) -> bool:
    parts = PurePosixPath(rel).parts
    n = len(PurePosixPath(pattern).parts)
    return len(parts) > n and fnmatch.fnmatchcase("/".join(parts[:n]), pattern)


def _strip_dir(rel: str, src: str) -> str:
    n = len(PurePosixPath(src).parts)
    return "/".join(PurePosixPath(rel).parts[n:])


def _abs(base: str, path: str) -> str:
    p = PurePosixPath(base) / path
    parts: list[str] = []
    for part in p.parts[1:]:
        if part == "..":
            if parts:
                parts.pop()
        elif part != ".":
            parts.append(part)
    return "/" + "/".join(parts)


def _env_pairs(rest: str) -> dict[str, str]:
    words = shlex.split(rest)
    if words and "=" not in words[0]:  # legacy `ENV KEY value with spaces`
        return {words[0]: rest.split(None, 1)[1].strip() if len(words) > 1 else ""}
    return dict(w.split("=", 1) for w in words if "=" in w)


def materialise(layout: Layout, root: Path) -> None:
    """Write the environment files and the base dirs into the trial root."""
    for d in BASE_DIRS:
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / layout.workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)
    for path, (data, executable) in sorted(layout.files.items()):
        _write(root / path.lstrip("/"), data, executable)


def write_subtree(task: TaskDir, prefix: str, dest: Path) -> None:
    """Copy the task's `prefix/` files (tests/, solution/) to `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    for rel, f in sorted(task.files.items()):
        if rel.startswith(prefix + "/"):
            _write(dest / rel[len(prefix) + 1:], f.data, f.executable)


def _write(path: Path, data: bytes, executable: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(0o755 if executable else 0o644)
