"""The recording proxy: an OpenAI-compatible endpoint on 127.0.0.1 that forwards every request
to `upstream` (a hosted API, a vLLM or `otbuild serve` that otbuild started) and keeps each
chat completion call as a record (otbuild/capture/record.py).

- A call's scope (whose call it is: a trial of otbuild's harness, a Harbor job) is the
  `X-Otbuild-Scope` header (sent by otbuild's engine, never forwarded) or the base URL's
  `/s/SCOPE` prefix (`url(scope)`, for agents that only take a base URL); calls are numbered
  per scope in the order they arrive.
- It is no less strict than the server: the status, headers and body of every answer go back
  unchanged (a streamed one chunk by chunk as it comes, and assembled for the record); when
  nothing answers (no connection, a timeout), a 502 whose header names that error (otbuild's
  engine reads it as the transport error it is). Headers (the key among them) are forwarded,
  never recorded; a key in the body or the URL is masked in the record.
- `api_key`: the proxy holds the credential: whatever key a client sent is dropped and
  `Authorization: Bearer KEY` goes upstream (a client in a sandbox gets a dummy key only).
- `serve_unix(path, scope)`: a unix socket whose every call is `scope`'s, whatever the client
  says (a sandboxed agent's one way out: bound into its sandbox, it can reach nothing else and
  write into no other scope); `serve_control(path)`: a unix socket where the host side (Harbor's
  environment, in Harbor's process) opens and closes such sockets (otbuild/capture/control.py).
- `ask`: body fields a chat request gets set true unless it says otherwise, asking the server
  for what the record should hold (vLLM's `return_token_ids`, `logprobs`): for a vLLM that
  otbuild started.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import socketserver
import threading
import time
from collections import Counter, defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import httpx

from otbuild.capture import NO_ANSWER_HEADER, SCOPE_HEADER
from otbuild.capture.record import assemble, call_fields, lean, mask, masked, redact, sse_events
from otbuild.tls import makes_tls

# not forwarded either way: hop-by-hop, or set anew for the next hop
HOP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "accept-encoding",
        "content-encoding",
        SCOPE_HEADER.lower(),
    }
)
KEY_HEADERS = ("authorization", "api-key", "x-api-key", "proxy-authorization")
CAPTURED = ("/chat/completions", "/completions")  # the calls that are a model's answers


class CaptureProxy:
    """Start with `start()` (or `with`), point clients at `url(scope)`, read a scope's calls
    with `take(scope)`, stop with `close()`. `upstream` (the server's base URL, .../v1) may be
    set later and changed (a managed server restarted on another port)."""

    def __init__(
        self,
        upstream: str = "",
        *,
        uds: str | None = None,
        trust_env: bool = True,
        timeout: float = 3600.0,
        connections: int = 64,
        ask: tuple[str, ...] = (),
        api_key: str | None = None,
    ):
        self.upstream = upstream.rstrip("/")
        self.ask = ask
        self.api_key = api_key
        self._unix: dict[str, _Running] = {}  # socket path -> its server (serve_unix, serve_control)
        self._timeout = httpx.Timeout(timeout, connect=min(timeout, 30.0))
        self._limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        self._uds, self._trust_env = uds, trust_env
        self._clients: dict[bool, httpx.Client] = {}  # by whether it makes TLS connections (_client)
        self._calls: defaultdict[str, list[dict]] = defaultdict(list)
        self._next: defaultdict[str, int] = defaultdict(int)
        self._lock = threading.Condition()
        self._open: Counter = Counter()  # calls of each scope not yet answered in full
        self._server: _Running | None = None
        self.stats: Counter = Counter()  # calls, streamed, errors (non-200), no_answer

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    def start(self) -> CaptureProxy:
        handler = type("Handler", (_Handler,), {"proxy": self})
        self._server = _Running(_Server(("127.0.0.1", 0), handler), "capture-proxy")
        return self

    @property
    def base_url(self) -> str:
        assert self._server is not None, "start() the proxy first"
        return f"http://127.0.0.1:{self._server.server.server_address[1]}"

    def url(self, scope: str | None = None) -> str:
        """The base URL a client uses in place of the upstream's (its calls under `scope`)."""
        return f"{self.base_url}/s/{scope}" if scope else self.base_url

    def serve_unix(self, path: str | Path, scope: str) -> str:
        """Serve on a new unix socket at `path` (0666: put it in a private folder) whose calls
        are all `scope`'s: a client's scope header or `/s/` prefix is dropped, not followed."""
        if not scope:
            raise ValueError("a scoped socket needs a scope")
        fields = {"proxy": self, "fixed_scope": scope, "disable_nagle_algorithm": False}  # no TCP there
        handler = type("ScopedHandler", (_Handler,), fields)
        # any uid may connect (a sandbox's trial user): who can reach it is its folder's say
        # (a private one on the host) and the sandbox's bind of it
        return self._listen_unix(path, handler, mode=0o666)

    def serve_control(self, path: str | Path) -> str:
        """Serve the control socket at `path` (0600): `control_request(path, "open", scope,
        socket)` makes a scoped socket, `"close"` ends it (the client's own process)."""
        handler = type("ControlHandler", (_ControlHandler,), {"proxy": self})
        return self._listen_unix(path, handler)

    def close_unix(self, path: str | Path) -> None:
        with self._lock:
            server = self._unix.pop(str(path), None)
        if server is not None:
            server.stop()
            with contextlib.suppress(OSError):
                os.unlink(path)

    def _listen_unix(self, path: str | Path, handler: type, mode: int = 0o600) -> str:
        path = str(path)
        old = os.umask(0o177)  # the socket is 0600 from its first moment
        try:
            server = _UnixServer(path, handler)
        finally:
            os.umask(old)
        os.chmod(path, mode)
        with self._lock:
            self._unix[path] = _Running(server, f"capture-proxy {path}")
        return path

    def take(self, scope: str, wait: float = 10.0) -> list[dict]:
        """The calls recorded under `scope`, in call order, once none is still being answered
        (the client has its answer a moment before the record is made; one whose client gave
        up is waited for `wait` seconds at most); they are kept no longer."""
        with self._lock:
            self._lock.wait_for(lambda: self._open[scope] <= 0, timeout=wait)
            calls = self._calls.pop(scope, [])
        return sorted(calls, key=lambda c: c["call_idx"])

    def close(self) -> None:
        for path in list(self._unix):
            self.close_unix(path)
        if self._server is not None:
            self._server.stop()
            self._server = None
        for client in self._clients.values():
            client.close()

    def _client(self) -> httpx.Client:
        """The upstream's client, made at its first call (a managed server's URL is known by
        then); one for a plain-http upstream loads no CA store (otbuild/tls.py)."""
        tls = makes_tls(self.upstream, uds=self._uds, trust_env=self._trust_env)
        with self._lock:
            if tls not in self._clients:
                self._clients[tls] = httpx.Client(
                    timeout=self._timeout,
                    limits=self._limits,
                    trust_env=self._trust_env,
                    verify=tls,
                    transport=httpx.HTTPTransport(uds=self._uds, limits=self._limits) if self._uds else None,
                )
            return self._clients[tls]

    def _number(self, scope: str) -> int:
        with self._lock:
            n = self._next[scope]
            self._next[scope] = n + 1
            self._open[scope] += 1
            self.stats["calls"] += 1
            return n

    def _keep(self, record: dict) -> None:
        with self._lock:
            self._calls[record["scope"]].append(record)
            self._open[record["scope"]] -= 1
            self._lock.notify_all()
            self.stats["streamed"] += record["stream"]
            self.stats["errors"] += record["status"] != 200
            self.stats["no_answer"] += record["status"] == 0


class _Running:
    """A server accepting in a thread of its own until `stop()`, which returns at once
    (socketserver's serve_forever notices its shutdown only at its next poll, up to half a
    second later: a pause at every shard's end and every sandboxed trial's socket)."""

    def __init__(self, server: socketserver.TCPServer, name: str):
        self.server = server
        server.timeout = 0  # handle_request never waits: the loop below has seen a connection
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._accept, name=name, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(self.server, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            while True:
                ready = [key.fileobj for key, _ in sel.select()]
                if self._wake_r in ready:
                    return
                self.server.handle_request()

    def stop(self) -> None:
        os.write(self._wake_w, b"x")
        self._thread.join()
        os.close(self._wake_r)
        os.close(self._wake_w)
        self.server.server_close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # a shard's trials connect at once: none waits on a full backlog


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    request_queue_size = 128


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    proxy: CaptureProxy
    fixed_scope: str | None = None  # a scoped unix socket's: the client cannot name another

    def address_string(self) -> str:
        return self.client_address[0] if isinstance(self.client_address, tuple) else "unix"

    def log_message(self, *args):
        pass

    def do_POST(self):
        self._forward()

    def do_GET(self):
        self._forward()

    def do_PUT(self):
        self._forward()

    def do_DELETE(self):
        self._forward()

    def _forward(self) -> None:
        proxy = self.proxy
        scope, rest = _scope_of(self.path, self.headers.get(SCOPE_HEADER))
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.fixed_scope is not None:  # a sandboxed agent: model calls only, as its trial's
            scope = self.fixed_scope
            if not _model_call(self.command, urlsplit(rest).path):
                self._refuse(f"{self.command} {urlsplit(rest).path}: only model calls pass here")
                return
        headers = [(k, v) for k, v in self.headers.items() if k.lower() not in HOP_HEADERS]
        if proxy.api_key is not None:  # the proxy's key replaces whatever the client sent
            headers = [(k, v) for k, v in headers if k.lower() not in KEY_HEADERS]
            headers.append(("Authorization", f"Bearer {proxy.api_key}"))
        headers.append(("Accept-Encoding", "identity"))  # the record reads the body as it came
        path = urlsplit(rest).path
        captured = self.command == "POST" and path.endswith(CAPTURED)
        body: Any = None
        asked: dict = {}  # what the proxy asked the server for on the caller's behalf
        if captured:
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            if proxy.ask and isinstance(body, dict) and path.endswith("/chat/completions"):
                asked = {k: True for k in proxy.ask if k not in body}
                if asked:
                    body = {**asked, **body}
                    raw = json.dumps(body).encode()
        record = None
        if captured:
            record = {
                "scope": scope,
                "call_idx": proxy._number(scope),
                "path": path,
                "stream": bool(isinstance(body, dict) and body.get("stream")),
                "_secrets": _secrets(self.headers, rest) + ((proxy.api_key,) if proxy.api_key else ()),
                "_body": body if body is not None else raw.decode("utf-8", "replace"),
                "_asked_logprobs": "logprobs" in asked,
                "_start": time.monotonic(),
            }
        client = proxy._client()
        request = client.build_request(self.command, proxy.upstream + rest, content=raw, headers=headers)
        try:
            upstream = client.send(request, stream=True)
        except httpx.HTTPError as e:  # nothing answered: the client hears what its own request met
            why = f"{type(e).__name__}: {e}".rstrip(": ")
            self._no_answer(why)
            if record is not None:
                proxy._keep(_finish(record, 0, why.encode(), False))
            return
        try:
            status, data, delivered = self._relay(upstream)
        finally:
            upstream.close()
        if record is not None:
            proxy._keep(_finish(record, status, data, delivered))

    def _refuse(self, why: str) -> None:
        data = json.dumps({"error": {"message": why, "type": "forbidden"}}).encode()
        self.send_response_only(403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _no_answer(self, why: str) -> None:
        """A 502 that says the server did not answer, and why (otbuild's engine reads it as the
        transport error it is; another client sees a bad gateway, retried alike)."""
        data = json.dumps({"error": {"message": why, "type": "no_answer"}}).encode()
        try:
            self.send_response_only(502)
            self.send_header(NO_ANSWER_HEADER, why.encode("ascii", "replace").decode()[:500].replace("\n", " "))
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            self.close_connection = True

    def _relay(self, upstream: httpx.Response) -> tuple[int, bytes, bool]:
        """Send `upstream`'s answer back as it comes; returns its status, its body and whether
        all of it reached the client."""
        streamed = upstream.headers.get("content-type", "").startswith("text/event-stream")
        parts: list[bytes] = []
        delivered = True
        try:
            self.send_response_only(upstream.status_code, upstream.reason_phrase or None)
            for k, v in upstream.headers.multi_items():
                if k.lower() not in HOP_HEADERS:
                    self.send_header(k, v)
            if not streamed:
                data = upstream.read()
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return upstream.status_code, data, True
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for chunk in upstream.iter_raw():
                if chunk:
                    parts.append(chunk)
                    if delivered:
                        delivered = _write_chunk(self.wfile, chunk)
            if delivered:
                delivered = _write_chunk(self.wfile, b"")
        except httpx.HTTPError:  # the server broke off mid-answer: so does the proxy
            self.close_connection = True
            delivered = False
        except OSError:  # the client went away
            self.close_connection = True
            delivered = False
        return upstream.status_code, b"".join(parts), delivered


class _ControlHandler(BaseHTTPRequestHandler):
    """POST {"op": "open"|"close", "scope": S, "socket": PATH}: 200 {"socket": PATH}, or 400
    and why."""

    protocol_version = "HTTP/1.1"
    proxy: CaptureProxy

    def log_message(self, *args):
        pass

    def address_string(self) -> str:
        return "unix"

    def do_POST(self):
        try:
            req = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            path = str(req["socket"])
            if req["op"] == "open":
                answer = {"socket": self.proxy.serve_unix(path, str(req["scope"]))}
            elif req["op"] == "close":
                self.proxy.close_unix(path)
                answer = {"socket": path}
            else:
                raise ValueError(f"unknown op {req['op']!r}")
            status = 200
        except (ValueError, KeyError, TypeError, OSError) as e:
            status, answer = 400, {"error": f"{type(e).__name__}: {e}"}
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _write_chunk(out, data: bytes) -> bool:
    try:
        out.write(b"%x\r\n%s\r\n" % (len(data), data))
        out.flush()
        return True
    except OSError:
        return False


def _model_call(method: str, path: str) -> bool:
    """A request a sandboxed agent may make with the proxy's key: a chat or text completion, the
    model list; not the provider's other endpoints (files, batches, fine-tuning, ...)."""
    if method == "POST":
        return path.endswith(CAPTURED)
    return method == "GET" and path.rstrip("/").endswith("/models")


def _scope_of(path: str, header: str | None) -> tuple[str, str]:
    """(scope, the path upstream): `/s/SCOPE/rest` names its scope, else the header does."""
    if path.startswith("/s/"):
        scope, _, rest = path[3:].partition("/")
        return scope, "/" + rest
    return header or "", path


def _secrets(headers, url: str) -> tuple[str, ...]:
    """What the record must never hold: the key headers' values (and a Bearer's token alone),
    the URL query's values."""
    out = []
    for name in KEY_HEADERS:
        value = headers.get(name)
        if value:
            out += [value, value.split(" ", 1)[-1]]
    out += [v for _, v in parse_qsl(urlsplit(url).query) if len(v) >= 8]
    return tuple(sorted({s for s in out if s}, key=len, reverse=True))


def _finish(record: dict, status: int, data: bytes, delivered: bool) -> dict:
    """The call's record: its request and answer redacted, its columns read off the answer."""
    secrets = record.pop("_secrets")
    body = record.pop("_body")
    record["duration_s"] = round(time.monotonic() - record.pop("_start"), 6)
    record["status"] = status
    record["delivered"] = delivered
    answer: Any = None
    text = data.decode("utf-8", "replace")
    if status == 200 and record["stream"]:
        answer = assemble(sse_events(data))
    elif status:
        try:
            answer = json.loads(data)
        except ValueError:
            answer = None
    request = redact(body, secrets) if isinstance(body, dict) else mask(str(body), secrets)
    record["request"] = request if isinstance(request, str) else json.dumps(request)
    record["model"] = body.get("model") if isinstance(body, dict) else None
    kept = lean(answer, logprobs=record.pop("_asked_logprobs"))
    record["response"] = json.dumps(masked(kept, secrets)) if answer is not None else mask(text, secrets)
    record.update(call_fields(answer) if status == 200 else call_fields(None))
    return record
