"""A trial's writable space, capped at `Limits.storage_mb` (or the task's `storage_mb`).

Hard caps where the host allows them: as root, a bwrap/unshare trial root is a size-limited
tmpfs (writes past it fail with ENOSPC); podman gets `--storage-opt size=` where its storage
driver supports it. Everywhere, a watcher measures the trial's usage every POLL_SEC and, once
it reaches the cap, kills every process of the trial and marks it `disk_exceeded`: the trial
ends as a task failure with that reason. Without a hard cap (not root; podman on overlay over
ext4) the watcher alone bounds it, so a fast writer can overshoot by what it writes in POLL_SEC.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import shutil
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from otbuild.sandbox.procs import owner, owner_is_gone

log = logging.getLogger(__name__)

MB = 1024 * 1024
POLL_SEC = 0.5
SLACK_BYTES = 256 * 1024  # a tmpfs at its cap reports a few pages free
SCRATCH = "otbuild-trial"  # the tmpfs mounts' source name: SCRATCH:owner
MNT_DETACH = 2  # umount2(2)'s lazy unmount


def mount_scratch(root: Path, mb: int) -> bool:
    """Make `root` a tmpfs of `mb` MiB (as root only), named after this process so a kill -9
    leaves nothing for good (`remove_leaked_scratch`); True when mounted."""
    if os.geteuid() != 0:
        return False
    return (
        _libc().mount(f"{SCRATCH}:{owner()}".encode(), os.fsencode(root), b"tmpfs", 0, f"size={mb}m,mode=0755".encode())
        == 0
    )


@functools.cache
def _libc() -> ctypes.CDLL:
    """mount(2) and umount2(2) called directly: the `mount` and `umount` commands cost a process
    each (~3 ms) per trial."""
    return ctypes.CDLL(None, use_errno=True)


def remove_leaked_scratch() -> int:
    """Unmount the trial tmpfs mounts of processes that are gone (a killed build's); how many."""
    leaked = []
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        source, mountpoint = line.split()[:2]
        if source.startswith(SCRATCH + ":") and owner_is_gone(source[len(SCRATCH) + 1 :]):
            leaked.append(mountpoint.replace("\\040", " "))
    for mountpoint in leaked:
        unmount_scratch(Path(mountpoint))
    return len(leaked)


def unmount_scratch(root: Path, keep_files: bool = False) -> None:
    """Unmount the trial's tmpfs; `keep_files` copies its files to the host disk first, at the
    same path (a caller that keeps the root after close)."""
    kept = root.with_name(root.name + ".kept")
    if keep_files:
        try:
            shutil.copytree(root, kept, symlinks=True)
        except (OSError, shutil.Error) as e:
            log.warning("trial %s: its files could not all be kept: %s", root, e)
    _libc().umount2(os.fsencode(root), MNT_DETACH)  # `umount -l`
    if keep_files and kept.exists():
        root.rmdir()
        kept.rename(root)


@functools.cache
def _storage_opt_works(image: str) -> bool:
    r = subprocess.run(
        ["podman", "create", "--rm", "--storage-opt", "size=64m", image, "true"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if r.returncode == 0:
        subprocess.run(["podman", "rm", "-f", r.stdout.strip()], capture_output=True, check=False)
    return r.returncode == 0


def storage_opt(image: str, mb: int) -> list[str]:
    """podman's hard cap of the container's writable layer, where its storage driver has one
    (overlay over xfs with project quota, btrfs, zfs); else none (the watcher alone)."""
    return ["--storage-opt", f"size={mb}m"] if _storage_opt_works(image) else []


def mounted_usage(root: Path) -> int:
    """Bytes used on the filesystem mounted at `root`."""
    st = os.statvfs(root)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def tree_usage(*paths: Path) -> int:
    """Bytes allocated under `paths` (du: symlinks not followed, hard links counted once)."""
    seen, total = set(), 0
    todo = [str(p) for p in paths]
    while todo:
        try:
            entries = list(os.scandir(todo.pop()))
        except OSError:
            continue
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
            if stat.S_ISDIR(st.st_mode):
                todo.append(e.path)
    return total


class DiskWatch:
    """Calls `on_exceeded` once when `measure()` reaches `cap_bytes`; stopped by `stop()`."""

    def __init__(self, measure: Callable[[], int], cap_bytes: int, on_exceeded: Callable[[], None]):
        self.exceeded = False
        self._measure, self._cap, self._on_exceeded = measure, cap_bytes, on_exceeded
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="otbuild-disk-watch")
        self._thread.start()

    def _watch(self) -> None:
        pause = POLL_SEC
        while not self._stopped.wait(pause):
            start = time.monotonic()
            try:
                used = self._measure()
            except OSError:
                continue
            pause = max(POLL_SEC, 10 * (time.monotonic() - start))  # a big tree: at most 10% of a core
            if used >= self._cap - SLACK_BYTES:
                self.exceeded = True
                self._on_exceeded()
                return

    def stop(self) -> None:
        self._stopped.set()
