"""Engine settings, each declared once, in the recipe schema's terms.

`LLM` is the section every LLM stage of a recipe shares (`AgentModel` and `TaskScorer` in
otbuild/settings/recipe.py, `Augment` in otbuild/stages/augment.py extend it): every setting an
engine's client reads. An engine that starts its own server reads its launch options from
`engine_args`, a mapping checked against that engine's model of them (`VLLMOptions`,
`TransformersOptions`). Engines take the `LLM` (or a subclass: they read only its fields):
`make_engine(llm)` in otbuild/engines/__init__.py.

Content ids follow the rule of otbuild/settings/identity.py: fields made with
`execution_only(...)` change how requests are sent or a server runs (concurrency, retries,
timeouts, host/port, parallelism), not what the model answers; they, and values equal to
their defaults, stay out of ids (the keys of `engine_args` too).
"""

from __future__ import annotations

from typing import Any, Literal, cast
from urllib.parse import urlsplit

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from otbuild.settings.base import Strict, engine_args, execution_only

# Requests (so trials) in flight per engine when a section leaves `concurrency` unset: vLLM
# batches them; `otbuild serve` answers one at a time (2 keeps it busy); the oracle's trials
# are sandboxes on a CPU. docs/engines.md states these.
# `auto` (otbuild's own checkpoints: eval.serve_with, rl.rollout): vllm where it is installed,
# else transformers, decided when the engine starts (otbuild.engines.resolve_auto); its trials
# in flight are known before that (the profile's memory check counts them): transformers' 2
CONCURRENCY = {"openai": 8, "vllm": 64, "transformers": 2, "oracle": 4, "noop": 4, "auto": 2}
AUTO = "auto"


class ServerOptions(Strict):
    """What every server otbuild starts on this node takes (and stops when the engine closes)."""

    host: str = execution_only("127.0.0.1")
    port: int | None = execution_only(None, ge=0, le=65535, description="None: a free port")
    served_model_name: str | None = Field(default=None, min_length=1, description="None: `model`")
    log_path: str | None = execution_only(None, description="the server's stdout+stderr; None: a temporary file")
    env: dict[str, Any] = Field(default_factory=dict, description="extra environment variables for the server")
    max_restarts: int = execution_only(
        2, ge=0, description="times a server that died is started again before the stage fails"
    )


class TransformersOptions(ServerOptions):
    """`otbuild serve MODEL_DIR` (transformers, CPU or one GPU): the LLM's `model` is the model dir."""

    startup_timeout_sec: float = execution_only(300.0, gt=0)
    device: str = execution_only("auto", description="auto, cpu, cuda, cuda:N")
    enable_auto_tool_choice: bool = Field(
        default=False, description="answers' tool calls read into tool_calls, as vLLM's flag (needs tool_call_parser)"
    )
    tool_call_parser: Literal["hermes"] | None = Field(default=None, description="as vLLM's: Qwen3's <tool_call>")

    @model_validator(mode="after")
    def _parser_for_auto_tools(self):
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise ValueError("enable_auto_tool_choice needs tool_call_parser (hermes), as vLLM's flag does")
        return self


class VLLMOptions(ServerOptions):
    """`vllm serve MODEL` on this GPU node: the LLM's `model` is an HF id or a local path."""

    startup_timeout_sec: float = execution_only(1800.0, gt=0, description="big checkpoints load slowly")
    tensor_parallel_size: int = execution_only(1, ge=1)
    data_parallel_size: int = execution_only(1, ge=1)
    max_model_len: int | None = Field(
        default=None, ge=1, description="beyond the model's own context: rope scaling in hf_overrides"
    )
    quantization: str | None = Field(default=None, description="e.g. awq; unset: the checkpoint's own")
    hf_overrides: dict[str, Any] | None = Field(
        default=None, description="e.g. {rope_scaling: {rope_type: yarn, factor: 2.0, ...}}"
    )
    gpu_memory_utilization: float | None = execution_only(None, gt=0, le=1)
    enable_auto_tool_choice: bool = False
    enforce_eager: bool = execution_only(
        False,
        description="no torch.compile and no CUDA graphs: a start in seconds instead of a minute, "
        "slower decoding; for tiny models and vLLM's CPU build",
    )
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    dtype: str | None = Field(
        default=None, description="e.g. float32, bfloat16; unset: vLLM's choice for the checkpoint (`--dtype auto`)"
    )
    logprobs_mode: Literal["raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits"] | None = Field(
        default=None, description="what `logprobs` returns; RL's rollouts ask processed_logprobs (after temperature)"
    )
    extra_args: list[str | int | float] = Field(default_factory=list, description="appended to the command line as is")
    vllm_executable: str | None = execution_only(
        None, min_length=1, description="None: `vllm` on PATH, else the project's .venv-vllm/bin/vllm (make setup)"
    )


# engine -> the model of its launch options (the keys of an `engine_args` mapping), for each
# engine that starts a server
# (`auto` takes vLLM's: those a fallback to transformers cannot use are left out there)
LAUNCH_OPTIONS: dict[str, type[VLLMOptions | TransformersOptions]] = {
    "vllm": VLLMOptions,
    "transformers": TransformersOptions,
    AUTO: VLLMOptions,
}


class LaunchOptionsError(ValueError):
    """`engine_args` its engine's launch options refuse; `errors` are pydantic's, located
    inside the mapping (the recipe loader names each key)."""

    def __init__(self, options: type[ServerOptions], errors: list[dict]):
        self.options, self.errors = options, errors
        super().__init__(_described(errors))


def launch_options(engine: str, args: dict) -> VLLMOptions | TransformersOptions | None:
    """`args` checked against `engine`'s launch options; None for an engine that starts no server."""
    options = LAUNCH_OPTIONS.get(engine)
    if options is None:
        if args:
            raise ValueError(
                f"engine {engine!r} starts no server: engine_args holds the launch options "
                f"of {' or '.join(LAUNCH_OPTIONS)}"
            )
        return None
    try:
        return options.model_validate(args)
    except ValidationError as e:
        raise LaunchOptionsError(options, cast(list[dict], e.errors())) from None  # ErrorDetails: dicts


TOOL_OPTIONS = ("enable_auto_tool_choice", "tool_call_parser")  # vLLM's flags that otbuild serve takes


def server_fallback(args: dict) -> dict:
    """The launch options of `args` (an `auto` engine's, vLLM's) that every server takes, and
    its tool-call flags: what is left when `auto` finds no vLLM and starts `otbuild serve`."""
    return {k: v for k, v in args.items() if k in ServerOptions.model_fields or k in TOOL_OPTIONS}


class Sampling(Strict):
    """How a model is asked: an engine section's, and eval's for the checkpoint it serves."""

    temperature: float = Field(default=0.7, ge=0)
    max_tokens: int = Field(default=4096, ge=1, description="per answer")
    concurrency: int | None = execution_only(
        None, ge=1, description="requests (trials) in flight per job; default: the engine's own (docs/engines.md)"
    )


class LLM(Sampling):
    """An LLM engine: an OpenAI-compatible endpoint, a vLLM server otbuild starts, or a local
    transformers model dir. Execution knobs (concurrency, retries, the client's timeout and
    backoff) are not part of content ids."""

    engine: Literal["openai", "vllm", "transformers", "auto"]
    model: str = Field(min_length=1, description="model name (openai), HF id or path (vllm), dir (transformers, auto)")
    base_url: str | None = None  # openai: the endpoint, e.g. https://api.example.com/v1
    api_key_env: str | None = None  # openai: the NAME of the env var holding the key
    request_params: Literal["auto", "standard", "reasoning"] = Field(
        default="auto",
        description="which body fields the model takes: auto picks by model name "
        "(reasoning models: max_completion_tokens, no sampling knobs); docs/engines.md",
    )
    max_retries: int = execution_only(5, ge=0, description="after the first attempt (transport errors, 429, 5xx)")
    request_timeout_sec: float = execution_only(600, gt=0)
    engine_args: dict[str, Any] = engine_args(of="engine")  # a managed server's launch options
    provider: str | None = Field(
        default=None, min_length=1, description="the trace's model_provider; default: the engine's"
    )
    top_p: float | None = Field(default=None, ge=0, le=1)
    seed: int | None = None
    extra_body: dict[str, Any] = Field(default_factory=dict, description="merged into every request body")
    backoff_sec: float = execution_only(1.0, gt=0, description="the first retry waits ~this, doubling, with jitter")
    backoff_max_sec: float = execution_only(60.0, gt=0)

    @field_validator("base_url")
    @classmethod
    def _http(cls, url: str | None) -> str | None:
        parts = urlsplit(url or "http://x")
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("expected an http(s) URL of an OpenAI-compatible endpoint, e.g. http://host:8000/v1")
        return url

    @field_validator("engine_args")
    @classmethod
    def _launch_options(cls, args: dict, info: ValidationInfo) -> dict:
        if "engine" in info.data:  # else the engine is the error
            launch_options(info.data["engine"], args)
        return args

    @model_validator(mode="after")
    def _endpoint(self):
        if self.engine == "openai" and not self.base_url:
            raise ValueError("engine 'openai' needs `base_url`")
        return self

    @property
    def launch(self) -> VLLMOptions | TransformersOptions | None:
        """The launch options of the server this engine starts (None: it starts none)."""
        return launch_options(self.engine, self.engine_args)


def client_settings(llm: LLM) -> LLM:
    """What its requests are built from (`otbuild.engines.openai.request_body`): for an engine
    that starts a server, the model under the name the server serves it as, and no API key."""
    if llm.launch is None:
        return llm
    return llm.model_copy(update={"model": llm.launch.served_model_name or llm.model, "api_key_env": None})


def concurrency(section: LLM) -> int:
    """Requests (so trials) in flight for `section` (an LLM section, or a stage's settings built
    on one): its `concurrency`, else its engine's default."""
    return section.concurrency or CONCURRENCY.get(section.engine, CONCURRENCY["openai"])


def _described(errors: list[dict]) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg'].removeprefix('Value error, ')}" for e in errors)
