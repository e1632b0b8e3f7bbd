"""The base of every settings model (strict: unknown keys are errors; immutable), the size
bounds, and the markers the plan and the content-id rule read (otbuild/settings/identity.py):

- `execution_only(...)`: how a stage runs, not what it makes: never in an id;
- `external(...)`: names data outside the project (a path, a dataset's coordinates): a node's
  id holds what the plan found there (the content's digest, the commit), not the name;
- `resolved(...)`: what the plan found, told to the stage (a dataset's commit and files): in
  the id through the external fields it resolves, never itself;
- `plan_only(...)`: read by the plan (a source's rank orders the mix; augment's `sources` and
  task_filter's `llm` make nodes of their own): the stage neither gets it nor hashes it;
- `engine_args(of=...)`: an engine's launch options, filtered by the same rule through that
  engine's model of them;
- `re2()`: a regular expression the SQL runs, checked by the recipe loader through DuckDB."""

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.fields import FieldInfo

# Size bounds: a typo (`shards: 1000000000000`, `count: 1.0e+23`) is an error, not an endless build.
MAX_TASKS = 10_000_000  # tasks or rollouts one stage makes (the paper's largest set: 100K)
MAX_SHARDS = 10_000  # jobs per sharded stage
MAX_REPEATS = 1_000  # samples per task, eval repeats, surface forms per task
MAX_EPISODES = 10_000  # agent turns per trial

ROLE = "role"  # json_schema_extra key: execution_only, external, resolved or plan_only
EXECUTION_ONLY, EXTERNAL, RESOLVED, PLAN_ONLY = "execution_only", "external", "resolved", "plan_only"
ENGINE_ARGS_OF = "engine_args_of"
RE2 = "re2"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def execution_only(default: Any, **kwargs) -> Any:
    """A field that does not change what a stage produces: never part of a content id."""
    return _with_role(EXECUTION_ONLY, default, **kwargs)


def external(default: Any = ..., **kwargs) -> Any:
    """A field naming data outside the project: a node's id holds what the plan found there."""
    return _with_role(EXTERNAL, default, **kwargs)


def resolved(default: Any = None, **kwargs) -> Any:
    """A field the plan fills with what it resolved, for the stage: not itself in the id."""
    return _with_role(RESOLVED, default, **kwargs)


def plan_only(default: Any, **kwargs) -> Any:
    """A field the plan reads: not passed to the stage, not in its id."""
    return _with_role(PLAN_ONLY, default, **kwargs)


def _with_role(role: str, default: Any, **kwargs) -> Any:
    return Field(default, json_schema_extra={ROLE: role}, **kwargs)


def engine_args(of: str, **kwargs) -> Any:
    """Engine launch options (a mapping) for the engine named by the sibling field `of`."""
    return Field(default_factory=dict, json_schema_extra={ENGINE_ARGS_OF: of}, **kwargs)


def re2(**kwargs) -> Any:
    """A regular expression the SQL runs (None: unset): the recipe loader has DuckDB check its
    RE2 syntax (no lookarounds, no backreferences), with the file and key."""
    return Field(None, json_schema_extra={RE2: True}, **kwargs)


class Sharded(Strict):
    """A stage whose work is split into shard jobs (each resumes where it stopped), then merged."""

    shards: int = execution_only(
        1, ge=1, le=MAX_SHARDS, description="separate Snakemake jobs that resume (Slurm fans them out)"
    )


def role(info: FieldInfo) -> str | None:
    """A field's marker (EXECUTION_ONLY, EXTERNAL, RESOLVED, PLAN_ONLY), None for an identity field."""
    return field_extra(info).get(ROLE)


def fields_with(model: type[BaseModel], *roles: str) -> set[str]:
    return {name for name, info in model.model_fields.items() if role(info) in roles}


def field_extra(info: FieldInfo) -> dict:
    return info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
