"""A persistent interactive terminal: `bash -i` under a pty, inside the trial's sandbox.

Keystrokes are typed as they are, except a lone key name (tmux's names: "C-c", "Enter",
"Escape", "Up", ...) which sends that key, as terminus-2 does through tmux. Reads return the
new output with terminal control sequences removed. The shell marks each prompt with an
invisible OSC sequence so a read can end as soon as a command has finished.
"""

from __future__ import annotations

import fcntl
import functools
import os
import pty
import re
import select
import shutil
import signal
import struct
import subprocess
import termios
import time

READY = b"\x1b]777;otbuild-ready\x07"
SETSID = shutil.which("setsid")  # util-linux: `setsid --ctty` makes the pty the controlling terminal


@functools.cache
def default_signals() -> list[str]:
    """A prefix that starts a command with SIGINT and SIGQUIT at their defaults (coreutils
    `env --default-signal`): a process ignoring them (started under nohup, or in the background
    of a script) passes the ignoring on to its children, and the agent's C-c would do nothing."""
    env = shutil.which("env")
    if env is None:
        return []
    probe = subprocess.run([env, "--default-signal=INT,QUIT", "true"], capture_output=True, check=False)
    return [env, "--default-signal=INT,QUIT"] if probe.returncode == 0 else []


SHELL_ENV = {
    "PS1": r"\u@sandbox:\w# \[\e]777;otbuild-ready\a\]",  # the marker ends every prompt
    "TERM": "dumb",
    "HISTFILE": "/dev/null",
}

KEYS = {
    "Enter": "\r",
    "C-m": "\r",
    "Escape": "\x1b",
    "Tab": "\t",
    "BSpace": "\x7f",
    "Space": " ",
    "Up": "\x1b[A",
    "Down": "\x1b[B",
    "Right": "\x1b[C",
    "Left": "\x1b[D",
    "Home": "\x1b[H",
    "End": "\x1b[F",
    "DC": "\x1b[3~",
    "PageUp": "\x1b[5~",
    "PageDown": "\x1b[6~",
}
KEYS.update({f"C-{c}": chr(ord(c) - 96) for c in "abcdefghijklnopqrstuvwxyz"})
KEYS.update({"C-[": "\x1b", "C-\\": "\x1c", "C-]": "\x1d", "C-@": "\x00", "^C": "\x03", "^D": "\x04"})

_CONTROL = re.compile(rb"\x1b\][^\x07]*\x07|\x1b\[[0-?]*[ -/]*[@-~]|\x1b[()][A-Za-z0-9]|\x1b[=>]")


def translate(keystrokes: str) -> bytes:
    key = keystrokes.strip()
    if key in KEYS:
        return KEYS[key].encode()
    return keystrokes.replace("\r\n", "\n").replace("\n", "\r").encode()


def clean(raw: bytes) -> str:
    text = _CONTROL.sub(b"", raw).decode("utf-8", "replace")
    text = text.replace("\r\n", "\n")
    return re.sub(r"[^\n]*\r(?!\n)", "", text)  # a carriage return overwrites its line


class Terminal:
    def __init__(self, argv: list[str], cols: int = 160, rows: int = 48, read_cap: int = 4_000_000):
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        # a session of its own with the pty as controlling terminal: job control and C-c work.
        # `setsid --ctty` does it after the exec: a preexec_fn would fork all of this process
        # (~15 ms for a big one) where Popen otherwise uses vfork.
        if SETSID:
            self.proc = subprocess.Popen(
                [*default_signals(), SETSID, "--ctty", *argv], stdin=slave, stdout=slave, stderr=slave, close_fds=True
            )
        else:  # pragma: no cover (util-linux is there wherever the sandbox runs)
            self.proc = subprocess.Popen(
                [*default_signals(), *argv],
                stdin=slave,
                stdout=slave,
                stderr=slave,
                close_fds=True,
                start_new_session=True,
                preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),  # noqa: PLW1509 - one ioctl, no locks
            )
        os.close(slave)
        self.fd = master
        self.read_cap = read_cap  # bytes kept per read; the rest is drained and dropped
        self.dropped = 0
        self.hung_up = False  # the pty's other end is closed: the shell (and all it started) is gone

    def send(self, keystrokes: str) -> None:
        os.write(self.fd, translate(keystrokes))

    def read(self, seconds: float, until_ready: bool = True) -> str:
        """Output for up to `seconds`; with until_ready, stop early once the prompt is back.
        `seconds` 0: what is there now (one read), without waiting for more."""
        deadline = time.monotonic() + seconds
        buf = bytearray()
        while True:
            left = deadline - time.monotonic()
            if left <= 0 and (seconds > 0 or buf):
                break
            ready, _, _ = select.select([self.fd], [], [], max(left, 0.0))
            if not ready:
                break
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # the shell is gone
                chunk = b""
            if not chunk:
                self.hung_up = True
                break
            if len(buf) < self.read_cap:
                buf += chunk
            else:
                self.dropped += len(chunk)
            if until_ready and buf.endswith(READY):
                break
        return clean(bytes(buf))

    @property
    def alive(self) -> bool:
        """The shell is there: its pty not hung up (its process may take a moment longer to
        end: the sandbox's teardown) and its process running."""
        return not self.hung_up and self.proc.poll() is None

    def close(self) -> None:
        if self.proc.poll() is None:  # hung up or not: what the shell left running goes too
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:  # not yet its own group (setsid had not run)
                self.proc.kill()
        self.proc.wait()
        os.close(self.fd)
