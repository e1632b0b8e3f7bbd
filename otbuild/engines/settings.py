"""Engine settings: every key an engine reads, its default, and a strict loader.

An engine's settings are a flat mapping: `engine` (the registry key) plus the keys of that
engine's settings class; a managed server's launch options may also be nested under
`engine_args` (flattened on load). Unknown keys are config errors.

Fields made with `_execution(...)` change how a request is sent or a server runs, not what the
model answers (concurrency, retries, timeouts, host/port, parallelism): `identity_args` leaves
them, and values equal to their defaults, out of content ids (see otbuild/recipe/base.py).
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import ClassVar

from otbuild.engines.request_policy import POLICIES
from otbuild.errors import ConfigError


def _execution(default):
    """A setting that does not change what the engine produces: not part of content ids."""
    return field(default=default, metadata={"execution_only": True})


@dataclass(frozen=True, kw_only=True)
class ClientSettings:
    """What every engine's OpenAI-compatible client reads."""

    engine: ClassVar[str] = ""

    model: str  # the model name sent in requests (a path or HF id for managed servers)
    provider: str | None = None  # the trace's model_provider; None: the engine's default
    temperature: float = 0.7  # 0 means greedy
    max_tokens: int | None = None  # None: the server's default
    top_p: float | None = None
    seed: int | None = None
    extra_body: dict = field(default_factory=dict)  # merged into every request body
    request_params: str = "auto"  # auto | standard | reasoning: otbuild/engines/request_policy.py
    concurrency: int = _execution(8)  # requests in flight per engine
    max_retries: int = _execution(5)  # retries after the first attempt (transport errors, 429, 5xx)
    request_timeout_sec: float = _execution(600.0)  # per request
    backoff_sec: float = _execution(1.0)  # the first retry waits ~backoff_sec, doubling, with jitter
    backoff_max_sec: float = _execution(60.0)

    def __post_init__(self):
        if not self.model:
            raise ConfigError(f"engine {self.engine!r}: `model` must be set")
        if self.concurrency < 1 or self.max_retries < 0 or self.request_timeout_sec <= 0:
            raise ConfigError(
                f"engine {self.engine!r}: need concurrency >= 1, max_retries >= 0, request_timeout_sec > 0"
            )
        if self.request_params not in POLICIES:
            raise ConfigError(f"engine {self.engine!r}: request_params must be one of {', '.join(POLICIES)}, "
                              f"not {self.request_params!r}")

    @classmethod
    def from_dict(cls, settings: dict):
        """Build from a recipe mapping; unknown or missing keys are ConfigErrors."""
        given = {k: v for k, v in settings.items() if k not in ("engine", "engine_args")}
        nested = settings.get("engine_args") or {}
        if set(nested) & set(given):
            raise ConfigError(f"engine {cls.engine!r}: {sorted(set(nested) & set(given))} "
                              "set both in engine_args and outside it")
        given.update(nested)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(given) - known)
        if unknown:
            raise ConfigError(
                f"engine {cls.engine!r}: unknown setting(s) {', '.join(unknown)}; "
                f"known: {', '.join(sorted(known))}"
            )
        missing = sorted(
            f.name for f in fields(cls)
            if f.default is MISSING and f.default_factory is MISSING and f.name not in given
        )
        if missing:
            raise ConfigError(f"engine {cls.engine!r}: missing setting(s) {', '.join(missing)}")
        return cls(**given)

    def to_dict(self) -> dict:
        return {"engine": self.engine, **asdict(self)}

    def request_settings(self) -> ClientSettings:
        """What a request body is built from (`otbuild.engines.openai.request_body`)."""
        return self


@dataclass(frozen=True, kw_only=True)
class OpenAISettings(ClientSettings):
    """Any OpenAI-compatible chat endpoint (hosted API, a vLLM server started elsewhere)."""

    engine: ClassVar[str] = "openai"

    base_url: str  # e.g. https://api.openai.com/v1 (requests go to {base_url}/chat/completions)
    api_key_env: str | None = None  # the NAME of the env var holding the key; None: no key


@dataclass(frozen=True, kw_only=True)
class ServerSettings(ClientSettings):
    """A server the engine starts itself, on this node, and stops when it is closed."""

    host: str = _execution("127.0.0.1")
    port: int | None = _execution(None)  # None: a free port
    served_model_name: str | None = None  # None: `model`
    startup_timeout_sec: float = _execution(300.0)
    log_path: str | None = _execution(None)  # the server's stdout+stderr; None: a temporary file
    env: dict = field(default_factory=dict)  # extra environment variables for the server

    def request_settings(self) -> ClientSettings:
        """The client's settings, under the name the server serves the model as."""
        client = {f.name: getattr(self, f.name) for f in fields(ClientSettings)}
        return ClientSettings(**{**client, "model": self.served_model_name or self.model})


@dataclass(frozen=True, kw_only=True)
class TransformersSettings(ServerSettings):
    """`otbuild serve MODEL_DIR` (transformers, CPU or one GPU): `model` is the model dir."""

    engine: ClassVar[str] = "transformers"

    device: str = _execution("auto")  # auto, cpu, cuda, cuda:N
    concurrency: int = _execution(2)  # the server runs one request at a time; 2 keeps it busy


@dataclass(frozen=True, kw_only=True)
class VLLMSettings(ServerSettings):
    """`vllm serve MODEL` on this GPU node: `model` is an HF id or a local path."""

    engine: ClassVar[str] = "vllm"

    concurrency: int = _execution(64)  # vLLM batches concurrent requests
    startup_timeout_sec: float = _execution(1800.0)  # big checkpoints load slowly
    tensor_parallel_size: int = _execution(1)
    data_parallel_size: int = _execution(1)
    max_model_len: int | None = None  # beyond the model's own context: rope scaling in hf_overrides
    quantization: str | None = None  # e.g. awq; unset: the checkpoint's own (from its config)
    hf_overrides: dict | None = None  # e.g. {rope_scaling: {rope_type: yarn, factor: 2.0, ...}}
    gpu_memory_utilization: float | None = _execution(None)
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    extra_args: list[str] = field(default_factory=list)  # appended to the command line as is
    vllm_executable: str = _execution("vllm")

    def __post_init__(self):
        super().__post_init__()
        from otbuild.engines.model_config import check_vllm_model

        check_vllm_model(self.model, self.quantization, self.max_model_len, self.hf_overrides)


SETTINGS: dict[str, type[ClientSettings]] = {
    c.engine: c for c in (OpenAISettings, TransformersSettings, VLLMSettings)
}


def identity_args(engine: str, args: dict) -> dict:
    """The launch settings in `args` that belong in a content id: not execution-only, not
    equal to the engine's default. Keys the engine does not know are kept (validate rejects them)."""
    known = {f.name: f for f in fields(SETTINGS[engine])} if engine in SETTINGS else {}
    out = {}
    for key, value in args.items():
        f = known.get(key)
        if f is not None and (f.metadata.get("execution_only") or value == _default(f)):
            continue
        out[key] = value
    return out


def _default(f):
    return f.default_factory() if f.default_factory is not MISSING else f.default


def engine_settings(section: dict) -> dict:
    """The keys of `section` (e.g. a recipe's teacher section) that its engine reads; a key
    left unset (None, e.g. a recipe's `concurrency`) takes the engine's own default."""
    cls = SETTINGS.get(section.get("engine"))
    known = {f.name for f in fields(cls)} | {"engine_args"} if cls else set()
    return {k: v for k, v in section.items() if (k in known and v is not None) or k == "engine"}


ORACLE_CONCURRENCY = 4  # the oracle has no server to keep busy: trials at once are sandboxes on a CPU


def concurrency(section: dict) -> int:
    """Requests (so trials) in flight for `section`: its `concurrency`, else its engine's default."""
    if section.get("concurrency"):
        return section["concurrency"]
    cls = SETTINGS.get(section.get("engine"))
    return _default(next(f for f in fields(cls) if f.name == "concurrency")) if cls else ORACLE_CONCURRENCY
