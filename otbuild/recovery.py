"""Recover by itself from a snakemake run that was killed (kill -9, a lost node, OOM).

A killed snakemake leaves `.snakemake/locks/` (the next run fails with LockException) and
`.snakemake/incomplete/` markers on the outputs of the jobs it was running (the next run
refuses them without --rerun-incomplete), even when those jobs, left running, finished.
The Snakefile calls `recover` before snakemake takes its lock:

- Locks are removed when no Snakemake process (not a wrapper naming it: timeout, time, srun)
  runs in this project on this host and the run that took them was started on this host
  (`locks/otbuild-owner.json`, beside snakemake's lock files and removed with them). Locks
  taken on another host are left, with the one command to run.
- An incomplete marker is removed when its file is provably complete: an artifact's file when
  the artifact has its provenance record (written last), a shard's parquet (written
  atomically). The rest are rerun (`rerun-incomplete` in profiles/default); stages resume.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import sys
from pathlib import Path

from otbuild.artifact import PROVENANCE
from otbuild.fsio import write_json

OWNER = "otbuild-owner.json"


def recover(root: Path) -> None:
    """Make a restart after a kill just work; print what was done."""
    state = Path(root) / ".snakemake"
    locks = list((state / "locks").glob("*.lock"))
    if "--nolock" in sys.argv or _live_snakemake(Path(root)):
        return  # a job of a run, or a live run: its locks are real (snakemake says so itself)
    if locks:
        owner = _read_owner(state / "locks" / OWNER)
        if owner.get("host", socket.gethostname()) != socket.gethostname():
            print(
                f"otbuild: {state / 'locks'} is held by a snakemake started on {owner['host']} "
                f"(pid {owner.get('pid')}); if it is no longer running there, run: snakemake --unlock",
                file=sys.stderr,
            )
            return
        shutil.rmtree(state / "locks", ignore_errors=True)
        print(
            f"otbuild: removed the locks of a snakemake run that is no longer running (pid {owner.get('pid', '?')})",
            file=sys.stderr,
        )
    kept = _clear_complete_markers(Path(root), state / "incomplete")
    if kept:
        print(f"otbuild: {kept} output(s) of killed jobs were complete and are kept", file=sys.stderr)
    write_json(state / "locks" / OWNER, {"host": socket.gethostname(), "pid": os.getpid()})


def _read_owner(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _live_snakemake(root: Path) -> list[int]:
    """Other snakemake processes on this host whose working directory is `root` (not
    wrappers around one, which outlive it or wrap this very run)."""
    live, me, root = [], os.getpid(), root.resolve()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == me:
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if not runs_snakemake(argv) or b"--nolock" in argv:
                continue
            if Path(os.readlink(proc / "cwd")) == root:
                live.append(int(proc.name))
        except OSError:
            continue  # gone, or not ours to look at
    return live


def runs_snakemake(argv: list[bytes]) -> bool:
    """Whether a command line is Snakemake's own process: Python running its console script
    (`snakemake ...`, which the kernel starts as `python .../snakemake ...`) or `python -m
    snakemake`. A wrapper that names it (timeout, /usr/bin/time, srun, a shell) is not."""
    prog = os.path.basename(argv[0]) if argv else b""
    if prog == b"snakemake":
        return True
    if not prog.startswith((b"python", b"pypy")):
        return False
    args = iter(argv[1:])
    for arg in args:
        if arg in (b"-X", b"-W", b"--check-hash-based-pycs"):
            next(args, None)  # an interpreter option with a value
        elif arg == b"-m":
            return next(args, None) == b"snakemake"
        elif not arg.startswith(b"-"):
            return os.path.basename(arg) == b"snakemake"
        elif arg in (b"-c", b"-"):
            return False  # a command or stdin, not the snakemake program
    return False


def _clear_complete_markers(root: Path, incomplete: Path) -> int:
    kept = 0
    for marker in incomplete.glob("*") if incomplete.is_dir() else ():
        try:
            key = base64.urlsafe_b64decode(marker.name).decode()
        except (ValueError, UnicodeDecodeError):
            continue  # snakemake's own bookkeeping (e.g. a migration flag), or a split long name
        if _complete(root, key):
            marker.unlink()
            kept += 1
    return kept


def _complete(root: Path, key: str) -> bool:
    """Files of an artifact dir are complete once its provenance record exists; a shard's
    parquet is written by an atomic rename, so it is complete once it exists."""
    parts = Path(key).parts
    if len(parts) < 4 or parts[0] != "artifacts" or not (root / key).is_file():
        return False
    if parts[3] == "shards":
        return key.endswith(".parquet")
    return (root.joinpath(*parts[:3]) / PROVENANCE).is_file()


def remove_dead_trial_containers() -> None:
    """Podman trial containers whose build was killed (kill -9 leaves them running `sleep
    infinity` with conmon and exec sessions), the working containers and intermediate images of
    its `podman build`s, and its trials' tmpfs roots: removed at the next start; say how many."""
    if "--nolock" in sys.argv:
        return  # a job of a live run
    from otbuild.sandbox.disk import remove_leaked_scratch
    from otbuild.sandbox.podman.container import remove_leaked_containers
    from otbuild.sandbox.podman.images import remove_leaked_builds

    removed = remove_leaked_containers()
    if removed:
        print(f"otbuild: removed {removed} trial container(s) of builds that are no longer running", file=sys.stderr)
    removed = remove_leaked_builds()
    if removed:
        print(
            f"otbuild: removed {removed} image-build working container(s) of builds that are no longer running "
            "(and their intermediate images)",
            file=sys.stderr,
        )
    unmounted = remove_leaked_scratch()
    if unmounted:
        print(f"otbuild: unmounted {unmounted} trial tmpfs of builds that are no longer running", file=sys.stderr)
