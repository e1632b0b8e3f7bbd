"""Local sandbox in which agent commands and verifiers run (see docs/sandbox.md).

with open_sandbox(task, workdir) as box:
    box.run("bash /solution/solve.sh", timeout=60)        # or box.argv([...]) for a pty
    box.run("bash /tests/test.sh", timeout=60, with_tests=True)
    reward = read_reward(box.root)
"""

from __future__ import annotations

import functools
import logging
import os
import re
import tempfile
from dataclasses import replace
from pathlib import Path

from otbuild.sandbox import bwrap, safefs, unshare
from otbuild.sandbox.disk import mount_scratch, unmount_scratch
from otbuild.sandbox.errors import SandboxError, TaskSetupError
from otbuild.sandbox.hostfs import write_etc
from otbuild.sandbox.identity import Identity, acquire
from otbuild.sandbox.layout import Layout, LayoutError, materialise, plan, stamp_tree, write_subtree
from otbuild.sandbox.output import head_tail
from otbuild.sandbox.podman import cli as podman_cli
from otbuild.sandbox.podman.container import open_podman
from otbuild.sandbox.reward import read_reward
from otbuild.sandbox.sandbox import RunResult, Sandbox, inside_uid
from otbuild.settings.limits import BACKENDS, Limits
from otbuild.tasks.base_image import host_compatible
from otbuild.tasks.task_toml import runnable_locally, task_config
from otbuild.tasks.taskdir import TaskDir, TaskFormatError

__all__ = [
    "BACKENDS",
    "LayoutError",
    "Limits",
    "RunResult",
    "Sandbox",
    "SandboxError",
    "SandboxUnavailable",
    "TaskNotRunnableLocally",
    "TaskSetupError",
    "backend_for",
    "backend_problem",
    "head_tail",
    "needs_image",
    "open_sandbox",
    "read_reward",
    "resolve_backend",
]

log = logging.getLogger(__name__)


class SandboxUnavailable(SandboxError):
    """No isolating backend works on this host; the message says why."""


class TaskNotRunnableLocally(SandboxUnavailable):
    """The task needs its container image and podman cannot run it here; names the task."""


@functools.cache
def backend_problem(backend: str) -> str | None:
    """None when `backend` works here, else why not (checked once per process)."""
    if backend == "none":
        return None
    return {"bwrap": bwrap, "unshare": unshare, "podman": podman_cli}[backend].available()


def backend_for(task: TaskDir, backend: str) -> str:
    """`auto`: bwrap (or its fallback) for a task whose image a local sandbox can lay out
    (no RUN lines, no prebuilt image) on a host that can stand in for its `FROM` image
    (`host_compatible`), podman for the rest; other backends as they are.
    TaskNotRunnableLocally, naming the task, when podman is needed and cannot run."""
    if backend != "auto":
        return backend
    if not needs_image(task):
        return "bwrap"
    problem = backend_problem("podman")
    if problem is not None:
        raise TaskNotRunnableLocally(
            f"task {task.name!r} needs its container image (RUN lines, a "
            f"prebuilt image or a FROM the host is not) and podman cannot "
            f"run it here: {problem}"
        )
    return "podman"


def needs_image(task: TaskDir) -> bool:
    """Under `auto`: the task runs in its own image (podman), not on the host's filesystem."""
    return not (runnable_locally(task) and host_compatible(task))


def resolve_backend(backend: str) -> str:
    """`bwrap` falls back to `unshare` when bubblewrap cannot run; `none` warns."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown sandbox backend {backend!r} (one of {', '.join(BACKENDS)})")
    if backend == "none":
        log.warning(
            "sandbox backend 'none': commands run on the host WITHOUT isolation "
            "(no private filesystem, network or process namespace)"
        )
        return backend
    problem = backend_problem(backend)
    if problem is None:
        return backend
    if backend == "bwrap" and backend_problem("unshare") is None:
        log.warning("sandbox: %s; using the 'unshare' backend", problem)
        return "unshare"
    if backend == "podman":
        raise SandboxUnavailable(f"sandbox podman: {problem}")
    raise SandboxUnavailable(
        problem if backend == "unshare" else f"{problem}; unshare fallback: {backend_problem('unshare')}"
    )


DEFAULT_LIMITS = Limits()


def open_sandbox(
    task: TaskDir,
    workdir: Path,
    *,
    backend: str = "bwrap",
    limits: Limits = DEFAULT_LIMITS,
    with_solution: bool = False,
    cleanup: bool = False,
) -> Sandbox:
    """Materialise a new trial root under `workdir` and return its sandbox.

    The root holds the environment files where the Dockerfile puts them, private /tmp,
    $HOME (/root) and /logs; `solution/` only `with_solution` (the oracle); tests/ are copied
    in only when a command asks `with_tests`. `cleanup` removes the root at close. Raises
    SandboxError (LayoutError, SandboxUnavailable, ...) when the trial cannot be set up;
    TaskSetupError when the task's own files are in each other's way.
    """
    backend = resolve_backend(backend_for(task, backend))
    layout = None if backend == "podman" else plan(task)  # podman builds the image instead
    limits = task_limits(task, backend, limits)
    try:
        return _materialised(
            task, Path(workdir).resolve(), backend, limits, layout, with_solution=with_solution, cleanup=cleanup
        )
    except safefs.UnsafePathError as e:  # its layout puts a file where a folder goes, or the reverse
        raise TaskSetupError(f"task {task.name!r}: its files cannot be laid out: {e}") from e
    except OSError as e:  # a full disk, a workdir we may not write, ...
        raise SandboxError(f"task {task.name!r}: could not set up its trial under {workdir}: {e}") from e


def task_limits(task: TaskDir, backend: str, limits: Limits) -> Limits:
    """The recipe's limits, lowered where the task's own `[environment]` (Harbor's fields) asks
    for less: the recipe's are ceilings, which a task's ask raises only under `tasks_may_raise`.
    `storage_mb` is the trial's writable space; `memory_mb` podman's memory limit (a cgroup's, as
    Docker's under Harbor), while bwrap's is a per-process address-space rlimit, which a task's
    memory_mb does not lower (address space is not resident memory: a 1 GB task's runtimes may
    map more). A task.toml that cannot be read keeps the recipe's limits (the trial reports the
    task's problem elsewhere)."""
    try:
        env = task_config(task).environment
    except TaskFormatError:
        return limits

    def asked(value: int | None, ceiling: int, *, may_lower: bool = True) -> int:
        if not value or (value < ceiling and not may_lower):
            return ceiling
        return value if limits.tasks_may_raise else min(value, ceiling)

    memory = asked(env.memory_mb, limits.memory_mb, may_lower=backend == "podman")
    return replace(limits, storage_mb=asked(env.storage_mb, limits.storage_mb), memory_mb=max(memory, 64))


def _materialised(
    task: TaskDir,
    workdir: Path,
    backend: str,
    limits: Limits,
    layout: Layout | None,
    *,
    with_solution: bool,
    cleanup: bool,
) -> Sandbox:
    workdir.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", task.name)[:60] or "trial"
    root = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=workdir))
    if backend == "podman":
        try:
            return open_podman(task, root, limits, with_solution=with_solution, cleanup=cleanup)
        except BaseException:
            safefs.remove_path(root)
            raise
    identity = acquire() if backend != "none" else Identity(os.getuid(), os.getgid(), False)
    scratch = False
    try:
        scratch = mount_scratch(root, limits.storage_mb)
        assert layout is not None  # planned for every backend but podman
        materialise(layout, root)
        if with_solution:
            write_subtree(task, "solution", root, "solution")
        uid = inside_uid(backend, identity)
        write_etc(root, uid, identity.gid if uid else 0)
        os.chmod(root, 0o755)
        stamp_tree(root)  # no wall clock in what `ls -l` shows (docs/reproducibility.md)
        if identity.privileged:  # the trial's own dirs belong to the trial uid
            for top in layout.tops():
                _chown_tree(root / top, identity.uid, identity.gid)
        return Sandbox(
            task,
            root,
            backend,
            limits,
            layout=layout,
            identity=identity,
            with_solution=with_solution,
            cleanup=cleanup,
            scratch=scratch,
        )
    except BaseException:
        identity.release()
        if scratch:
            unmount_scratch(root)
        safefs.remove_path(root)
        raise


def _chown_tree(path: Path, uid: int, gid: int) -> None:
    os.chown(path, uid, gid, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)
