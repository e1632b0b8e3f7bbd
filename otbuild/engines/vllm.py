"""The `vllm` engine: `vllm serve MODEL` on this GPU node (through its CLI only: vLLM brings
its own CUDA torch; the tested release is pyproject's `vllm` extra), on a free port, and the
openai engine pointed at it. tests/test_vllm_contract.py checks these command lines and the
request bodies against that release's own parser and request models."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

from otbuild.engines.managed import ManagedServerEngine
from otbuild.engines.process import ServerProcess, free_port
from otbuild.engines.model_config import check_fits_model
from otbuild.settings.engines import LLM


def vllm_command(llm: LLM, port: int) -> list[str]:
    """The `vllm serve` command line for this engine section (options left unset are not passed)."""
    s = llm.launch
    cmd = [s.vllm_executable, "serve", llm.model, "--host", s.host, "--port", str(port),
           "--tensor-parallel-size", str(s.tensor_parallel_size),
           "--data-parallel-size", str(s.data_parallel_size)]
    options = {
        "--served-model-name": s.served_model_name,
        "--max-model-len": s.max_model_len,
        "--quantization": s.quantization,
        "--gpu-memory-utilization": s.gpu_memory_utilization,
        "--tool-call-parser": s.tool_call_parser,
        "--reasoning-parser": s.reasoning_parser,
        "--seed": llm.seed,
        "--hf-overrides": json.dumps(s.hf_overrides) if s.hf_overrides else None,
    }
    cmd += [x for flag, v in options.items() if v is not None for x in (flag, str(v))]
    if s.enable_auto_tool_choice:
        cmd.append("--enable-auto-tool-choice")
    return cmd + [str(a) for a in s.extra_args]


class VLLMEngine(ManagedServerEngine):
    name = "vllm"
    default_provider = "hosted_vllm"

    def __init__(self, settings: LLM):
        check_fits_model(settings)
        super().__init__(settings)

    def _launch(self) -> tuple[str, Callable[[], None]]:
        s = self.options
        client_host = "127.0.0.1" if s.host in ("0.0.0.0", "::") else s.host
        port = s.port or free_port(client_host)
        server = ServerProcess(
            vllm_command(self.settings, port), name="vllm serve", log_path=s.log_path,
            env={**os.environ, **{k: str(v) for k, v in s.env.items()}},
        ).start()
        root = f"http://{client_host}:{port}"
        try:
            server.wait_healthy(f"{root}/health", time.monotonic() + s.startup_timeout_sec)
        except BaseException:
            server.stop()
            raise
        return f"{root}/v1", server.stop
