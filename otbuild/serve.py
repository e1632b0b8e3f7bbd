"""`otbuild serve MODEL_DIR`: an OpenAI-compatible chat server over transformers.

One model on the CPU or one GPU; requests run one at a time. Endpoints: POST
/v1/chat/completions (messages, temperature, max_tokens, top_p, seed, stop, n=1; greedy when
temperature is 0; `structured_outputs: {regex: ...}` constrains the answer to a regular
expression, as vLLM's does: otbuild/engines/guided.py; `usage` token counts; a request over the model's context
window is a 400 that says so, as vLLM's; `return_token_ids` gives the prompt's and the answer's
token ids and `logprobs` each answer token's sampled log-prob (after temperature and top_p), in
vLLM's fields; served under a reasoning model's name, e.g. gpt-5-nano,
it refuses `max_tokens` and non-default sampling knobs as OpenAI's API does:
otbuild/engines/request_policy.py), GET /v1/models, GET /health, GET /version (transformers'). Prints
`otbuild serve: listening on http://HOST:PORT` once the model is loaded and the port is bound.

Tools as vLLM takes them: a request's `tools` are rendered by the model's chat template (earlier
tool calls' arguments as objects: otbuild/engines/toolcalls.py); with `--enable-auto-tool-choice
--tool-call-parser hermes` the answer's `<tool_call>` blocks come back as `tool_calls` (finish
reason `tool_calls`), the text before them as `content`, as vLLM's hermes parser reads them.
Refused as vLLM refuses them: `tools: []`, `tool_choice` without tools or of an unknown kind,
and `tool_choice: auto` (the default with tools) on a server started without those flags;
`tool_choice: none` renders the tools and reads no calls. `required` and a named function
(which vLLM meets with guided decoding) are refused.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from otbuild.engines import request_policy
from otbuild.engines.toolcalls import PARSERS, parse_tool_calls, template_messages

READY = "otbuild serve: listening on "
DEFAULT_MAX_TOKENS = 512


class RequestError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | int | None = None):
        super().__init__(message)
        self.status, self.param, self.code = status, param, code or status


class ChatModel:
    """A causal LM and its tokenizer's chat template; `chat()` runs one request at a time."""

    def __init__(self, model_dir: str | Path, device: str = "auto"):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        self.device = device
        self.tokenizer: Any = AutoTokenizer.from_pretrained(model_dir)
        if not self.tokenizer.chat_template:
            raise ValueError(f"{model_dir}: the tokenizer has no chat template")
        model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)  # transformers' types: no help
        self.model = model.to(device).eval()
        self.max_len = getattr(self.model.config, "max_position_embeddings", None)
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos]) - {None}
        pad = self.tokenizer.pad_token_id
        self.pad = pad if pad is not None else next(iter(self.eos), 0)
        self.lock = threading.Lock()
        self.pieces: dict[int, str] = {}  # token -> text, for constrained decoding

    def chat(
        self,
        messages: list[dict],
        *,
        max_tokens: int | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: Sequence[str] = (),
        regex: str | None = None,
        tools: list[dict] | None = None,
        parse_tools: bool = False,
        token_ids: bool = False,
        logprobs: bool = False,
    ) -> dict:
        """`tools`: rendered by the chat template; `parse_tools`: the answer's tool calls read
        (otbuild/engines/toolcalls.py) into `tool_calls`."""
        from transformers import GenerationConfig

        torch = self.torch
        prompt = self.tokenizer.apply_chat_template(
            template_messages(messages), tools=tools, add_generation_prompt=True, tokenize=False
        )
        ids = self.tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
        n_in = ids.shape[1]
        room = (self.max_len - n_in) if self.max_len else None
        if room is not None and room < (max_tokens or 1):  # vLLM's answer, word for word
            raise RequestError(
                400,
                f"This model's maximum context length is {self.max_len} tokens. "
                f"However, you requested {n_in + (max_tokens or 1)} tokens ({n_in} in "
                f"the messages, {max_tokens or 1} in the completion). Please reduce "
                "the length of the messages or completion.",
            )
        if max_tokens is None:
            max_tokens = min(DEFAULT_MAX_TOKENS, room) if room else DEFAULT_MAX_TOKENS
        sample = temperature > 0
        config = GenerationConfig(
            max_new_tokens=max_tokens,
            do_sample=sample,
            eos_token_id=sorted(self.eos) or None,
            pad_token_id=self.pad,
            **({"temperature": temperature, "top_p": top_p} if sample else {}),
        )
        processors = None
        if regex:
            from transformers import LogitsProcessorList

            from otbuild.engines.guided import RegexConstraint

            try:
                processors = LogitsProcessorList([RegexConstraint(self.tokenizer, regex, n_in, self.eos, self.pieces)])
            except ValueError as e:
                raise RequestError(400, str(e)) from None
        with self.lock, torch.inference_mode():
            if seed is not None:
                torch.manual_seed(seed)
            ids = ids.to(self.device)
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                generation_config=config,
                logits_processor=processors,
                output_scores=logprobs,
                return_dict_in_generate=True,
            )
        new = out.sequences[0, n_in:].tolist()
        finish = "stop" if new and new[-1] in self.eos else "length"
        if parse_tools:  # the <tool_call> markers are kept (special tokens in a tiny student's vocabulary)
            text = self.tokenizer.decode([t for t in new if t not in self.eos], skip_special_tokens=False)
        else:
            text = self.tokenizer.decode(new, skip_special_tokens=True)
        cuts = [i for i in (text.find(s) for s in stop if s) if i >= 0]
        if cuts:
            text, finish = text[: min(cuts)], "stop"
        answer: dict[str, Any] = {"text": text, "prompt_tokens": n_in, "completion_tokens": len(new)}
        if parse_tools:
            content, calls = parse_tool_calls(text)
            answer.update(text=content, tool_calls=calls or [])
            finish = "tool_calls" if calls else finish
        answer["finish_reason"] = finish
        if token_ids:
            answer["prompt_token_ids"], answer["token_ids"] = ids[0].tolist(), new
        if logprobs:  # the sampling step's scores (after temperature and top_p) at each chosen token
            steps = torch.stack(out.scores[: len(new)])[:, 0].float()
            chosen = torch.log_softmax(steps, -1).gather(-1, torch.tensor(new, device=steps.device)[:, None])[:, 0]
            answer["logprobs"] = [(self._piece(t), lp) for t, lp in zip(new, chosen.tolist(), strict=True)]
        return answer

    def _piece(self, token: int) -> str:
        return self.tokenizer.convert_ids_to_tokens(token)


def _tool_args(body: dict, auto_tools: bool) -> dict:
    """A request's `tools` and `tool_choice`, checked as vLLM checks them; ChatModel.chat's
    `tools` and `parse_tools`. `auto_tools`: the server was started with
    --enable-auto-tool-choice --tool-call-parser hermes."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise RequestError(400, "`tools` must be a list of tool definitions", "tools")
    if tools == []:
        raise RequestError(
            400,
            "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely.",
            "tools",
        )
    if choice is None and tools:
        choice = "auto"
    if choice is not None and choice != "none" and not tools:
        raise RequestError(400, "When using `tool_choice`, `tools` must be set.", "tool_choice")
    if choice not in (None, "none", "auto", "required") and not isinstance(choice, dict):
        raise RequestError(
            400,
            f'Invalid value for `tool_choice`: {choice}! Only named tools, "none", "auto" or "required" are supported.',
            "tool_choice",
        )
    if choice == "auto" and not auto_tools:
        raise RequestError(
            400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
        )
    if choice == "required" or isinstance(choice, dict):
        raise RequestError(400, f"tool_choice={json.dumps(choice)} is not supported by otbuild serve", "tool_choice")
    return {"tools": tools or None, "parse_tools": choice == "auto"}


def _request_args(body: dict, auto_tools: bool = False) -> dict:
    """Validate a chat request body; return ChatModel.chat's keyword arguments."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "`messages` must be a non-empty list")
    if body.get("n", 1) != 1:
        raise RequestError(400, "only n=1 is supported")
    if body.get("stream"):
        raise RequestError(400, "streaming is not supported")
    stop = body.get("stop") or []
    structured = body.get("structured_outputs") or {}
    if not isinstance(structured, dict) or set(structured) - {"regex"}:
        raise RequestError(400, 'structured_outputs: only {"regex": PATTERN} is supported')
    try:
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
        return {
            "messages": messages,
            "max_tokens": None if max_tokens is None else int(max_tokens),
            "temperature": float(body.get("temperature", 1.0)),
            "top_p": float(body.get("top_p", 1.0)),
            "seed": None if body.get("seed") is None else int(body["seed"]),
            "stop": [stop] if isinstance(stop, str) else list(stop),
            "regex": structured.get("regex"),
            "token_ids": bool(body.get("return_token_ids")),
            "logprobs": bool(body.get("logprobs")),
            **_tool_args(body, auto_tools),
        }
    except (TypeError, ValueError) as e:
        raise RequestError(400, f"bad parameter: {e}") from e


def _logprobs(tokens: list[tuple[str, float]]) -> dict:
    """Chat Completions' `logprobs` object: each answer token's log-prob (no alternatives)."""
    return {"content": [{"token": t, "logprob": lp, "bytes": None, "top_logprobs": []} for t, lp in tokens]}


class ChatServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], model: ChatModel, served_model_name: str, tool_call_parser: str | None = None
    ):
        super().__init__(address, Handler)
        self.model, self.served_model_name = model, served_model_name
        self.tool_call_parser = tool_call_parser  # set: --enable-auto-tool-choice

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = host.decode() if isinstance(host, bytes) else host
        return f"http://{host}:{port}"


class Handler(BaseHTTPRequestHandler):
    server: ChatServer
    protocol_version = "HTTP/1.1"

    def _send(self, status: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, param: str | None = None, code: str | int | None = None) -> None:
        kind = "invalid_request_error" if status < 500 else "server_error"
        self._send(status, {"error": {"message": message, "type": kind, "param": param, "code": code or status}})

    def do_GET(self):
        if self.path == "/health":
            self._send(200, {"status": "ok"})
        elif self.path == "/version":  # the engine's, as vLLM answers its own
            import transformers

            self._send(200, {"version": transformers.__version__})
        elif self.path == "/v1/models":
            name = self.server.served_model_name
            self._send(
                200, {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "otbuild"}]}
            )
        else:
            self._error(404, f"no route {self.path}")

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path != "/v1/chat/completions":
            return self._error(404, f"no route {self.path}")
        try:
            body = json.loads(raw or b"{}")
            if not isinstance(body, dict):
                raise RequestError(400, "the body must be a JSON object")
            name = self.server.served_model_name
            if body.get("model", name) != name:
                raise RequestError(404, f"the model `{body.get('model')}` does not exist")
            if refused := request_policy.refusal(name, body):  # as strict as OpenAI's API
                param, code, message = refused
                raise RequestError(400, message, param, code)
            # a server without the attribute (the Handler on another socket server): no tool choice
            auto_tools = getattr(self.server, "tool_call_parser", None) is not None
            out = self.server.model.chat(**_request_args(body, auto_tools))
        except json.JSONDecodeError as e:
            return self._error(400, f"invalid JSON: {e}")
        except RequestError as e:
            return self._error(e.status, str(e), e.param, e.code)
        except Exception as e:  # noqa: BLE001 - a generation failure: the server lives on
            return self._error(500, f"{type(e).__name__}: {e}")
        self._send(
            200,
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": name,
                **({"prompt_token_ids": out["prompt_token_ids"]} if "prompt_token_ids" in out else {}),
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": out["finish_reason"],
                        "message": {
                            "role": "assistant",
                            "content": out["text"],
                            **({"tool_calls": out["tool_calls"]} if "tool_calls" in out else {}),
                        },
                        **({"token_ids": out["token_ids"]} if "token_ids" in out else {}),
                        **({"logprobs": _logprobs(out["logprobs"])} if "logprobs" in out else {}),
                    }
                ],
                "usage": {
                    "prompt_tokens": out["prompt_tokens"],
                    "completion_tokens": out["completion_tokens"],
                    "total_tokens": out["prompt_tokens"] + out["completion_tokens"],
                },
            },
        )

    def log_message(self, format, *args):  # one short line per request, to stderr
        sys.stderr.write(f"{self.address_string()} {format % args}\n")


def make_server(
    model_dir: str | Path,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    served_model_name: str | None = None,
    device: str = "auto",
    tool_call_parser: str | None = None,
) -> ChatServer:
    """Load the model and bind the port (0: a free one); call `serve_forever()` on the result.
    `tool_call_parser`: answers' tool calls are read (--enable-auto-tool-choice)."""
    model = ChatModel(model_dir, device)
    return ChatServer((host, port), model, served_model_name or str(model_dir), tool_call_parser)


def serve(
    model_dir: str | Path,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    served_model_name: str | None = None,
    device: str = "auto",
    tool_call_parser: str | None = None,
) -> None:
    """Serve until interrupted (Ctrl-C or SIGTERM)."""
    import signal

    server = make_server(
        model_dir, host, port, served_model_name=served_model_name, device=device, tool_call_parser=tool_call_parser
    )

    def on_sigterm(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    print(f"{READY}{server.url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="otbuild serve", description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir", help="a transformers model dir (weights, tokenizer, chat template)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: a free port (printed on start)")
    p.add_argument("--served-model-name", default=None, help="the `model` clients send (default: MODEL_DIR as given)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument(
        "--enable-auto-tool-choice", action="store_true", help="read the answers' tool calls (as vLLM's flag)"
    )
    p.add_argument("--tool-call-parser", choices=PARSERS, default=None, help="how they are read (as vLLM's)")
    args = p.parse_args(argv)
    if not (Path(args.model_dir) / "config.json").is_file():
        print(f"otbuild serve: {args.model_dir}: not a model dir (no config.json)", file=sys.stderr)
        return 2
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        print("otbuild serve: --enable-auto-tool-choice requires --tool-call-parser", file=sys.stderr)
        return 2
    serve(
        args.model_dir,
        args.host,
        args.port,
        served_model_name=args.served_model_name,
        device=args.device,
        tool_call_parser=args.tool_call_parser if args.enable_auto_tool_choice else None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
