"""Who the sandboxed processes are on the host.

Run as root, each trial gets its own unprivileged host uid (allocated with a lock file in
/run/otbuild/sandbox-uids, so concurrent trials on one machine never share one; a lock folder
or file otbuild did not make is refused: otbuild/rundir.py): processes drop to it inside the sandbox,
so RLIMIT_NPROC counts only the trial's processes (root is exempt from it), host files keep
their permissions, and every process of the trial can be found by uid. Run as a normal user,
the sandbox keeps that user's uid inside a user namespace (RLIMIT_NPROC then counts per
namespace and uid).
"""

from __future__ import annotations

import fcntl
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

from otbuild.rundir import host_dir, open_lock, private_dir
from otbuild.sandbox.errors import SandboxError

CLEAN = b"clean"  # a lock file's content when its last trial left no process behind
UID_BASE = 2_000_000
UID_RANGE = 100_000
LOCK_DIR: Path | None = None  # None: host_dir()/sandbox-uids


@dataclass
class Identity:
    uid: int
    gid: int
    privileged: bool  # host is root: drop to `uid` inside the sandbox
    _lock: int | None = field(default=None, repr=False)

    def drop(self, *, has_caps: bool) -> list[str]:
        """`setpriv ... --`: become the trial uid, without capabilities or new privileges.
        Empty when the sandbox already runs the command unprivileged (`has_caps` False)."""
        if not has_caps:
            return []
        ids = ["--reuid", str(self.uid), "--regid", str(self.gid), "--clear-groups"]
        return [
            "/usr/bin/setpriv",
            *(ids if self.privileged else []),
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
        ]

    def release(self, clean: bool = False) -> None:
        """Give the uid back; `clean`: none of its processes is left (the sandbox saw them all
        end), so the next trial to take it need not scan /proc for leftovers."""
        if self._lock is not None:
            if clean:
                os.pwrite(self._lock, CLEAN, 0)
            os.close(self._lock)
            self._lock = None


def acquire() -> Identity:
    """A fresh trial uid when root (held until `release`), else the current user."""
    if os.geteuid() != 0:
        return Identity(os.getuid(), os.getgid(), privileged=False)
    locks = private_dir(LOCK_DIR or host_dir() / "sandbox-uids")
    start = random.randrange(UID_RANGE)
    for i in range(UID_RANGE):
        uid = UID_BASE + (start + i) % UID_RANGE
        try:  # a uid never handed out before needs no check for leftover processes
            fd, fresh = open_lock(locks / str(uid), exclusive=True), True
        except FileExistsError:
            fd, fresh = open_lock(locks / str(uid)), False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        # a uid released without CLEAN (a crashed run's) may have processes left: not shared then
        if not fresh and os.pread(fd, len(CLEAN), 0) != CLEAN and _uid_in_use(uid):
            os.close(fd)
            continue
        os.ftruncate(fd, 0)  # in use: a crash from here on leaves it unclean
        return Identity(uid, uid, privileged=True, _lock=fd)
    raise SandboxError("no free sandbox uid")


def _uid_in_use(uid: int) -> bool:
    return bool(pids_of_uid(uid))


def pids_of_uid(uid: int) -> list[int]:
    """Live (not zombie) host pids whose real uid is `uid`."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"{entry.path}/status", "rb") as f:
                fields = dict(line.split(b":", 1) for line in f if b":" in line)
            if int(fields[b"Uid"].split()[0]) == uid and fields[b"State"].split()[0] != b"Z":
                pids.append(int(entry.name))
        except (OSError, ValueError, KeyError, IndexError):
            pass
    return pids
