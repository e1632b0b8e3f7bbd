"""The client of a capture proxy's control socket (`CaptureProxy.serve_control`): open or close
a unix socket whose every call is one scope's. Standard library only: Harbor's environment
calls it from Harbor's own Python."""

from __future__ import annotations

import http.client
import json
import socket
from pathlib import Path

# where an agent inside otbuild's sandbox finds its model: 127.0.0.1 of the sandbox's own network,
# relayed to its trial's proxy socket (otbuild.harbor.environment)
SANDBOX_MODEL_PORT = 18080


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def control_request(control: str | Path, op: str, scope: str, sock: str | Path, timeout: float = 30.0) -> str:
    """Ask the proxy behind the control socket `control` to open (or close) a socket at `sock`
    whose calls are `scope`'s; returns its path. Standard library only (Harbor's process calls it)."""
    conn = _UnixConnection(str(control), timeout)
    try:
        conn.request("POST", "/", json.dumps({"op": op, "scope": scope, "socket": str(sock)}))
        reply = conn.getresponse()
        answer = json.loads(reply.read())
    finally:
        conn.close()
    if reply.status != 200:
        raise RuntimeError(f"capture proxy at {control}: {answer.get('error')}")
    return answer["socket"]
