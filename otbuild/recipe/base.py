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
- Fields marked `engine_args(of=...)` hold engine launch settings: their keys are filtered by
  the same rule through the engine's settings (otbuild/engines/settings.py).
"""

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# Size bounds: a typo (`shards: 1000000000000`, `count: 1.0e+23`) is an error, not an endless build.
MAX_TASKS = 10_000_000  # tasks or rollouts one stage makes (the paper's largest set: 100K)
MAX_SHARDS = 10_000  # jobs per sharded stage
MAX_REPEATS = 1_000  # samples per task, eval repeats, surface forms per task
MAX_EPISODES = 10_000  # agent turns per trial

EXECUTION_ONLY = "execution_only"
ENGINE_ARGS_OF = "engine_args_of"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def execution_only(default: Any, **kwargs) -> Any:
    """A field that does not change what a stage produces: never part of a content id."""
    return Field(default, json_schema_extra={EXECUTION_ONLY: True}, **kwargs)


def engine_args(of: str, **kwargs) -> Any:
    """Engine launch settings (a mapping) for the engine named by the sibling field `of`."""
    return Field(default_factory=dict, json_schema_extra={ENGINE_ARGS_OF: of}, **kwargs)


def identity(section: BaseModel, exclude: set[str] | frozenset = frozenset()) -> dict:
    """The part of a content id that `section` owns (the rule in this module's docstring)."""
    from otbuild.engines.settings import identity_args

    out = {}
    for name, info in type(section).model_fields.items():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        if name in exclude or extra.get(EXECUTION_ONLY):
            continue
        value = getattr(section, name)
        if ENGINE_ARGS_OF in extra:
            value = identity_args(getattr(section, extra[ENGINE_ARGS_OF]), value)
        if not info.is_required() and value == info.get_default(call_default_factory=True):
            continue
        out[name] = _plain(value)
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return identity(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
