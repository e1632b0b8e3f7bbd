"""The rule that turns settings into the part of a content id they own.

- A field marked `execution_only(...)` changes how a stage runs, not what it produces
  (shards, concurrency, client retries and timeouts, checkpoint cadence, launchers): it is
  never hashed, so changing it reuses what was built.
- Every other field is an identity field. It is hashed only when its value differs from its
  default, so adding a field with a default never changes an existing id, and spelling out a
  default gives the same id as leaving it out. Changing what a default means (or what a stage
  does with its settings) therefore needs a bump of the stage's version (otbuild/stages/).
- Fields marked `engine_args(of=...)` hold engine launch options: their keys are filtered by
  the same rule through the engine's model of them (`LAUNCH_OPTIONS`).
- A plan node's settings (`found` given): fields marked `external` (where data lies) and
  `resolved` (what the plan told the stage) are left out and `found` goes in, what the plan
  found there (a file's digest, a dataset's commit or version, or what is missing); a model
  whose id is shaped otherwise says so in `identity_view` (the eval's: its recipe section's).
"""

from typing import Any

from pydantic import BaseModel

from otbuild.settings.base import ENGINE_ARGS_OF, EXECUTION_ONLY, EXTERNAL, PLAN_ONLY, RESOLVED, field_extra, role
from otbuild.settings.engines import LAUNCH_OPTIONS


def identity(section: BaseModel, found: dict | None = None) -> dict:
    """The part of a content id that `section` owns (the rule in this module's docstring)."""
    skip = (EXECUTION_ONLY,) if found is None else (EXECUTION_ONLY, EXTERNAL, RESOLVED, PLAN_ONLY)
    out = {}
    for name, info in type(section).model_fields.items():
        if role(info) in skip:
            continue
        value = getattr(section, name)
        if of := field_extra(info).get(ENGINE_ARGS_OF):
            value = identity_args(getattr(section, of), value)
        if not info.is_required() and value == info.get_default(call_default_factory=True):
            continue
        out[name] = _plain(value)
    if found is None:
        return out
    view = getattr(section, "identity_view", None)
    return {**(view(out) if view else out), **found}


def identity_args(engine: str, args: dict) -> dict:
    """The launch options in `args` that belong in a content id: not execution-only, not equal
    to their default. Keys the engine's options do not declare are kept (validate rejects them)."""
    known = LAUNCH_OPTIONS[engine].model_fields if engine in LAUNCH_OPTIONS else {}
    out = {}
    for key, value in args.items():
        info = known.get(key)
        if info is not None and (role(info) == EXECUTION_ONLY or value == info.get_default(call_default_factory=True)):
            continue
        out[key] = value
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return identity(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
