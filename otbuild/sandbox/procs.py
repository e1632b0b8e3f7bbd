"""Finding and killing a trial's processes on the host (/proc scanning)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable


def scan() -> dict[int, tuple[int, list[str]]]:
    """pid -> (ppid, argv) of every live host process we can see (zombies left out)."""
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or (ppid := _live_parent(int(entry.name))) is None:
            continue
        try:
            with open(f"{entry.path}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        out[int(entry.name)] = (ppid, [a.decode(errors="replace") for a in args if a])
    return out


def _live_parent(pid: int) -> int | None:
    """The parent of `pid` while it runs; None once it has exited (a zombie) or is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state, ppid = f.read().rsplit(b")", 1)[1].split()[:2]
    except (OSError, ValueError):
        return None
    return None if state in (b"Z", b"X") else int(ppid)


def descendants(tops: Iterable[int], table: dict[int, tuple[int, list[str]]]) -> set[int]:
    """`tops` and every process below them."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), list(tops)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def pids_with_env(entry: bytes, among: Iterable[int] | None = None) -> set[int]:
    """The processes (of `among`, default all) whose environment has `entry` (b"NAME=value")."""
    pids = among if among is not None else (int(e.name) for e in os.scandir("/proc") if e.name.isdigit())
    found = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if entry in f.read().split(b"\0"):
                    found.add(pid)
        except OSError:
            pass
    return found


def kill_until_gone(find: Callable[[], set[int]], timeout: float = 10.0) -> set[int]:
    """SIGKILL what `find` returns until it returns nothing and every process killed has
    exited (a SIGKILLed process lives on until the kernel has torn it down, and once its
    parent is gone `find` no longer reaches it), or until `timeout`; the survivors."""
    end = time.monotonic() + timeout
    killed: set[int] = set()
    while True:
        pids = find() - {os.getpid()}
        killed = {pid for pid in killed | pids if _live_parent(pid) is not None}
        if not killed or time.monotonic() > end:
            return killed
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)


def end_namespace(launcher: subprocess.Popen, timeout: float = 10.0) -> bool:
    """End a sandbox launcher whose child is the init of a pid namespace (bwrap; `unshare
    --fork`) and every process in that namespace, without scanning /proc: SIGKILL the init
    (the kernel then kills everything in its namespace, and the init exits only once all of it
    is gone), then wait for the launcher, which exits when its init has. True when the
    namespace is shown gone so; False when it cannot be (the launcher was killed before its
    init, or has no child yet, or did not exit in `timeout`): the caller scans instead."""
    if launcher.poll() is not None:  # ended on its own: after its init, so after its namespace
        return launcher.returncode >= 0
    try:
        with open(f"/proc/{launcher.pid}/task/{launcher.pid}/children") as f:
            inits = [int(p) for p in f.read().split()]
    except OSError:
        inits = []
    for pid in inits:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if not inits:
        launcher.kill()
    try:
        launcher.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        launcher.kill()
        return False
    return bool(inits)


def owner(pid: int | None = None) -> str:
    """`host:pid:start`: names a live process unambiguously (a reused pid starts later)."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{pid}:{_start_time(pid)}"


def owner_is_gone(label: str) -> bool:
    """True when `label` (an `owner()`) names a process of this host that no longer runs."""
    host, _, rest = label.partition(":")
    pid = rest.partition(":")[0]
    return host == socket.gethostname() and pid.isdigit() and owner(int(pid)) != label


def _start_time(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return "gone"
