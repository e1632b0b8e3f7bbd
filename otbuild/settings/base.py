"""The base of every recipe section (strict: unknown keys are errors; immutable) and the rule
that turns a section into the part of a content id it owns.

The id rule (`identity`):
- A field marked `execution_only(...)` changes how a stage runs, not what it produces
  (shards, concurrency, client retries and timeouts, checkpoint cadence, launchers): it is
  never hashed, so changing it reuses what was built.
- Every other field is an identity field. It is hashed only when its value differs from its
  default, so adding a field with a default never changes an existing id, and spelling out a
  default gives the same id as leaving it out. Changing what a default means (or what a stage
  does with its settings) therefore needs a bump of the stage's version (otbuild/stages/).
- Fields marked `engine_args(of=...)` hold engine launch options: their keys are filtered by
  the same rule through the engine's model of them (`LAUNCH_OPTIONS`, `identity_args`).
"""

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.fields import FieldInfo

# Size bounds: a typo (`shards: 1000000000000`, `count: 1.0e+23`) is an error, not an endless build.
MAX_TASKS = 10_000_000  # tasks or rollouts one stage makes (the paper's largest set: 100K)
MAX_SHARDS = 10_000  # jobs per sharded stage
MAX_REPEATS = 1_000  # samples per task, eval repeats, surface forms per task
MAX_EPISODES = 10_000  # agent turns per trial

EXECUTION_ONLY = "execution_only"
ENGINE_ARGS_OF = "engine_args_of"
# engine -> the model of its launch options (the keys of an `engine_args` mapping), for each
# engine that starts a server; declared with the engines (otbuild/settings/engines.py)
LAUNCH_OPTIONS: dict[str, type[BaseModel]] = {}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def execution_only(default: Any, **kwargs) -> Any:
    """A field that does not change what a stage produces: never part of a content id."""
    return Field(default, json_schema_extra={EXECUTION_ONLY: True}, **kwargs)


def engine_args(of: str, **kwargs) -> Any:
    """Engine launch options (a mapping) for the engine named by the sibling field `of`."""
    return Field(default_factory=dict, json_schema_extra={ENGINE_ARGS_OF: of}, **kwargs)


def identity(section: BaseModel, exclude: set[str] | frozenset = frozenset()) -> dict:
    """The part of a content id that `section` owns (the rule in this module's docstring)."""
    out = {}
    for name, info in type(section).model_fields.items():
        if name in exclude or _execution_only(info):
            continue
        value = getattr(section, name)
        if of := _extra(info).get(ENGINE_ARGS_OF):
            value = identity_args(getattr(section, of), value)
        if not info.is_required() and value == info.get_default(call_default_factory=True):
            continue
        out[name] = _plain(value)
    return out


def identity_args(engine: str, args: dict) -> dict:
    """The launch options in `args` that belong in a content id: not execution-only, not equal
    to their default. Keys the engine's options do not declare are kept (validate rejects them)."""
    if args and not LAUNCH_OPTIONS:  # never an id without them: every key would count
        raise RuntimeError("the engines' launch options are not declared: import otbuild.settings.engines")
    known = LAUNCH_OPTIONS[engine].model_fields if engine in LAUNCH_OPTIONS else {}
    out = {}
    for key, value in args.items():
        info = known.get(key)
        if info is not None and (_execution_only(info) or value == info.get_default(call_default_factory=True)):
            continue
        out[key] = value
    return out


def _execution_only(info: FieldInfo) -> bool:
    return bool(_extra(info).get(EXECUTION_ONLY))


def _extra(info: FieldInfo) -> dict:
    return info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return identity(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
