"""Per-trial resource limits and the `prlimit` prefix that applies them inside the sandbox."""

from __future__ import annotations

import resource
from dataclasses import dataclass

MB = 1024 * 1024


@dataclass(frozen=True)
class Limits:
    """Limits of one trial.

    `cpu_seconds`, `memory_mb` (address space), `file_size_mb` are per process (rlimits);
    `max_processes` counts the trial's processes (RLIMIT_NPROC of the trial's own uid or user
    namespace); `wall_seconds` bounds the whole trial (every process is killed when it runs
    out); `output_bytes` caps what the host reads from one command or terminal. `network`:
    "task" gives a podman trial the network its task.toml allows (Harbor's default: the
    internet; `allow_internet = false` or `network_mode = "no-network"`: none), "none" never
    any (bwrap trials always have loopback only).
    """

    cpu_seconds: int = 600
    memory_mb: int = 4096
    file_size_mb: int = 512
    max_processes: int = 256
    wall_seconds: float = 900
    output_bytes: int = 10_000_000
    network: str = "task"
    pull: str = "missing"  # podman's policy for base images: never | missing | always
    storage_mb: int = 10240  # the trial's writable space (a task's own storage_mb wins): otbuild/sandbox/disk.py

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
