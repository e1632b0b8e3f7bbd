"""One sandboxed command, described independently of the backend that runs it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from otbuild.sandbox.hostfs import Mount


@dataclass(frozen=True)
class Invocation:
    root: Path  # the trial root (also how kill_all recognises the trial's processes)
    mounts: list[Mount]  # host system dirs, then the trial's own
    cwd: str  # working dir inside the sandbox
    env: dict[str, str]  # the whole environment (the host's is never inherited)
    prefix: list[str]  # prlimit + setpriv, run inside the sandbox before the command
    command: list[str]
    tty: bool  # keep the controlling terminal (no new session) for `bash -i`
    privileged: bool  # the host process is root (no user namespace needed)
