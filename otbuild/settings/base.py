"""The base of every settings model (strict: unknown keys are errors; immutable), the size
bounds, and the markers the content-id rule reads (otbuild/settings/identity.py): fields made
with `execution_only(...)` never enter an id; fields made with `engine_args(of=...)` hold an
engine's launch options, filtered by the same rule through that engine's model of them."""

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
RE2 = "re2"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def execution_only(default: Any, **kwargs) -> Any:
    """A field that does not change what a stage produces: never part of a content id."""
    return Field(default, json_schema_extra={EXECUTION_ONLY: True}, **kwargs)


def engine_args(of: str, **kwargs) -> Any:
    """Engine launch options (a mapping) for the engine named by the sibling field `of`."""
    return Field(default_factory=dict, json_schema_extra={ENGINE_ARGS_OF: of}, **kwargs)


def re2(**kwargs) -> Any:
    """A regular expression the SQL runs (None: unset): the recipe loader has DuckDB check its
    RE2 syntax (no lookarounds, no backreferences), with the file and key."""
    return Field(None, json_schema_extra={RE2: True}, **kwargs)


def is_execution_only(info: FieldInfo) -> bool:
    return bool(field_extra(info).get(EXECUTION_ONLY))


def field_extra(info: FieldInfo) -> dict:
    return info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
