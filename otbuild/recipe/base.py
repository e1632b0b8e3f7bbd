"""The base of every recipe section: strict (unknown keys are errors) and immutable."""

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
