"""What the sandbox sees: host system dirs read-only, a few /etc entries, the trial's own dirs.

Nothing else of the host is visible: no /root, /home, /work, /tmp, /proc or /dev of the host,
and of /etc only what programs need (no shadow, no ssh keys, no credentials).
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from otbuild.rundir import private_dir, runtime_dir

SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
# /etc entries programs need. passwd, group, hosts and hostname are generated per trial.
ETC_ALLOW = (
    "alternatives",
    "bash.bashrc",
    "ca-certificates",
    "ca-certificates.conf",
    "debian_version",
    "gai.conf",
    "host.conf",
    "inputrc",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "locale.alias",
    "localtime",
    "magic",
    "magic.mime",
    "mime.types",
    "nsswitch.conf",
    "os-release",
    "profile",
    "protocols",
    "python3",
    "services",
    "ssl",
    "terminfo",
    "timezone",
)
ETC_GENERATED = ("passwd", "group", "hosts", "hostname")
HOSTNAME = "sandbox"
# /dev/shm: a private tmpfs, writable by the trial's unprivileged uid (POSIX semaphores, e.g.
# Python multiprocessing), sticky like the host's, and as big as Docker gives a container.
SHM_MODE = "1777"
SHM_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Mount:
    """`kind`: "ro" / "rw" bind of host `src` at sandbox `dest`, "symlink" `dest` -> `src`,
    or "dir" (an empty dir `dest`, mode 0755)."""

    kind: str
    src: str
    dest: str


def system_mounts() -> list[Mount]:
    """Host system dirs (read-only, symlinks kept as symlinks) and allowed /etc entries: one
    read-only copy of them (`etc_view`), else a bind of each."""
    mounts = []
    for top in SYSTEM_DIRS:
        host = Path("/") / top
        if host.is_symlink():
            mounts.append(Mount("symlink", os.readlink(host), f"/{top}"))
        elif host.is_dir():
            mounts.append(Mount("ro", str(host), f"/{top}"))
    view = etc_view()
    if view is not None:
        return [*mounts, Mount("ro", str(view), "/etc")]
    mounts.append(Mount("dir", "", "/etc"))
    for name in ETC_ALLOW:
        host = Path("/etc") / name
        if host.exists():  # follows symlinks: the bind shows the target's content
            mounts.append(Mount("ro", str(host), f"/etc/{name}"))
    return mounts


@functools.cache
def etc_view() -> Path | None:
    """The allowed /etc entries copied into one folder (top-level symlinks followed, as a bind
    shows them; symlinks below kept; ssl/private left empty), with empty ETC_GENERATED files for
    the trial's own to be bound over: every command then binds one /etc, not ~25 entries (each
    bind is ~0.3 ms of mount work at every command's start). Made once per state of the host's
    entries (named by a hash of their names, sizes and times) under the temp dir and shared by
    the processes that see the same; a change to the host's /etc during a run is seen by the
    next process. None when it cannot be made (each entry is bound then). It lies in this user's
    runtime_dir() (otbuild/rundir.py): never in a folder someone else made."""
    entries = [Path("/etc") / name for name in ETC_ALLOW if (Path("/etc") / name).exists()]
    try:
        home = private_dir(runtime_dir() / "etc")
        view = home / _etc_state(entries)
        if view.is_dir():
            return view
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=home))
        for src in entries:
            _copy_entry(src, staging / src.name)
        for name in ETC_GENERATED:
            (staging / name).touch(0o644)
        staging.chmod(0o755)
        try:
            staging.rename(view)
        except OSError:  # another process made it first
            shutil.rmtree(staging, ignore_errors=True)
        return view if view.is_dir() else None
    except OSError:
        return None


def _etc_state(entries: list[Path]) -> str:
    h = hashlib.sha256()
    for src in entries:
        for dirpath, _, files in os.walk(src, followlinks=False) if src.is_dir() else [("", [], [str(src)])]:
            for path in [dirpath, *(os.path.join(dirpath, f) for f in files)] if dirpath else files:
                st = os.stat(path) if path == str(src) else os.lstat(path)
                h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_mode}\n".encode())
    return h.hexdigest()[:16]


def _copy_entry(src: Path, dest: Path) -> None:
    if not src.is_dir():
        shutil.copy2(src, dest)  # follows a symlink, as the bind of it did
        return
    shutil.copytree(
        src, dest, symlinks=True, ignore=lambda d, names: names if Path(d) == Path("/etc/ssl/private") else []
    )


def write_etc(root: Path, uid: int, gid: int) -> None:
    """The trial's own passwd/group/hosts/hostname under `root/etc` (no host users listed)."""
    etc = root / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    users = ["root:x:0:0:root:/root:/bin/bash"]
    groups = ["root:x:0:"]
    if uid != 0:
        users.append(f"agent:x:{uid}:{gid}:agent:/root:/bin/bash")
        groups.append(f"agent:x:{gid}:")
    users.append("nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin")
    groups.append("nogroup:x:65534:")
    files = {
        "passwd": users,
        "group": groups,
        "hosts": [f"127.0.0.1\tlocalhost {HOSTNAME}", "::1\tlocalhost ip6-localhost"],
        "hostname": [HOSTNAME],
    }
    for name, lines in files.items():
        (etc / name).write_text("\n".join(lines) + "\n")
        (etc / name).chmod(0o644)


def trial_mounts(root: Path, tops: set[str], *, tests: bool, solution: bool) -> list[Mount]:
    """The trial's private dirs (read-write), generated /etc files, and /tests, /solution
    (read-only) when asked for."""
    mounts = [Mount("rw", str(root / top), f"/{top}") for top in sorted(tops)]
    mounts += [Mount("ro", str(root / "etc" / name), f"/etc/{name}") for name in ETC_GENERATED]
    if tests:
        mounts.append(Mount("ro", str(root / "tests"), "/tests"))
    if solution:
        mounts.append(Mount("ro", str(root / "solution"), "/solution"))
    return mounts
