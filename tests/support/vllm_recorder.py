#!/usr/bin/env python3
"""A `vllm` for the live tests: the real one ($REAL_VLLM) behind a proxy on the port it was
asked for, recording every chat completion's request and response bodies as vLLM sent them
(JSON lines in $VLLM_RECORD), so a test can hold the traces against the server's own bytes.
The proxy exits with the server: otbuild's managed engine sees the same deaths through it.
Standard library only; run as `vllm_recorder.py serve MODEL ... --port P ...`."""

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(args: list[str]) -> None:
    at = args.index("--port") + 1
    port, inner = int(args[at]), free_port()
    args[at] = str(inner)
    server = subprocess.Popen([os.environ["REAL_VLLM"], *args])
    with open(os.environ["VLLM_RECORD"], "a") as record:
        serve(port, inner, record)
        sys.exit(server.wait())


def serve(port: int, inner: int, record) -> None:
    """The proxy on `port`, in a thread: every request to the server on `inner`, recorded."""
    lock = threading.Lock()

    class Proxy(BaseHTTPRequestHandler):
        def _forward(self, method: str) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) if method == "POST" else None
            conn = http.client.HTTPConnection("127.0.0.1", inner, timeout=600)
            try:
                conn.request(method, self.path, body=body, headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                data, status = r.read(), r.status
            except OSError:
                data, status = b'{"error": "the server behind the proxy is not there"}', 502
            finally:
                conn.close()
            if self.path == "/v1/chat/completions":
                with lock:
                    record.write(
                        json.dumps({"request": json.loads(body), "status": status, "response": data.decode()}) + "\n"
                    )
                    record.flush()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._forward("GET")

        def do_POST(self):
            self._forward("POST")

        def log_message(self, *_):
            pass

    proxy = ThreadingHTTPServer(("127.0.0.1", port), Proxy)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()


if __name__ == "__main__":
    main(sys.argv[1:])
