"""A trial's sandbox: its root on the host, commands run in it, and its end."""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, cast

from otbuild.sandbox import bwrap, none, safefs, unshare
from otbuild.sandbox.disk import MB, DiskWatch, mounted_usage, tree_usage, unmount_scratch
from otbuild.sandbox.errors import SandboxError, WallClockExceeded, task_setup
from otbuild.sandbox.hostfs import SYSTEM_DIRS, Mount, system_mounts, trial_mounts
from otbuild.sandbox.identity import Identity, pids_of_uid
from otbuild.sandbox.layout import Layout, file_mode, write_subtree
from otbuild.sandbox.output import read_bounded
from otbuild.sandbox.procs import descendants, end_namespace, kill_until_gone, pids_with_env, scan
from otbuild.sandbox.spec import Invocation
from otbuild.settings.limits import Limits
from otbuild.tasks.taskdir import WORKDIR, TaskDir

log = logging.getLogger(__name__)

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LAUNCHERS = {"bwrap", "unshare", "env"}  # argv[0] of the host process that starts a command


@dataclass(frozen=True)
class RunResult:
    exit_code: int  # the command's status; 128+N or -N when a signal ended it
    output: str  # stdout and stderr interleaved, at most `Limits.output_bytes` (+ a note)
    timed_out: bool  # the command's timeout or the trial's wall clock ran out
    truncated: bool  # the output passed the cap and the command was killed
    duration_s: float


class Sandbox:
    """A materialised trial. Use as a context manager; `close()` kills every process."""

    def __init__(
        self,
        task: TaskDir,
        root: Path,
        backend: str,
        limits: Limits,
        *,
        layout: Layout,
        identity: Identity,
        with_solution: bool,
        cleanup: bool,
        scratch: bool = False,
    ):
        self.task, self.root, self.backend, self.limits = task, root, backend, limits
        self.workdir = layout.workdir
        self._layout, self._identity = layout, identity
        self._scratch = scratch  # the root is a tmpfs of storage_mb (disk.mount_scratch)
        self._with_solution, self._cleanup = with_solution, cleanup
        self._system = system_mounts()
        self.binds: list[Mount] = []  # the caller's read-only binds of host paths (bind_ro)
        self.uid = inside_uid(backend, identity)
        self._start_clock()

    def _start_clock(self) -> None:
        """Per-trial state every backend shares, and the watchdog of the trial's wall clock."""
        self._tests_ready = False
        self._procs: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._handed_out = 0  # argv()s given to callers and not adopted: kill_all scans /proc
        self._survivors = False  # kill_all left processes behind (the uid is not released clean)
        self.deadline = time.monotonic() + self.limits.wall_seconds
        self._watchdog = threading.Timer(self.limits.wall_seconds, self.kill_all)
        self._watchdog.daemon = True
        self._watchdog.start()
        self._disk = DiskWatch(self._disk_used, self.limits.storage_mb * MB, self.kill_all)

    @contextmanager
    def clock_paused(self) -> Iterator[None]:
        """The trial's wall clock stopped while it waits for something outside it (its turn with
        the model) with nothing of its own under way: the watchdog goes on where it was after."""
        self._watchdog.cancel()
        left = self.deadline - time.monotonic()
        try:
            yield
        finally:
            self.deadline = time.monotonic() + left
            self._watchdog = threading.Timer(max(left, 0.0), self.kill_all)
            self._watchdog.daemon = True
            if not self._closed:
                self._watchdog.start()

    @property
    def disk_exceeded(self) -> bool:
        """The trial reached its storage_mb: every process was killed then."""
        return self._disk.exceeded

    def _disk_used(self) -> int:
        """Bytes the trial wrote (and its environment files): all of its root."""
        return mounted_usage(self.root) if self._scratch else tree_usage(self.root)

    # -- commands -------------------------------------------------------------------
    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The environment commands get: a clean base, the Dockerfile's ENV, then `extra`."""
        user = "root" if self.uid == 0 else "agent"
        base = {
            "PATH": PATH,
            "HOME": "/root",
            "USER": user,
            "LOGNAME": user,
            "SHELL": "/bin/bash",
            "TERM": "dumb",
            "LANG": "C.UTF-8",
            "TMPDIR": "/tmp",
        }
        if self.backend == "none":
            base["OTBUILD_SANDBOX_ROOT"] = str(self.root)  # how kill_all finds them
        return {**base, **self._layout.env, **(extra or {})}

    def argv(
        self,
        command: list[str],
        *,
        with_tests: bool = False,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        tty: bool = False,
    ) -> list[str]:
        """The host argv that runs `command` in the sandbox, limits applied. For callers
        that run the process themselves (`tty=True` keeps the controlling terminal, for
        `bash -i` under a pty). Its processes end when `command` ends, and at `kill_all`;
        `adopt` the process started from it, and kill_all needs no /proc scan."""
        self._handed_out += 1
        return self._argv(command, with_tests=with_tests, cwd=cwd, env=env, tty=tty)

    def _argv(
        self,
        command: list[str],
        *,
        with_tests: bool = False,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        tty: bool = False,
    ) -> list[str]:
        self._check_open()
        if with_tests:
            self._ensure_tests()
        return self._command_argv(command, with_tests=with_tests, cwd=cwd, env=env, tty=tty)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("sandbox is closed")
        if time.monotonic() >= self.deadline:
            raise WallClockExceeded(f"trial {self.root.name}: its wall clock ({self.limits.wall_seconds:g}s) ran out")

    def _command_argv(
        self, command: list[str], *, with_tests: bool, cwd: str | None, env: dict[str, str] | None, tty: bool
    ) -> list[str]:
        """The backend's host argv for one command (checks done)."""
        has_caps = self._identity.privileged or self.backend == "unshare"
        prefix = self.limits.prlimit() + ([] if self.backend == "none" else self._identity.drop(has_caps=has_caps))
        mounts = (
            self._system
            + self.binds
            + trial_mounts(self.root, self._layout.tops(), tests=with_tests, solution=self._with_solution)
        )
        inv = Invocation(
            self.root, mounts, cwd or self.workdir, self.env(env), prefix, list(command), tty, self._identity.privileged
        )
        if self.backend == "bwrap":
            return bwrap.argv(inv)
        if self.backend == "unshare":
            return unshare.argv(inv)
        return none.argv(inv, str(self.root / (cwd or self.workdir).lstrip("/")))

    def bind_ro(self, src: Path, dest: str) -> None:
        """Show the host's `src` (a trusted path: an agent's installed code, a model socket) at
        `dest` read-only in every command started from now on; `dest` outside the trial's own
        dirs and the system dirs. Not on the `none` backend (it has no mounts)."""
        if self.backend not in ("bwrap", "unshare"):
            raise SandboxError(f"sandbox backend {self.backend!r} cannot bind {src} at {dest}: use bwrap or unshare")
        taken = self._layout.tops() | {"tests", "solution", "etc", "proc", "dev", *SYSTEM_DIRS}
        if not dest.startswith("/") or dest.strip("/").split("/")[0] in taken:
            raise SandboxError(f"cannot bind at {dest}: the sandbox's own or the system's dirs are there")
        for parent in reversed(PurePosixPath(dest).parents[:-1]):  # 0755, as bwrap would make them 0700
            if not any(m.dest == str(parent) for m in self.binds):
                self.binds.append(Mount("dir", "", str(parent)))
        self.binds.append(Mount("ro", str(src), dest))

    def run(
        self,
        command: str | list[str],
        *,
        timeout: float,
        with_tests: bool = False,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> RunResult:
        """Run one command (a string goes to `bash -c`) to its end, the timeout, or the
        output cap; everything it started is gone when this returns."""
        if isinstance(command, str):
            command = ["/bin/bash", "-c", command]
        start = time.monotonic()
        if start >= self.deadline:
            return RunResult(-9, "[the trial's wall clock ran out]\n", True, False, 0.0)
        proc = self._spawn(self._argv(command, with_tests=with_tests, cwd=cwd, env=env))
        return self._wait(proc, start, timeout)

    def begin_step(self, step: TaskDir) -> None:
        """Move on to the next step of a multi-step task (`TaskDir.step`) in this same sandbox,
        as Harbor does in one environment: its tests/ and solution/ replace the last step's,
        the last verifier's logs go, and its workdir/ files are staged into the working dir;
        what the last step left stays. TaskSetupError when what it left is in the way."""
        self._check_open()
        self.task, self._tests_ready = step, False
        with task_setup(step.name, "staging the next step"):
            for sub in ("tests", "solution"):  # emptied, not removed: a /tests the image made is bound
                safefs.clear(self.root, sub)
            if self._with_solution:
                write_subtree(step, "solution", self.root, "solution")
            reset_verifier(self.root, self.owner)
            self._stage(step)

    @property
    def owner(self) -> safefs.Owner:
        """Who the trial's own files belong to: its uid (as root), else the host's user."""
        if self._identity.privileged and self.backend != "none":
            return self._identity.uid, self._identity.gid
        return None

    def _stage(self, step: TaskDir) -> None:
        """The step's workdir/ files written into the working dir, owned by the trial's uid."""
        for rel, f in sorted(step.files.items()):
            if rel.startswith(f"{WORKDIR}/"):
                safefs.write_file(
                    self.root,
                    f"{self.workdir}/{rel[len(WORKDIR) + 1 :]}",
                    f.data,
                    mode=file_mode(f.executable),
                    owner=self.owner,
                )

    def park(self, command: list[str], *, with_tests: bool = False, env: dict[str, str] | None = None) -> Parked | None:
        """Start `command`'s sandbox now, held before the command itself runs, until
        `Parked.run`: what starting a command costs (namespaces, mounts, the limits and uid
        prefix) is paid while something else runs (the harness parks the verifier while the
        agent works). Its tests (`with_tests`) are copied in and logs/verifier reset only when
        it runs. `kill_all(keep=...)` can leave it be; `close` ends it. None where a backend
        cannot hold one (podman, none): use `run`."""
        if self.backend not in ("bwrap", "unshare"):
            return None
        self._check_open()
        if with_tests:
            with safefs.opened_dir(self.root, "tests", create=True):  # bound now, filled at run
                pass
        held = ["/bin/sh", "-c", 'read -r _ && exec "$@"', "parked", *command]
        proc = self._spawn(
            self._command_argv(held, with_tests=with_tests, cwd=None, env=env, tty=False), stdin=subprocess.PIPE
        )
        return Parked(self, proc, with_tests)

    def _spawn(self, args: list[str], stdin=subprocess.DEVNULL) -> subprocess.Popen:
        try:
            proc = subprocess.Popen(
                args,
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={"PATH": PATH},
                cwd=self.root,
            )
        except OSError as e:  # no fork, no pipe: the host is out of something
            raise SandboxError(f"trial {self.root.name}: could not start {args[0]}: {e}") from e
        with self._lock:
            self._procs.add(proc)
        return proc

    def _wait(self, proc: subprocess.Popen, start: float, timeout: float) -> RunResult:
        """run()'s end: `proc`'s output until it ends, the timeout, or the output cap."""
        deadline = min(start + timeout, self.deadline)
        stdout = cast(IO[bytes], proc.stdout)  # started with stdout=PIPE
        try:
            data, over, timed_out = read_bounded(stdout.fileno(), self.limits.output_bytes, deadline)
            if over or timed_out:
                self._kill_tree(proc)
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()) + 1)
            except subprocess.TimeoutExpired:
                timed_out = True
                self._kill_tree(proc)
                proc.wait()
        finally:
            stdout.close()
            with self._lock:
                self._procs.discard(proc)
            self._command_ended(proc)
        timed_out = timed_out or time.monotonic() >= self.deadline
        text = data.decode("utf-8", errors="replace")
        if over:
            text += f"\n[output truncated at {len(data)} bytes; command killed]\n"
        return RunResult(proc.returncode, text, timed_out, over, time.monotonic() - start)

    def adopt(self, proc: subprocess.Popen) -> None:
        """`proc` is the process the caller started from an `argv()` of this sandbox (its
        launcher): `kill_all` and `close` end it and every process of its pid namespace."""
        with self._lock:
            self._procs.add(proc)
            self._handed_out = max(0, self._handed_out - 1)

    # -- the end ------------------------------------------------------------------------
    def kill_all(self, keep: Parked | None = None) -> None:
        """SIGKILL every process of the trial, including those started from `argv()`, and
        return when none is left; but `keep`, a parked command that has not run (nothing of
        the trial has run in it). The launchers it knows (run()'s, adopted ones) each end
        with their pid namespace (`end_namespace`: no /proc scan); only when an argv() was
        handed out and not adopted, or without a pid namespace (`none`), or when a launcher
        cannot be shown to have taken its namespace with it, does it scan /proc."""
        kept = keep.proc if keep is not None and not keep.started else None
        with self._lock:
            known = [p for p in self._procs if p is not kept]
        scan_needed = self._handed_out > 0 or self.backend == "none"
        for proc in known:
            if end_namespace(proc):
                with self._lock:
                    self._procs.discard(proc)
            else:
                scan_needed = True
        if scan_needed:
            self._kill_found(kept)
            with self._lock:  # what the scan ended needs no second look
                self._procs -= {p for p in known if p.poll() is not None}
        self._handed_out = 0

    def _kill_found(self, kept: subprocess.Popen | None) -> None:
        """kill_all by /proc: the launchers found by the trial root in their argv, what is
        below them and (as root) every process of the trial uid, until none is left; but
        `kept` and what is below it."""
        root = str(self.root)
        marker = root + "/"

        def find() -> set[int]:
            table = scan()
            tops = {
                pid
                for pid, (_, args) in table.items()
                if args and os.path.basename(args[0]) in LAUNCHERS and any(marker in a for a in args)
            }
            with self._lock:
                tops |= {p.pid for p in self._procs if p.poll() is None}
            if kept is not None:
                tops.discard(kept.pid)
            found = descendants(tops, table) & table.keys()
            if self.backend == "none":
                found |= pids_with_env(f"OTBUILD_SANDBOX_ROOT={root}".encode())
            if self._identity.privileged and self.backend != "none":
                found |= set(pids_of_uid(self._identity.uid))
            return found - (descendants([kept.pid], table) if kept is not None else set())

        left = kill_until_gone(find)
        if left:
            log.error("sandbox %s: processes survived kill_all: %s", root, sorted(left))
            self._survivors = True

    def close(self) -> None:
        """Kill every process, release the trial uid; remove the root only if `cleanup`."""
        if self._closed:
            return
        self._watchdog.cancel()
        self._disk.stop()
        if self._handed_out or self._procs:  # run() leaves nothing behind; argv()'s may live on
            self.kill_all()
        self._closed = True
        self._identity.release(clean=not self._survivors)
        if self._scratch:
            unmount_scratch(self.root, keep_files=not self._cleanup)
        if self._cleanup:
            safefs.remove_path(self.root)

    def __enter__(self) -> Sandbox:  # noqa: PYI034
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------------
    def _command_ended(self, proc: subprocess.Popen) -> None:
        """After run()'s command: here its namespace took everything it started with it."""

    def _kill_tree(self, proc: subprocess.Popen) -> None:
        kill_until_gone(lambda: descendants([proc.pid], scan()) if proc.poll() is None else set())

    def _ensure_tests(self) -> None:
        """A fresh tests/ (only the task's: nothing the agent left in a /tests its image made
        writable) and an empty logs/verifier, so nothing the agent left there counts as a reward.
        tests/ stays the same folder: a parked verifier has it bound."""
        if self._tests_ready:
            return
        with task_setup(self.task.name, "putting its tests in place"):
            reset_verifier(self.root, self.owner)
            safefs.clear(self.root, "tests")
            write_subtree(self.task, "tests", self.root, "tests")
        self._tests_ready = True


class Parked:
    """A command whose sandbox is up, held before the command itself (`Sandbox.park`)."""

    def __init__(self, box: Sandbox, proc: subprocess.Popen, with_tests: bool):
        self.box, self.proc, self.with_tests = box, proc, with_tests
        self.started = False

    def run(self, timeout: float) -> RunResult:
        """Let the command run, as `Sandbox.run` would have started it now."""
        box, start = self.box, time.monotonic()
        self.started = True
        if start >= box.deadline or box._closed:
            box.kill_all()
            return RunResult(-9, "[the trial's wall clock ran out]\n", True, False, 0.0)
        if self.with_tests:
            box._ensure_tests()
        try:
            stdin = cast(IO[bytes], self.proc.stdin)  # started with stdin=PIPE
            stdin.write(b"go\n")
            stdin.close()
        except BrokenPipeError:  # it ended meanwhile: _wait reports how
            pass
        return box._wait(self.proc, start, timeout)


def reset_verifier(root: Path, owner: safefs.Owner = None) -> None:
    """An empty `logs/verifier` of `owner`: whatever the agent put there, a link in its place
    included, is gone (never followed)."""
    safefs.clear(root, "logs/verifier", owner=owner)


def inside_uid(backend: str, identity: Identity) -> int:
    """The uid commands have inside the sandbox (0 for unshare in a user namespace)."""
    return 0 if backend == "unshare" and not identity.privileged else identity.uid
