"""The `vllm` engine: `vllm serve MODEL` on this node (through its CLI only: vLLM brings its
own torch; the tested release is pyproject's `vllm` extra, its CUDA build on a GPU node and its
CPU build elsewhere: scripts/vllm-env.sh), on a free port (RL's policy server: on a private unix
socket), and the openai engine pointed at it.
tests/contracts/test_vllm.py checks these command lines and the request bodies against that
release's own parser and request models; tests/engines/test_vllm_live.py runs them on the real server."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import cast

from otbuild.engines.base import EngineError
from otbuild.engines.managed import ManagedServerEngine
from otbuild.engines.model_config import check_fits_model
from otbuild.engines.process import ServerProcess, free_port, private_socket, server_http
from otbuild.errors import ConfigError
from otbuild.settings.engines import LLM, VLLMOptions

# where `make setup` puts vLLM (scripts/vllm-env.sh): the project's, or this checkout's
VENV_VLLM = Path(".venv-vllm", "bin", "vllm")
CHECKOUT_VLLM = Path(__file__).resolve().parents[2] / VENV_VLLM


def vllm_executable(s: VLLMOptions) -> str | None:
    """The `vllm` to run: `vllm_executable` when set, else `vllm` on PATH, else the project's
    (the working directory's) .venv-vllm, else that of the otbuild checkout; None: none there."""
    if s.vllm_executable:
        return s.vllm_executable
    found = shutil.which("vllm")
    if found:
        return found
    return next((str(p.absolute()) for p in (VENV_VLLM, CHECKOUT_VLLM) if os.access(p, os.X_OK)), None)


# what vLLM needs to take new weights while it runs: its development endpoints (/collective_rpc,
# /reset_prefix_cache) beside its RL ones (/pause, /resume)
WEIGHT_SYNC_ENV = {"VLLM_SERVER_DEV_MODE": "1"}


def reload_weights(
    root: str, weights_dir: str, timeout: float = 3600.0, key: str | None = None, uds: str | None = None
) -> None:
    """Move the weights saved in `weights_dir` (safetensors, the served model's architecture)
    into the live server at `root` (its URL without /v1, on its unix socket `uds` if it has one,
    started with WEIGHT_SYNC_ENV):
    generation is paused across the reload (requests wait, none is dropped), the workers load
    the files in place (`reload_weights` through vLLM's collective RPC: a reload from disk, as
    no weight-transfer engine runs on a CPU), the prefix cache (the old weights' KV) is reset,
    and generation resumes. `key`: the server's API key (vLLM 0.32 guards only its /v1 routes
    with it; sent anyway, for a release that guards more)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with server_http(uds, timeout=timeout, headers=headers) as http:

        def post(path: str, body: dict | None = None) -> None:
            r = http.post(root + path, json=body) if body else http.post(root + path)
            if r.status_code != 200:
                raise EngineError(
                    f"vllm: {path} answered HTTP {r.status_code} while loading {weights_dir}: "
                    f"{r.text[:500]} (is the server started with {WEIGHT_SYNC_ENV}?)"
                )

        post("/pause")
        try:
            post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": weights_dir}})
            post("/reset_prefix_cache")
        finally:
            post("/resume")


def vllm_command(llm: LLM, port: int | None, uds: str | None = None) -> list[str]:
    """The `vllm serve` command line for this engine section (options left unset are not passed):
    on `port` of its `host`, or on the unix socket `uds` (vLLM then ignores host and port)."""
    s = cast(VLLMOptions, llm.launch)  # a vllm section's
    address = ["--uds", uds] if uds else ["--host", s.host, "--port", str(port)]
    cmd = [
        vllm_executable(s) or "vllm",
        "serve",
        llm.model,
        *address,
        "--tensor-parallel-size",
        str(s.tensor_parallel_size),
        "--data-parallel-size",
        str(s.data_parallel_size),
    ]
    options = {
        "--served-model-name": s.served_model_name,
        "--max-model-len": s.max_model_len,
        "--dtype": s.dtype,
        "--quantization": s.quantization,
        "--gpu-memory-utilization": s.gpu_memory_utilization,
        "--tool-call-parser": s.tool_call_parser,
        "--reasoning-parser": s.reasoning_parser,
        "--logprobs-mode": s.logprobs_mode,
        "--seed": llm.seed,
        "--hf-overrides": json.dumps(s.hf_overrides) if s.hf_overrides else None,
    }
    cmd += [x for flag, v in options.items() if v is not None for x in (flag, str(v))]
    tools = getattr(llm, "protocol", None) == "tools"  # the harness offers tools: the model may call them
    if tools and not s.tool_call_parser:
        raise ConfigError(
            "vllm: harness.protocol is tools but engine_args.tool_call_parser is not set "
            "(the parser of the model's tool-call format, e.g. hermes for Qwen3)"
        )
    cmd += [
        flag
        for flag, on in (
            ("--enable-auto-tool-choice", s.enable_auto_tool_choice or tools),
            ("--enforce-eager", s.enforce_eager),
        )
        if on
    ]
    return cmd + [str(a) for a in s.extra_args]


class VLLMEngine(ManagedServerEngine):
    name = "vllm"
    default_provider = "hosted_vllm"
    takes_tools = True  # with a tool call parser (vllm_command)
    options: VLLMOptions

    def __init__(self, settings: LLM):
        check_fits_model(settings)
        super().__init__(settings)

    def _launch(self, private: bool = False) -> tuple[str, ServerProcess]:
        """`private`: on a unix socket only this user may reach (`private_socket`), not a TCP port:
        for the RL policy server, whose development endpoints take no API key (docs/security.md)."""
        s = self.options
        if vllm_executable(s) is None:
            raise EngineError(
                "vllm: no `vllm` executable: not on PATH, and no .venv-vllm here or in otbuild's "
                "checkout; install it with `make vllm-env` (scripts/vllm-env.sh) or name one in "
                "engine_args.vllm_executable"
            )
        client_host = "127.0.0.1" if s.host in ("0.0.0.0", "::") else s.host
        uds = private_socket("vllm-serve") if private else None
        port = None if uds else s.port or free_port(client_host)
        server = ServerProcess(
            vllm_command(self.settings, port, uds),
            name="vllm serve",
            log_path=s.log_path,
            env={**os.environ, **{k: str(v) for k, v in s.env.items()}},
            uds=uds,
        )
        root = "http://localhost" if uds else f"http://{client_host}:{port}"
        try:
            server.start()
            server.wait_healthy(f"{root}/health", time.monotonic() + s.startup_timeout_sec)
        except BaseException:
            server.stop()
            raise
        return f"{root}/v1", server
