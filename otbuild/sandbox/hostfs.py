"""What the sandbox sees: host system dirs read-only, a few /etc entries, the trial's own dirs.

Nothing else of the host is visible: no /root, /home, /work, /tmp, /proc or /dev of the host,
and of /etc only what programs need (no shadow, no ssh keys, no credentials).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
# /etc entries programs need. passwd, group, hosts and hostname are generated per trial.
ETC_ALLOW = (
    "alternatives", "bash.bashrc", "ca-certificates", "ca-certificates.conf", "debian_version",
    "gai.conf", "host.conf", "inputrc", "ld.so.cache", "ld.so.conf", "ld.so.conf.d",
    "locale.alias", "localtime", "magic", "magic.mime", "mime.types", "nsswitch.conf",
    "os-release", "profile", "protocols", "python3", "services", "ssl", "terminfo", "timezone",
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
    """Host system dirs (read-only, symlinks kept as symlinks) and allowed /etc entries."""
    mounts = []
    for top in SYSTEM_DIRS:
        host = Path("/") / top
        if host.is_symlink():
            mounts.append(Mount("symlink", os.readlink(host), f"/{top}"))
        elif host.is_dir():
            mounts.append(Mount("ro", str(host), f"/{top}"))
    mounts.append(Mount("dir", "", "/etc"))
    for name in ETC_ALLOW:
        host = Path("/etc") / name
        if host.exists():  # follows symlinks: the bind shows the target's content
            mounts.append(Mount("ro", str(host), f"/etc/{name}"))
    return mounts


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
