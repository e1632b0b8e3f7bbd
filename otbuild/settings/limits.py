"""Per-trial resource limits and the `prlimit` prefix that applies them inside the sandbox."""

from __future__ import annotations

import resource
from dataclasses import dataclass, field
from typing import Literal

MB = 1024 * 1024


# The local sandboxes a trial runs in (`sandbox:` of teacher, eval and rl.sandbox).
BACKENDS = ("bwrap", "unshare", "none", "podman", "auto")


def _setting(default, description: str = "", **bounds):
    """A limit a recipe sets (`limits:`): the recipe schema builds its section from these
    fields, their bounds and descriptions (otbuild/settings/trials.py: SandboxLimits)."""
    return field(default=default, metadata={"recipe": True, "description": description, **bounds})


@dataclass(frozen=True)
class Limits:
    """Limits of one trial (standard library only: Harbor's environment imports the sandbox in
    its own Python).

    `cpu_seconds`, `memory_mb` (address space), `file_size_mb` are per process (rlimits);
    `max_processes` counts the trial's processes (RLIMIT_NPROC of the trial's own uid or user
    namespace); `wall_seconds` bounds the whole trial (every process is killed when it runs
    out; the harness sets it from the trial's timeouts, a recipe does not); `build_network`
    is what a podman image build's RUN lines may reach; `output_bytes` caps
    what the host reads from one command or terminal. They are ceilings: a task's own
    `[environment]` may lower them, never raise them unless `tasks_may_raise`
    (otbuild/sandbox/__init__.py: task_limits).
    """

    cpu_seconds: int = _setting(600, ge=1)
    memory_mb: int = _setting(4096, ge=64)
    file_size_mb: int = _setting(512, ge=1)
    max_processes: int = _setting(256, ge=8)
    wall_seconds: float = 900
    output_bytes: int = _setting(10_000_000, ge=10_000)
    network: Literal["task", "none"] = _setting(
        "task",
        "podman: the network task.toml's policy allows each phase (Harbor's default: public; "
        '`network_mode = "no-network"` or `allow_internet = false`: none; an allowlist is refused, never '
        "widened), or none for every task (bwrap trials always have loopback only)",
    )
    pull: Literal["never", "missing", "always"] = _setting(
        "missing", "podman: fetch a task's base image from its registry when not present locally", execution_only=True
    )
    build_network: Literal["none", "public"] = "none"  # the recipe's trials' `build_network` (settings/trials.py)
    storage_mb: int = _setting(
        10240,
        "a trial's writable space, for tasks whose task.toml sets no storage_mb; "
        "reaching it ends the trial as a task failure (otbuild/sandbox/disk.py)",
        ge=16,
    )

    cpus: float | None = _setting(
        None,
        "podman: the most CPUs a trial gets (a task's [environment] cpus, "
        "default 1, may ask for fewer); default: the host's",
        gt=0,
    )
    tasks_may_raise: bool = _setting(
        False,
        "a task's [environment] memory_mb, storage_mb and cpus may ask for more "
        "than these limits (by default they are ceilings a task may only lower)",
    )

    def prlimit(self) -> list[str]:
        """`prlimit ... --`: soft = hard limit for the command that follows, each clamped to
        this process's hard limit (a non-root user cannot raise it)."""
        wanted = [
            ("cpu", resource.RLIMIT_CPU, self.cpu_seconds),
            ("as", resource.RLIMIT_AS, self.memory_mb * MB),
            ("fsize", resource.RLIMIT_FSIZE, self.file_size_mb * MB),
            ("nproc", resource.RLIMIT_NPROC, self.max_processes),
            ("core", resource.RLIMIT_CORE, 0),
        ]
        args = ["/usr/bin/prlimit"]
        for name, res, value in wanted:
            hard = resource.getrlimit(res)[1]
            if hard != resource.RLIM_INFINITY:
                value = min(value, hard)
            args.append(f"--{name}={value}")
        return [*args, "--"]
