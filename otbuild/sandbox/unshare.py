"""util-linux `unshare` backend, for hosts without bubblewrap.

`unshare` makes the namespaces (a user namespace too when not root); a setup script inside
builds the same filesystem as bwrap on a tmpfs (binds, /proc, a minimal /dev), pivots into
it, detaches the host's root, and runs the command as a child of the script, which is pid 1
of the trial's pid namespace: when the command ends, or `unshare` is killed, the namespace
and every process in it go.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

from otbuild.sandbox.hostfs import SHM_BYTES, SHM_MODE
from otbuild.sandbox.spec import Invocation

STAGING = ".unshare-root"  # empty dir under the trial root that the new root is mounted on


def available() -> str | None:
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    try:
        proc = subprocess.run([*_unshare(), "true"], check=False, capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unshare does not run: {e}"
    if proc.returncode != 0:
        return f"unshare cannot create namespaces here: {proc.stderr.decode(errors='replace').strip()}"
    return None


def _unshare() -> list[str]:
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return [
        shutil.which("unshare") or "unshare",
        *user,
        "--mount",
        "--net",
        "--pid",
        "--ipc",
        "--uts",
        "--fork",
        "--kill-child=SIGKILL",
    ]


def argv(inv: Invocation) -> list[str]:
    staging = inv.root / STAGING
    q = shlex.quote
    n = q(str(staging))
    lines = [
        "set -e",
        "export PATH=/usr/sbin:/usr/bin:/sbin:/bin",
        ('ro() { mount -o remount,bind,ro "$1" 2>/dev/null || mount -o remount,bind,ro,nosuid,nodev "$1"; }'),
        f"mkdir -p {n}",
        f"mount -t tmpfs -o mode=0755 sandbox {n}",
    ]
    for m in inv.mounts:
        dest = q(f"{staging}{m.dest}")
        if m.kind == "symlink":
            lines.append(f"ln -s {q(m.src)} {dest}")
            continue
        if m.kind == "dir":
            lines.append(f"mkdir -p {dest}")
            continue
        if Path(m.src).is_dir():
            lines.append(f"mkdir -p {dest}")
        else:
            # a read-only /etc has it already
            lines.append(f"[ -e {dest} ] || {{ mkdir -p $(dirname {dest}) && touch {dest}; }}")
        lines.append(f"mount --rbind {q(m.src)} {dest}")
        if m.kind == "ro":
            lines.append(f"ro {dest}")
    lines += [
        f"mkdir -p {n}/proc {n}/dev && mount -t proc proc {n}/proc",
        f"mount -t tmpfs -o mode=0755,nosuid tmpfs {n}/dev",
        (f"for d in null zero full random urandom tty; do touch {n}/dev/$d; mount --bind /dev/$d {n}/dev/$d; done"),
        (
            f"mkdir {n}/dev/pts {n}/dev/shm && mount -t tmpfs"
            f" -o mode={SHM_MODE},size={SHM_BYTES},nosuid,nodev tmpfs {n}/dev/shm"
        ),
        (
            f"mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts {n}/dev/pts"
            f" && ln -s pts/ptmx {n}/dev/ptmx || true"
        ),
        (
            f"ln -s /proc/self/fd {n}/dev/fd; ln -s /proc/self/fd/0 {n}/dev/stdin;"
            f" ln -s /proc/self/fd/1 {n}/dev/stdout; ln -s /proc/self/fd/2 {n}/dev/stderr"
        ),
        "hostname sandbox 2>/dev/null || true",
        "if command -v ip >/dev/null; then ip link set lo up; fi",
        f"cd {n} && mkdir .oldroot && pivot_root . .oldroot && cd /",
        "umount -l /.oldroot && rmdir /.oldroot",
        "mount -o remount,bind,ro /",
        f"cd {q(inv.cwd)}",
        "set +e",
        # pid 1 stays this shell; the command is its child (not exec'd)
        " ".join(["env -i", *(q(f"{k}={v}") for k, v in inv.env.items()), *(q(a) for a in inv.prefix), '"$@"']),
        "exit $?",
    ]
    script = "\n".join(lines)
    return [*_unshare(), "/bin/sh", "-c", script, "sandbox", *inv.command]
