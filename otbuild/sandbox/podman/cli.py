"""The podman CLI: whether it can run containers here, and one call of it (`ContainerError` when it fails)."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

from otbuild.sandbox.errors import SandboxError

log = logging.getLogger(__name__)


class ContainerError(SandboxError):
    """The trial's container could not be started or copied into."""


def available() -> str | None:
    """None when podman can run containers here, else why not."""
    if shutil.which("podman") is None:
        return "podman is not installed (scripts/podman-setup.sh installs and configures it)"
    try:
        r = subprocess.run(
            ["podman", "info", "--format", "{{.Host.OCIRuntime.Name}}"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "`podman info` did not answer within 120 s"
    if r.returncode != 0:
        return f"`podman info` failed: {_tail(r.stderr, 500)}"
    if os.geteuid() != 0 and not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        log.warning(
            "podman runs rootless on cgroup v1: --memory, --pids-limit and --cpus are "
            "NOT enforced (run as root, or on cgroup v2)"
        )
    return None


def _podman(
    *args: str, timeout: float = 120, check: bool = True, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    r = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=False, cwd=cwd)
    if check and r.returncode != 0:
        raise ContainerError(f"podman {args[0]} failed (exit {r.returncode}): {_tail(r.stderr, 2000)}")
    return r


def _tail(text: str, n: int) -> str:
    text = text.strip()
    return text if len(text) <= n else "..." + text[-n:]
