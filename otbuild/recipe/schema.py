"""The recipe schema: one strict pydantic model per stage's settings.

Unknown keys are errors everywhere (`extra="forbid"`); the loader turns pydantic's errors into
messages that name the file, the key path, what was found and what was expected.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

NAME_RE = r"^[A-Za-z_][A-Za-z0-9_]*$"
SCORE_COLUMN_RE = r"^(metadata\.)?[A-Za-z_][A-Za-z0-9_]*$"
FAMILIES = ("files", "text", "data", "archive", "python")

# Stages of the full pipeline, in DAG order. Only those with a schema below are built today;
# naming another one is a clear error, not a silently ignored key.
PIPELINE = ("sources", "mix", "augment", "task_filter", "teacher", "trace_filter", "sft", "rl", "eval")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SyntheticSource(Strict):
    """Procedurally generated terminal tasks (the embedded default source)."""

    kind: Literal["synthetic"]
    rank: int = Field(ge=1, description="position in the Top-N ranking used by `mix` (1 = best)")
    count: int = Field(ge=1)
    seed: int = 0
    families: list[Literal[FAMILIES]] | None = None  # type: ignore[valid-type]
    difficulties: list[Literal[1, 2, 3]] | None = None


class PathSource(Strict):
    """Tasks read from files: Harbor task dirs, an HF task parquet, or Terminal-Bench 1 dirs."""

    kind: Literal["harbor-dir", "harbor-parquet", "tb1-dir"]
    rank: int = Field(ge=1)
    path: str = Field(min_length=1, description="relative to the project root, or absolute")


Source = Annotated[SyntheticSource | PathSource, Field(discriminator="kind")]


class Mix(Strict):
    n: int = Field(ge=1, description="Top-N sources by rank")
    total: int = Field(ge=1, description="tasks in the mix; total/n from each source")
    order: Literal["shuffle", "round_robin"] = "shuffle"
    seed: int = 0


class Bounds(Strict):
    min: int | None = Field(default=None, ge=0)
    max: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _ordered(self):
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) must not exceed max ({self.max})")
        return self


class Sample(Strict):
    n: int = Field(ge=1)
    seed: int = 0


class Score(Strict):
    column: str = Field(pattern=SCORE_COLUMN_RE, description="a task column or metadata.KEY")
    top_k: int | None = Field(default=None, ge=1)
    weight: bool = False

    @model_validator(mode="after")
    def _one_mode(self):
        if (self.top_k is None) == (not self.weight):
            raise ValueError("set exactly one of top_k (keep the k best) or weight: true")
        return self


class TaskFilter(Strict):
    dedup: bool = True
    instruction_chars: Bounds | None = None
    include_regex: str | None = None
    exclude_regex: str | None = None
    score: Score | None = None
    sample: Sample | None = None

    @field_validator("include_regex", "exclude_regex")
    @classmethod
    def _regex(cls, v):
        if v is not None:
            try:
                re.compile(v)
            except re.error as e:
                raise ValueError(f"not a valid regular expression ({e})") from None
        return v


class Recipe(Strict):
    description: str = ""
    sources: dict[Annotated[str, Field(pattern=NAME_RE)], Source] = Field(min_length=1)
    mix: Mix | None = None
    task_filter: TaskFilter | None = None
