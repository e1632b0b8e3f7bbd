"""The command server that runs inside an otbuild sandbox for the Harbor environment.

It is started once per Harbor environment (one bwrap, one pid namespace) and stays up until
the environment stops, so what a command leaves running (a tmux server, a web server the
task asks for) is still there for the next command, as in a container. It reads JSON lines
on stdin and answers on stdout:

    {"id": 1, "cmd": "ls", "cwd": "/app", "env": {...}, "timeout": 10, "cap": 10000000}
        -> {"id": 1, "rc": 0, "stdout": "...", "stderr": "", "timed_out": false}
    {"kill": 1}      # end command 1 (its whole process group)

With `--forward PORT SOCKET` it also relays 127.0.0.1:PORT (the sandbox's own loopback) to the
unix socket SOCKET (a capture proxy's socket bound in): an agent that calls its model over HTTP
reaches the model that way, and nothing else.

Standard library only: it runs under whatever python3 the host provides (/usr is the host's).
This file is sent as `python3 -c SOURCE`; keep it self-contained.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

_out_lock = threading.Lock()
_procs: dict = {}  # request id -> its Popen
_procs_lock = threading.Lock()


def _send(obj):
    line = json.dumps(obj) + "\n"
    with _out_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def _read_capped(stream, cap, sink):
    data, total = bytearray(), 0
    while True:
        chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
        if not chunk:
            break
        total += len(chunk)
        room = cap - len(data)
        if room > 0:
            data += chunk[:room]
    sink.append((bytes(data), total))


def _killpg(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _run(req):
    rid = req["id"]
    env = dict(os.environ)
    env.update(req.get("env") or {})
    try:
        proc = subprocess.Popen(
            ["/bin/bash", "-c", req["cmd"]],
            cwd=req.get("cwd") or None,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as e:
        _send({"id": rid, "rc": 127, "stdout": "", "stderr": f"{e}\n", "timed_out": False})
        return
    with _procs_lock:
        _procs[rid] = proc
    cap = int(req.get("cap") or 10_000_000)
    outs, errs = [], []
    readers = [
        threading.Thread(target=_read_capped, args=(proc.stdout, cap, outs), daemon=True),
        threading.Thread(target=_read_capped, args=(proc.stderr, cap, errs), daemon=True),
    ]
    for t in readers:
        t.start()
    timeout = req.get("timeout")
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _killpg(proc)
        proc.wait()
    # The command is done; what it left in the background (its process group) may still
    # hold the pipes open: give the readers a moment, then stop waiting for them.
    deadline = time.monotonic() + 2.0
    for t in readers:
        t.join(max(0.0, deadline - time.monotonic()))
    with _procs_lock:
        _procs.pop(rid, None)

    def text(parts):
        if not parts:
            return ""
        data, total = parts[0]
        s = data.decode("utf-8", errors="replace")
        if total > len(data):
            s += f"\n[output truncated at {len(data)} of {total} bytes]\n"
        return s

    _send(
        {
            "id": rid,
            "rc": proc.returncode if proc.returncode is not None else -9,
            "stdout": text(outs),
            "stderr": text(errs),
            "timed_out": timed_out,
        }
    )


def _pump(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass


def _relay(client, path):
    try:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        upstream.connect(path)
    except OSError:
        client.close()
        return
    back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    back.start()
    _pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def _forward(port, path):
    """Listen on 127.0.0.1:`port` (before the server says it is ready), relay to `path`."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(128)

    def accept():
        while True:
            client, _ = listener.accept()
            threading.Thread(target=_relay, args=(client, path), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if len(sys.argv) == 4 and sys.argv[1] == "--forward":
        _forward(int(sys.argv[2]), sys.argv[3])
    _send({"ready": True, "pid": os.getpid()})
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        req = json.loads(line)
        if "kill" in req:
            with _procs_lock:
                proc = _procs.get(req["kill"])
            if proc is not None:
                _killpg(proc)
            continue
        threading.Thread(target=_run, args=(req,), daemon=True).start()


if __name__ == "__main__":
    main()
