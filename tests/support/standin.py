"""A stand-in OpenAI-compatible endpoint on 127.0.0.1 (the tests' and bench/concurrency.py's
model): standard library only."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Scripted(ThreadingHTTPServer):
    """An OpenAI-like endpoint on 127.0.0.1 (a stand-in model for tests): answers POSTs from
    `script`, a list of (status, body) in order then the last one again, or a function of the
    request body returning (status, body); records requests and the most in flight at once.
    With `api_key`, as strict as OpenAI's API: a request whose Authorization header is not
    `Bearer KEY` gets its 401 (recorded, the script not consulted)."""

    daemon_threads = True

    def __init__(self, script: list[tuple[int, dict]], delay: float = 0.0, api_key: str | None = None):
        super().__init__(("127.0.0.1", 0), _ScriptedHandler)
        self.script, self.delay, self.api_key = script, delay, api_key
        self.requests: list[dict] = []
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _ScriptedHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else headers and body in two writes wait ~40 ms on delayed ACKs

    def do_POST(self):
        srv: Scripted = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with srv.lock:
            srv.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
            if srv.api_key is not None and self.headers.get("Authorization") != f"Bearer {srv.api_key}":
                return self._send(401, invalid_api_key(self.headers.get("Authorization")))
            if callable(srv.script):
                status, answer = srv.script(body)
            else:
                status, answer = srv.script[min(len(srv.requests), len(srv.script)) - 1]
            srv.in_flight += 1
            srv.max_in_flight = max(srv.max_in_flight, srv.in_flight)
        time.sleep(srv.delay)
        with srv.lock:
            srv.in_flight -= 1
        if status == 200 and body.get("stream") and answer.get("object") != "chat.completion.chunk":
            return self._stream(as_vllm(answer, body), body)
        self._send(status, as_vllm(answer, body) if status == 200 else answer)

    def _stream(self, answer: dict, body: dict) -> None:
        """The answer as vLLM streams it (server-sent events, chunked): a role chunk, one chunk a
        word (its token ids and log-probs with them when asked), the finish reason, the usage
        when `stream_options.include_usage`, then [DONE]."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for chunk in stream_chunks(answer, body):
            self._chunk(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _send(self, status: int, answer: dict) -> None:
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def invalid_api_key(authorization: str | None) -> dict:
    """OpenAI's 401 body for a wrong key (its message shows the key's last 4 characters)."""
    if not authorization:
        return {
            "error": {
                "message": "You didn't provide an API key. You need to provide your API key in an "
                "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        }
    key = authorization.removeprefix("Bearer ")
    return {
        "error": {
            "message": f"Incorrect API key provided: {key[:3]}*****{key[-4:]}. You can find your API "
            "key at https://platform.openai.com/account/api-keys.",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }


def chat_answer(text: str, completion_tokens: int = 0) -> dict:
    """An OpenAI chat completion body carrying `text`."""
    return {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": 10,
            "completion_tokens": completion_tokens or len(text.split()),
            "total_tokens": 10 + (completion_tokens or len(text.split())),
        },
    }


def token_ids(text: str) -> list[int]:
    """The stand-in's tokenizer: a token a word (its id from the word's bytes)."""
    return [sum(w.encode()) % 1000 for w in text.split(" ")] if text else []


def as_vllm(answer: dict, body: dict) -> dict:
    """A chat completion answer as vLLM gives it for this request: `prompt_token_ids` and each
    choice's `token_ids` with `return_token_ids`, each token's log-prob with `logprobs`."""
    if not isinstance(answer.get("choices"), list) or not (body.get("return_token_ids") or body.get("logprobs")):
        return answer
    out = dict(answer)
    prompt = " ".join(str(m.get("content") or "") for m in body.get("messages") or [])
    if body.get("return_token_ids"):
        out["prompt_token_ids"] = token_ids(prompt)
    choices = []
    for c in answer["choices"]:
        ids = token_ids(c["message"].get("content") or "")
        c = {**c}
        if body.get("return_token_ids"):
            c["token_ids"] = ids
        if body.get("logprobs"):
            c["logprobs"] = {"content": [{"token": f"token_id:{i}", "logprob": -i / 1000, "bytes": None} for i in ids]}
        choices.append(c)
    return {**out, "choices": choices}


def stream_chunks(answer: dict, body: dict) -> list[dict]:
    """vLLM's chunks of a (non-streamed) answer: see _ScriptedHandler._stream."""
    choice = answer["choices"][0]
    head = {"id": "chatcmpl-standin", "object": "chat.completion.chunk", "model": body.get("model")}
    first = {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
    if "prompt_token_ids" in answer:
        first["prompt_token_ids"] = answer["prompt_token_ids"]
    chunks = [first]
    reasoning = choice["message"].get("reasoning")
    if reasoning:
        chunks.append({**head, "choices": [{"index": 0, "delta": {"reasoning": reasoning}, "finish_reason": None}]})
    words = (choice["message"].get("content") or "").split(" ")
    ids, logprobs = choice.get("token_ids"), (choice.get("logprobs") or {}).get("content")
    for k, word in enumerate(words):
        delta = {"index": 0, "delta": {"content": word if k == 0 else " " + word}, "finish_reason": None}
        if ids is not None:
            delta["token_ids"] = ids[k : k + 1]
        if logprobs is not None:
            delta["logprobs"] = {"content": logprobs[k : k + 1]}
        chunks.append({**head, "choices": [delta]})
    chunks.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": choice.get("finish_reason")}]})
    if (body.get("stream_options") or {}).get("include_usage"):
        chunks.append({**head, "choices": [], "usage": answer.get("usage")})
    return chunks
