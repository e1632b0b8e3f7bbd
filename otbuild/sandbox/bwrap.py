"""bubblewrap backend: namespaces for mounts, pids, network (loopback only), ipc and uts."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

from otbuild.sandbox.hostfs import SHM_BYTES, SHM_MODE, Mount, system_mounts
from otbuild.sandbox.spec import Invocation

BWRAP = "bwrap"


def available() -> str | None:
    """None when bwrap works here, else why not."""
    path = shutil.which(BWRAP)
    if path is None:
        return "bwrap is not installed (apt-get install bubblewrap)"
    # the system dirs a trial binds, not all of /: a recursive bind of / fails now and then on a
    # host where other trials' tmpfs roots come and go ("Unable to apply mount flags"), and one
    # failed probe would send this whole process to the unshare backend
    try:
        proc = subprocess.run(
            [path, *_mount_args(system_mounts()), "--unshare-net", "--unshare-pid", *_userns(), "true"],
            check=False,
            capture_output=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bwrap does not run: {e}"
    if proc.returncode != 0:
        return f"bwrap cannot create namespaces here: {proc.stderr.decode(errors='replace').strip()}"
    return None


def _userns() -> list[str]:
    return [] if os.geteuid() == 0 else ["--unshare-user"]


@functools.cache
def _supports(flag: str) -> bool:
    proc = subprocess.run([BWRAP, "--help"], check=False, capture_output=True, text=True)
    return flag in proc.stdout


def _mount_args(mounts: list[Mount]) -> list[str]:
    a = []
    for m in mounts:
        if m.kind == "dir":
            a += ["--dir", m.dest]
            continue
        flag = {"ro": "--ro-bind", "rw": "--bind", "symlink": "--symlink"}[m.kind]
        a += [flag, m.src, m.dest]
    return a


def argv(inv: Invocation) -> list[str]:
    a = [
        shutil.which(BWRAP) or BWRAP,
        "--unshare-net",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--clearenv",
        "--hostname",
        "sandbox",
    ]
    if not inv.privileged:  # an unprivileged user needs a user namespace; no nested ones
        a += ["--unshare-user"] + (["--disable-userns"] if _supports("--disable-userns") else [])
    if not inv.tty:
        a.append("--new-session")
    a += _mount_args(inv.mounts)
    a += ["--proc", "/proc", "--dev", "/dev"]
    # bwrap's own /dev/shm is root's, 0755: a tmpfs the trial's uid can write instead
    size = ["--size", str(SHM_BYTES)] if _supports("--size") else []  # bwrap >= 0.8
    a += ["--perms", SHM_MODE, *size, "--tmpfs", "/dev/shm"]
    for key, value in inv.env.items():
        a += ["--setenv", key, value]
    return [*a, "--chdir", inv.cwd, "--", *inv.prefix, *inv.command]
