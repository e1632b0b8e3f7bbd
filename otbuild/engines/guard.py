"""The first process of a model server's process group: runs the server command as its child
and ends the whole group once the process that started it is gone, however it went (kill -9
of a job, or of its process group, included: the group a server runs in is its own, so that it
can be stopped as a whole, and nothing else would end it). Standard library only: run by path
(`python -I guard.py OWNER_PID TMPDIR -- ARGV...`, otbuild/engines/process.py).

While the owner lives, the guard waits for the server and exits with its code (128 + N for a
signal). A SIGTERM to the group (how ServerProcess stops a server) reaches the server too; the
guard outlives it to report its exit. Once the owner is gone: SIGTERM to the group, up to
GRACE_S for the server to end, the server's temporary dir removed, then SIGKILL to the group.
"""

import os
import shutil
import signal
import subprocess
import sys

POLL_S = 0.5
GRACE_S = 10.0


def main(argv: list[str]) -> int:
    owner, tmpdir, sep, *command = argv
    assert sep == "--" and command, "usage: guard.py OWNER_PID TMPDIR -- ARGV..."
    signal.signal(signal.SIGTERM, lambda *_: None)  # the group's stop: the server ends, we report it
    server = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    while True:
        try:
            rc = server.wait(POLL_S)
            return rc if rc >= 0 else 128 - rc
        except subprocess.TimeoutExpired:
            pass
        if os.getppid() != int(owner):  # the owner died: we were handed to another parent
            break
    os.killpg(0, signal.SIGTERM)
    try:
        server.wait(GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    shutil.rmtree(tmpdir, ignore_errors=True)
    os.killpg(0, signal.SIGKILL)  # what is left of the server's children, and the guard
    return 137


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
