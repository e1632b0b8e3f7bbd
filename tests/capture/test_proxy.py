"""The recording proxy on its own, between a client and a stand-in server: what the client
gets is the server's answer unchanged (streamed chunk by chunk), errors included; what the
record keeps is the call, assembled, without a secret."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import httpx
import pytest

from otbuild.capture import call_scope
from otbuild.capture.proxy import CaptureProxy
from otbuild.engines import LLM, EngineError, make_engine
from otbuild.engines.capture import capture_engine, harbor_proxy
from otbuild.engines.endpoint import EndpointError, FirstRequest
from tests.conftest import chat_answer
from tests.support.standin import token_ids

TOOLS = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object", "properties": {"key": {}}}}}]


@pytest.fixture
def proxy_to():
    proxies = []

    def start(upstream: str, **kw) -> CaptureProxy:
        proxies.append(CaptureProxy(upstream, trust_env=False, **kw).start())
        return proxies[-1]

    yield start
    for p in proxies:
        p.close()


def post(url: str, body: dict, **kw) -> httpx.Response:
    with httpx.Client(trust_env=False, timeout=30) as http:
        return http.post(f"{url}/chat/completions", json=body, **kw)


def test_an_answer_reaches_the_client_byte_for_byte_and_its_call_is_recorded(scripted, proxy_to):
    srv = scripted(lambda body: (200, chat_answer(f"answer to {len(body['messages'])}")))
    proxy = proxy_to(srv.base_url)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "temperature": 0.3}
    direct, through = post(srv.base_url, body), post(proxy.url("7-0"), body)
    assert through.status_code == 200 and through.content == direct.content
    assert through.headers["content-type"] == "application/json"
    post(proxy.url("7-0"), {**body, "messages": body["messages"] * 2})
    post(proxy.url(), body, headers={"X-Otbuild-Scope": "8-0"})  # otbuild's engine names its scope so
    assert "x-otbuild-scope" not in {k.lower() for k in srv.requests[-1]["headers"]}  # never forwarded
    first, second = proxy.take("7-0")
    assert (first["call_idx"], second["call_idx"]) == (0, 1) and proxy.take("7-0") == []
    assert json.loads(first["request"]) == body  # messages, tools (a property named key too), sampling
    assert first["content"] == "answer to 1" and second["content"] == "answer to 2"
    assert first["finish_reason"] == "stop" and first["prompt_tokens"] == 10 and first["completion_tokens"] == 3
    assert first["status"] == 200 and first["delivered"] and not first["stream"]
    assert json.loads(first["response"]) == direct.json()
    assert [c["call_idx"] for c in proxy.take("8-0")] == [0]


def test_a_streamed_answer_passes_chunk_by_chunk_and_is_assembled_with_its_tokens(scripted, proxy_to):
    text = "one two three four"
    srv = scripted(lambda body: (200, chat_answer(text)))
    proxy = proxy_to(srv.base_url)
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "count"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "logprobs": True,
    }
    direct, through = post(srv.base_url, body), post(proxy.url("s"), body)
    assert through.headers["content-type"].startswith("text/event-stream")
    assert (
        through.content == direct.content and through.content.count(b"data: ") == 8
    )  # role, 4 words, end, usage, DONE
    (call,) = proxy.take("s")
    assert call["stream"] and call["content"] == text and call["finish_reason"] == "stop"
    assert call["completion_token_ids"] == token_ids(text) and call["prompt_token_ids"] == token_ids("count")
    assert call["logprobs"] == [-i / 1000 for i in token_ids(text)]
    assert call["completion_tokens"] == 4
    assert json.loads(call["response"])["choices"][0]["message"] == {"role": "assistant", "content": text}


class _Slow(BaseHTTPRequestHandler):
    """An SSE answer whose second chunk waits until the client has read the first."""

    protocol_version = "HTTP/1.1"
    released = threading.Event()
    read_first: ClassVar[list[bool]] = []

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for k, word in enumerate(("early", " late")):
            if k:
                self.read_first.append(self.released.wait(10))
            data = b'data: {"choices": [{"index": 0, "delta": {"content": "%s"}}]}\n\n' % word.encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *_):
        pass


def test_a_stream_is_not_held_back_until_it_ends(proxy_to):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        proxy = proxy_to(f"http://127.0.0.1:{srv.server_address[1]}/v1")
        url = f"{proxy.url('s')}/chat/completions"
        with httpx.Client(trust_env=False, timeout=30) as http, http.stream("POST", url, json={"stream": True}) as r:
            lines = r.iter_lines()
            assert "early" in next(line for line in lines if line)
            _Slow.released.set()
            assert any("late" in line for line in lines)
        assert _Slow.read_first == [True]
        assert proxy.take("s")[0]["content"] == "early late"
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize(
    "status,answer,headers",
    [
        (400, {"error": {"message": "This model's maximum context length is 2048 tokens", "code": 400}}, {}),
        (429, {"error": {"message": "rate limited"}}, {"Retry-After": "3"}),
        (500, {"error": {"message": "engine core died"}}, {}),
    ],
)
def test_an_error_reaches_the_client_as_the_server_sent_it(scripted, proxy_to, status, answer, headers):
    srv = scripted([(status, answer)])
    proxy = proxy_to(srv.base_url)
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    direct, through = post(srv.base_url, body), post(proxy.url("e"), body)
    assert (through.status_code, through.content) == (direct.status_code, direct.content) == (status, direct.content)
    (call,) = proxy.take("e")
    assert call["status"] == status and json.loads(call["response"]) == answer and call["content"] is None


@pytest.mark.parametrize(
    ("engine", "managed", "ask_tokens", "logprobs", "asked"),
    [
        ("vllm", True, True, True, (True, True)),
        ("vllm", True, True, False, (True, None)),
        ("vllm", True, False, True, (None, None)),
        ("transformers", True, True, True, (None, None)),
        ("openai", False, True, True, (None, None)),
    ],
)
def test_harbors_agents_ask_a_vllm_otbuild_started_for_token_ids(
    scripted, engine, managed, ask_tokens, logprobs, asked
):
    """Harbor's agents' proxy asks for token ids and log-probs as otbuild's harness does: of a
    vLLM that otbuild started, unless the stage says not to (an eval's model under test), the
    log-probs unless the recipe says `capture_logprobs: false`."""
    from otbuild.settings.stages import RolloutSettings

    srv = scripted(lambda body: (200, chat_answer("ok")))
    base_url = None if managed else srv.base_url
    settings = RolloutSettings(engine=engine, model="m", base_url=base_url, capture_logprobs=logprobs)
    with harbor_proxy(srv.base_url, settings, managed=managed, ask_tokens=ask_tokens) as proxy:
        assert post(proxy.url("job"), {"model": "m", "messages": [{"role": "user", "content": "x"}]}).status_code == 200
    sent = srv.requests[-1]["body"]
    assert (sent.get("return_token_ids"), sent.get("logprobs")) == asked


def test_the_record_holds_token_ids_once_and_the_callers_log_probs_whole(scripted, proxy_to):
    """A record's token ids are in their columns only, not again in its `response` (a long
    prompt's ids would be most of every call's record); the log-probs the proxy asked for on
    the caller's behalf likewise; log-probs the caller asked for stay in `response` whole."""
    srv = scripted(lambda body: (200, chat_answer("one two")))
    proxy = proxy_to(srv.base_url, ask=("return_token_ids", "logprobs"))
    body = {"model": "m", "messages": [{"role": "user", "content": "count to two"}]}
    plain = post(proxy.url("a"), body).json()
    assert plain["prompt_token_ids"] == token_ids("count to two")  # the caller gets the answer unchanged
    (call,) = proxy.take("a")
    assert call["prompt_token_ids"] == token_ids("count to two") and call["completion_token_ids"] == token_ids(
        "one two"
    )
    assert call["logprobs"] == [-i / 1000 for i in token_ids("one two")]
    kept = json.loads(call["response"])
    assert "prompt_token_ids" not in kept and kept["choices"][0].keys() == {"index", "message", "finish_reason"}
    assert kept == {k: v for k, v in plain.items() if k != "prompt_token_ids"} | {
        "choices": [{k: v for k, v in plain["choices"][0].items() if k not in ("token_ids", "logprobs")}]
    }
    post(proxy.url("b"), {**body, "logprobs": True, "top_logprobs": 2})
    (call,) = proxy.take("b")
    assert json.loads(call["response"])["choices"][0]["logprobs"]["content"][0]["logprob"] == call["logprobs"][0]


def test_through_the_proxy_the_engine_fails_as_it_would_without_it(scripted):
    """otbuild's engine behind the proxy: a context overflow is still its own error, a server
    nothing answers is still a transport error (no status, its cause named), a 5xx is retried."""

    async def run(base_url: str, **kw):
        engine = make_engine(LLM(engine="openai", base_url=base_url, model="m", backoff_sec=0.01, **kw))
        proxy = capture_engine(engine, engine.settings)
        try:
            return await engine.complete([{"role": "user", "content": "x"}])
        finally:
            await engine.aclose()
            proxy.close()

    overflow = scripted([(400, {"error": {"message": "maximum context length is 10 tokens"}})])
    with pytest.raises(EngineError) as e:
        asyncio.run(run(overflow.base_url))
    assert type(e.value).__name__ == "ContextLengthExceededError" and e.value.status == 400
    with pytest.raises(EngineError, match=r"no answer after 2 attempt\(s\); last error: ConnectError") as e:
        asyncio.run(run("http://127.0.0.1:9/v1", max_retries=1))
    assert e.value.status is None
    flaky = scripted([(503, {"error": "busy"}), (200, chat_answer("fine"))])
    assert asyncio.run(run(flaky.base_url)).text == "fine" and len(flaky.requests) == 2


def test_a_key_is_forwarded_and_never_recorded(scripted, proxy_to, monkeypatch):
    key, body_key, url_key = "sk-live-0123456789abcdef", "sk-body-secret-7777", "qs-secret-55555555"
    srv = scripted(lambda body: (200, chat_answer("ok")), api_key=key)
    monkeypatch.setenv("OTB_CAPTURE_KEY", key)
    engine = make_engine(
        LLM(
            engine="openai",
            base_url=srv.base_url,
            model="m",
            api_key_env="OTB_CAPTURE_KEY",
            extra_body={"api_key": body_key},
        )
    )
    proxy = capture_engine(engine, engine.settings)

    async def call():
        call_scope.set("1-0")
        try:
            return await FirstRequest(engine).complete([{"role": "user", "content": f"my key is {key}"}])
        finally:
            await engine.aclose()

    assert asyncio.run(call()).text == "ok"
    assert srv.requests[-1]["headers"]["Authorization"] == f"Bearer {key}"  # forwarded as it came
    assert srv.requests[-1]["body"]["api_key"] == body_key
    with httpx.Client(trust_env=False) as http:  # a key in the URL
        http.post(f"{proxy.url('1-0')}/chat/completions?key={url_key}", json={"model": "m", "messages": []})
    wrong = post(
        proxy.url("1-0"), {"model": "m", "messages": []}, headers={"Authorization": "Bearer sk-wrong-999999999"}
    )
    assert wrong.status_code == 401 and "Incorrect API key" in wrong.text
    calls = proxy.take("1-0")
    proxy.close()
    assert len(calls) == 3 and calls[0]["content"] == "ok" and calls[2]["status"] == 401
    record = json.dumps(calls)
    for secret in (key, body_key, url_key, "sk-wrong-999999999"):
        assert secret not in record
    assert "my key is [redacted]" in json.loads(calls[0]["request"])["messages"][0]["content"]


def test_a_wrong_key_through_the_proxy_stops_the_run_naming_the_401(scripted, monkeypatch):
    srv = scripted(lambda body: (200, chat_answer("ok")), api_key="sk-right-key-1234")
    monkeypatch.setenv("OTB_CAPTURE_KEY", "sk-wrong-key-9876")
    engine = make_engine(LLM(engine="openai", base_url=srv.base_url, model="m", api_key_env="OTB_CAPTURE_KEY"))
    proxy = capture_engine(engine, engine.settings)

    async def call():
        try:
            return await FirstRequest(engine).complete([{"role": "user", "content": "x"}])
        finally:
            await engine.aclose()

    with pytest.raises(EndpointError, match=r"check the API key.*HTTP 401.*sk-\*\*\*\*\*9876") as e:
        asyncio.run(call())
    assert e.value.status == 401 and srv.base_url in str(e.value)  # errors still name the server
    proxy.close()


# -- a sandboxed agent's way out: a scoped unix socket, opened over the control socket --------
def test_a_scoped_socket_passes_model_calls_only_as_its_trials_with_the_proxys_key(scripted, proxy_to, tmp_path):
    """What the sandbox reaches (otbuild.harbor.environment binds the socket in): the client's
    key is replaced by the proxy's, its scope header and `/s/` prefix name no other scope, and
    the provider's other endpoints are refused before they reach the server."""
    from otbuild.capture.control import control_request

    srv = scripted([(200, chat_answer("hi"))], api_key="sk-real")
    proxy = proxy_to(srv.base_url, api_key="sk-real")
    control = proxy.serve_control(tmp_path / "c.ctl")
    sock = control_request(control, "open", "trial-a", tmp_path / "a.sock")
    assert oct((tmp_path / "c.ctl").stat().st_mode & 0o777) == "0o600"
    transport = httpx.HTTPTransport(uds=sock)
    with httpx.Client(transport=transport, base_url="http://sandbox", timeout=30) as http:
        headers = {"Authorization": "Bearer dummy", "X-Otbuild-Scope": "trial-b"}
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
        assert (
            http.post("/chat/completions", json=body, headers=headers).json()["choices"][0]["message"]["content"]
            == "hi"
        )
        assert http.post("/s/trial-b/chat/completions", json=body, headers=headers).status_code == 200
        refused = [http.post(p, json={}, headers=headers).status_code for p in ("/files", "/fine_tuning/jobs", "/")]
        assert refused == [403, 403, 403] and http.get("/files").status_code == 403
    assert [r["headers"]["Authorization"] for r in srv.requests] == ["Bearer sk-real"] * 2
    assert not any("X-Otbuild-Scope" in r["headers"] for r in srv.requests)
    calls = proxy.take("trial-a")
    assert [c["call_idx"] for c in calls] == [0, 1] and proxy.take("trial-b") == []
    assert not any("sk-real" in json.dumps(c) for c in calls)
    control_request(control, "close", "", sock)
    assert not (tmp_path / "a.sock").exists()
    with pytest.raises(RuntimeError, match="a scoped socket needs a scope"):
        control_request(control, "open", "", tmp_path / "b.sock")
