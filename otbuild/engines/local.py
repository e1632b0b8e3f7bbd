"""The `transformers` engine: `otbuild serve MODEL_DIR` in a child process, and the openai
engine pointed at it. `start_local_server` is the same server for tests and scripts."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from otbuild.engines.managed import ManagedServerEngine
from otbuild.engines.process import ServerProcess
from otbuild.errors import ConfigError
from otbuild.settings.engines import TransformersOptions

READY_PATTERN = r"^otbuild serve: listening on (http://\S+)$"  # what otbuild.serve prints


def start_local_server(
    model_dir: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    device: str = "auto",
    served_model_name: str | None = None,
    startup_timeout_sec: float = 300.0,
    log_path: str | Path | None = None,
    env: dict | None = None,
    tool_call_parser: str | None = None,
) -> tuple[str, Callable[[], None]]:
    """Run `python -m otbuild.serve MODEL_DIR` until healthy; return (base_url, stop).

    base_url ends in /v1. The server is stopped when starting it fails; `stop()` is idempotent.
    `tool_call_parser`: started with --enable-auto-tool-choice --tool-call-parser (as vLLM).
    """
    base_url, server = launch_local_server(
        model_dir,
        host=host,
        port=port,
        device=device,
        served_model_name=served_model_name,
        startup_timeout_sec=startup_timeout_sec,
        log_path=log_path,
        env=env,
        tool_call_parser=tool_call_parser,
    )
    return base_url, server.stop


def launch_local_server(
    model_dir,
    *,
    host: str,
    port: int,
    device: str,
    served_model_name: str | None,
    startup_timeout_sec: float,
    log_path,
    env: dict | None,
    tool_call_parser: str | None = None,
) -> tuple[str, ServerProcess]:
    """start_local_server's server: (base_url, its ServerProcess)."""
    argv = [
        sys.executable,
        "-m",
        "otbuild.serve",
        str(model_dir),
        "--host",
        host,
        "--port",
        str(port),
        "--device",
        device,
    ]
    if served_model_name:
        argv += ["--served-model-name", served_model_name]
    if tool_call_parser:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", tool_call_parser]
    server = ServerProcess(
        argv,
        name="otbuild serve",
        log_path=log_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    ).start()
    try:
        deadline = time.monotonic() + startup_timeout_sec
        root = server.wait_for_log(READY_PATTERN, deadline).group(1)
        server.wait_healthy(f"{root}/health", deadline)
    except BaseException:
        server.stop()
        raise
    return f"{root}/v1", server


class TransformersEngine(ManagedServerEngine):
    """`model` is a local model dir (config, weights, tokenizer with a chat template)."""

    name = "transformers"
    default_provider = "transformers"
    options: TransformersOptions
    seeds_requests = True  # the harness seeds each request: the same answers whatever runs concurrently
    takes_tools = True  # with a tool call parser, as vLLM (otbuild serve reads Qwen3's <tool_call> blocks)

    def _launch(self) -> tuple[str, ServerProcess]:
        s = self.options
        tools = getattr(self.settings, "protocol", None) == "tools"  # the harness offers tools
        if tools and not s.tool_call_parser:
            raise ConfigError(
                "transformers: harness.protocol is tools but engine_args.tool_call_parser is not set "
                "(hermes: the parser of Qwen3's tool-call format)"
            )
        return launch_local_server(
            self.settings.model,
            host=s.host,
            port=s.port or 0,
            device=s.device,
            served_model_name=s.served_model_name,
            startup_timeout_sec=s.startup_timeout_sec,
            log_path=s.log_path,
            env=s.env,
            tool_call_parser=s.tool_call_parser if s.enable_auto_tool_choice or tools else None,
        )
