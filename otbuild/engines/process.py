"""A model server in a child process: started in its own process group, awaited until healthy,
and stopped with all its children: on close, on failure, at exit, on SIGTERM, and when the
process that started it dies by any means (kill -9 included: otbuild/engines/guard.py leads the
server's group). Each server gets a temporary dir of its own (TMPDIR), removed with it; one that
listens on a unix socket has it there (`uds`), out of other users' reach."""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from otbuild.engines.base import EngineError
from otbuild.progress import LOG_ENV

_LIVE: set[ServerProcess] = set()
_LIVE_LOCK = threading.Lock()
GUARD = Path(__file__).with_name("guard.py")


class ServerProcess:
    """`argv` run with stdout+stderr to `log_path`, under the guard (its process group ends with
    the process that started it). No `log_path`: beside the job's own log (`OTBUILD_LOG`, e.g.
    logs/eval/ID/0-of-2.vllm-serve.log), else a temporary file. `uds`: the unix socket the server
    listens on (its command line names it), in a folder of its own that only this user may enter
    (`private_socket()`), which is then its temporary dir; None: it listens on a TCP port."""

    def __init__(
        self,
        argv: list[str],
        *,
        name: str,
        log_path: str | Path | None = None,
        env: dict | None = None,
        uds: str | None = None,
    ):
        self.argv, self.name, self.env, self.uds = argv, name, env, uds
        slug = name.replace(" ", "-")
        if log_path is None and (job_log := os.environ.get(LOG_ENV)):
            log_path = Path(job_log).with_suffix(f".{slug}.log")
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix=f"{slug}-", suffix=".log")
            os.close(fd)
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen | None = None
        self.tmpdir: str | None = os.path.dirname(uds) if uds else None

    def start(self) -> ServerProcess:
        install_sigterm_cleanup()
        if shutil.which(self.argv[0], path=(self.env or os.environ).get("PATH")) is None:
            raise EngineError(f"{self.name}: cannot run {self.argv[0]!r}: no such executable")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.tmpdir = self.tmpdir or tempfile.mkdtemp(prefix=f"otbuild-{self.name.replace(' ', '-')}-")
        env = {**(os.environ if self.env is None else self.env), "TMPDIR": self.tmpdir}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", str(GUARD), str(os.getpid()), self.tmpdir, "--", *self.argv],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        with _LIVE_LOCK:
            _LIVE.add(self)
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def exit_code(self) -> int | None:
        """None while it runs (or before it started); its exit code once it ended."""
        return None if self.proc is None else self.proc.poll()

    def gone(self) -> str | None:
        """Why the server is not there any more (its exit code and log tail); None while it runs."""
        code = self.exit_code()
        if code is None:
            return None
        return f"{self.name}: the server exited with code {code}; log {self.log_path}, last lines:\n{self.log_tail()}"

    def log_tail(self, n: int = 30) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def _fail(self, why: str) -> EngineError:
        self.stop()
        return EngineError(f"{self.name}: {why}; log {self.log_path}, last lines:\n{self.log_tail()}")

    def _check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise self._fail(f"exited with code {self.proc.returncode} before it was ready")

    def wait_for_log(self, pattern: str, deadline: float) -> re.Match:
        """Wait until the log has a line matching `pattern` (e.g. the port it chose)."""
        rx = re.compile(pattern, re.MULTILINE)
        while True:
            m = rx.search(self.log_path.read_text(errors="replace"))
            if m:
                return m
            self._check_alive()
            if time.monotonic() > deadline:
                raise self._fail(f"no line matching {pattern!r} in time")
            time.sleep(0.05)

    def wait_healthy(self, url: str, deadline: float) -> None:
        """Poll `url` until it answers 200; a dead process or the deadline is an EngineError."""
        pause = 0.1
        with server_http(self.uds, timeout=5.0) as http:
            while True:
                self._check_alive()
                try:
                    if http.get(url).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise self._fail(f"not healthy at {url} in time")
                time.sleep(pause)
                pause = min(pause * 1.5, 2.0)

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the process group, SIGKILL what is left after `grace_s`; idempotent."""
        with _LIVE_LOCK:
            _LIVE.discard(self)
        proc = self.proc
        if proc is not None:
            if proc.poll() is None:
                _killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(grace_s)
                except subprocess.TimeoutExpired:
                    pass
            _killpg(proc.pid, signal.SIGKILL)  # children that outlived the server (or its crash), too
            proc.wait()
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def private_socket(name: str) -> str:
    """A unix socket's path in a new folder only this user may enter (`mkdtemp`: made exclusively,
    mode 0700): a server listening there is reached by no other user of the node, as a TCP port
    on 127.0.0.1 is by all of them. The folder becomes the server's temporary dir (`uds`)."""
    return os.path.join(tempfile.mkdtemp(prefix=f"otbuild-{name}-"), "api.sock")


def server_http(uds: str | None = None, **kw) -> httpx.Client:
    """An HTTP client for a server otbuild started, never through the environment's proxies: over
    its unix socket `uds` when it has one (the URL's host is then only the Host header)."""
    return httpx.Client(trust_env=False, transport=httpx.HTTPTransport(uds=uds) if uds else None, **kw)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def stop_all() -> None:
    """Stop every server still running (at exit, on SIGTERM)."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    for server in live:
        server.stop(grace_s=5.0)


_installed = False


def install_sigterm_cleanup() -> None:
    """On SIGTERM, stop our servers, then do what the previous handler did (exit by default).
    Only possible from the main thread; elsewhere the atexit hook is the fallback."""
    global _installed
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum, frame):
        stop_all()
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)
    _installed = True


atexit.register(stop_all)
