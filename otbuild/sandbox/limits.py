"""Per-trial resource limits and the `prlimit` prefix that applies them inside the sandbox."""

from __future__ import annotations

from dataclasses import dataclass

MB = 1024 * 1024


@dataclass(frozen=True)
class Limits:
    """Limits of one trial.

    `cpu_seconds`, `memory_mb` (address space), `file_size_mb` are per process (rlimits);
    `max_processes` counts the trial's processes (RLIMIT_NPROC of the trial's own uid or user
    namespace); `wall_seconds` bounds the whole trial (every process is killed when it runs
    out); `output_bytes` caps what the host reads from one command or terminal.
    """

    cpu_seconds: int = 600
    memory_mb: int = 4096
    file_size_mb: int = 512
    max_processes: int = 256
    wall_seconds: float = 900
    output_bytes: int = 10_000_000

    def prlimit(self) -> list[str]:
        """`prlimit ... --` setting soft and hard limits for the command that follows."""
        return [
            "/usr/bin/prlimit",
            f"--cpu={self.cpu_seconds}",
            f"--as={self.memory_mb * MB}",
            f"--fsize={self.file_size_mb * MB}",
            f"--nproc={self.max_processes}",
            "--core=0",
            "--",
        ]
