"""Task -> trial root: where the task's files live inside the sandbox.

The trial root mirrors the sandbox's private filesystem: `root/app` is `/app`, `root/tmp` is
`/tmp`, `root/root` is `$HOME`, `root/logs/{agent,verifier}` are `/logs/...`, `root/tests` and
`root/solution` appear only when asked for. Environment files are placed as the Dockerfile's
COPY/WORKDIR lines say (Harbor convention), relative to the build context `environment/`; what
the Dockerfile asks for that a layout cannot honour (`otbuild.tasks.dockerfile.local_problems`
that are not skippable: ADD, COPY --from, a system dir, ...) is a LayoutError.

Every file and dir laid out carries one fixed time (`file_time`), never the wall clock, so
`ls -l` in a trial prints the same bytes in every build (docs/reproducibility.md).
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from otbuild.sandbox import safefs
from otbuild.sandbox.errors import SandboxError
from otbuild.tasks.dockerfile import (
    Instruction,
    copy_mode_executable,
    env_pairs,
    local_problems,
    parse,
    resolve,
    system_path,
)
from otbuild.tasks.taskdir import DOCKERFILE, TaskDir

ENV_PREFIX = "environment/"
DEFAULT_WORKDIR = "/app"
# Private writable dirs every trial has (beside the task's own COPY targets).
BASE_DIRS = ("tmp", "root", "logs/agent", "logs/verifier", "var/tmp")
# The time of laid-out files without SOURCE_DATE_EPOCH: 2000-01-01T00:00:00Z. Task binaries
# carry no time of their own (their tar entries are packed with mtime 0: otbuild.tasks.taskdir).
FILE_TIME = 946684800


def file_time() -> int:
    """The mtime of every file and dir a trial's layout writes: SOURCE_DATE_EPOCH when set (the
    reproducible-builds convention), else FILE_TIME."""
    try:
        return int(os.environ["SOURCE_DATE_EPOCH"])
    except (KeyError, ValueError):
        return FILE_TIME


def stamp_tree(top: Path) -> None:
    """Give `top` and everything under it (links not followed) the fixed `file_time`."""
    safefs.stamp(top, "", file_time())


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
    files go to /app. LayoutError, naming the task, for what a local sandbox cannot lay out."""
    context = {
        rel[len(ENV_PREFIX) :]: (f.data, f.executable) for rel, f in task.files.items() if rel.startswith(ENV_PREFIX)
    }
    layout = Layout()
    text = task.text(DOCKERFILE)
    if text is None:
        for rel, entry in context.items():
            layout.files[f"{DEFAULT_WORKDIR}/{rel}"] = entry
    else:
        try:
            _apply_dockerfile(layout, text, context)
        except LayoutError as e:
            raise LayoutError(f"task {task.name!r}: {e}") from None
    for path in [layout.workdir, *layout.files]:
        if system_path(path):  # `COPY dir/ /` with dir/etc/... in the build context
            raise LayoutError(
                f"task {task.name!r}: {path} is where a local sandbox has the "
                "host's own dirs (/usr, /etc, ...) or the root"
            )
    return layout


def _apply_dockerfile(layout: Layout, text: str, context: dict[str, tuple[bytes, bool]]) -> None:
    instructions = parse(text)
    refused = [str(p) for p in local_problems(instructions) if not p.skippable]
    if refused:
        raise LayoutError(f"its Dockerfile asks for what a local sandbox cannot lay out: {'; '.join(refused)}")
    layout.workdir = "/"
    for ins in instructions:
        if ins.keyword == "WORKDIR":
            layout.workdir = resolve(layout.workdir, ins.value)
        elif ins.keyword == "ENV":
            layout.env.update(env_pairs(ins))
        elif ins.keyword == "COPY":
            _copy(layout, ins, context)
    if layout.workdir == "/":
        layout.workdir = DEFAULT_WORKDIR


def _copy(layout: Layout, ins: Instruction, context: dict[str, tuple[bytes, bool]]) -> None:
    *sources, dest = ins.args
    dest_abs = resolve(layout.workdir, dest)
    executable = copy_mode_executable(ins)
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
            data, exe = entry
            layout.files[str(PurePosixPath(target))] = (data, exe if executable is None else executable)
        if not matched:
            raise LayoutError(f"COPY source {src!r} ({ins.at()}) is not in the task's environment/")


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


def materialise(layout: Layout, root: Path) -> None:
    """Write the environment files and the base dirs into the trial root (the caller stamps the
    finished root: `stamp_tree`)."""
    for d in [*BASE_DIRS, layout.workdir]:
        with safefs.opened_dir(root, d, create=True):
            pass
    for path, (data, executable) in sorted(layout.files.items()):
        safefs.write_file(root, path, data, mode=file_mode(executable))


def write_subtree(task: TaskDir, prefix: str, root: Path, rel: str = "", owner: safefs.Owner = None) -> None:
    """Copy the task's `prefix/` files (tests/, solution/, a podman build context) to `root/rel`
    (`safefs.write_tree`: through no link the trial left), at the fixed time."""
    files = [
        (name[len(prefix) + 1 :], f.data, f.executable)
        for name, f in sorted(task.files.items())
        if name.startswith(prefix + "/")
    ]
    safefs.write_tree(root, rel, files, owner=owner, mtime=file_time())


def file_mode(executable: bool) -> int:
    return 0o755 if executable else 0o644
