"""What each stage receives: its settings model.

A stage's settings are its recipe section (otbuild/recipe/, otbuild/settings/engines.py: the
one definition of every field, its default and its bounds) plus what the plan adds: a source's name, the files
and dataset commits it resolved, the harness prompt style, the checkpoint an eval serves. The
plan writes them into the job's spec as JSON (`Node.spec()`); the runner validates them back
into the stage's model (`config`), so `run(cfg, inputs, outdir)` and the training workers get
typed settings with the schema's defaults, never a dict with defaults of their own.

A new setting is declared once, in its recipe section; the stage reads it as `cfg.NAME`.
"""

from __future__ import annotations

import typing
from functools import cache
from typing import Annotated, Any, Union

from pydantic import Field, TypeAdapter, create_model

from otbuild.settings.base import Strict
from otbuild.settings.recipe import (
    NAME_RE,
    Augment,
    Mix,
    Price,
    PromptStyle,
    RankBy,
    Source,
    TaskFilter,
    TaskScorer,
    Teacher,
    TraceFilter,
    TraceImport,
)
from otbuild.settings.train import Rl, Sft


class Named(Strict):
    name: str = Field(pattern=NAME_RE, description="the section's key in the recipe")


class HubFilesPlanned(Strict):
    hub: dict[str, str] | None = Field(default=None, description="the commit and files the plan resolved "
                                       "(otbuild/hub.py: HubFiles.planned())")


class HarborTasksPlanned(Strict):
    root: str | None = Field(default=None, description="where Harbor's downloaded tasks are looked up")
    tasks_digest: str | None = Field(default=None, description="the digest of the task dirs the plan found")


PLANNED = {"hf-dataset": (HubFilesPlanned,), "harbor-dataset": (HarborTasksPlanned,)}


def _named_union(union) -> Any:
    """Each kind of a discriminated union of sections, with its name and what the plan resolves."""
    def planned(section) -> tuple:
        kinds = typing.get_args(section.model_fields["kind"].annotation)
        return next((PLANNED[k] for k in kinds if k in PLANNED), ())

    sections = typing.get_args(typing.get_args(union)[0])
    jobs = tuple(create_model(s.__name__, __base__=(s, Named, *planned(s))) for s in sections)
    return Annotated[Union[jobs], Field(discriminator="kind")]  # noqa: UP007


SourceSettings = _named_union(Source)
TraceImportSettings = _named_union(TraceImport)


class MixSettings(Mix):
    sources: list[str] = Field(description="the Top-N sources, in input order")


class RolloutSettings(Teacher, PromptStyle):
    pass


class EvalSettings(Teacher, PromptStyle):
    """The model's engine settings (an engine section, or the checkpoint served by the eval's
    `serve_with`) with the eval's trial settings; `samples_per_task` is the eval's repeats."""

    model_label: str = Field(description="ENGINE:MODEL, as the scores name it")


class SftSettings(Sft, PromptStyle):
    pass


class RlSettings(Rl, PromptStyle):
    pass


class RankSettings(Strict):
    candidates: list[str] = Field(min_length=1)
    metric: RankBy = "pass_at_1"


class ReportNode(Strict):
    label: str
    stage: str
    id: str
    dir: str


class ReportSettings(Strict):
    recipe: str
    description: str = ""
    nodes: list[ReportNode]
    prices: dict[str, Price] | None = None
    resolved: dict[str, Any] = Field(default_factory=dict)  # what the recipe sets that enters its ids


SETTINGS: dict[str, Any] = {
    "source": SourceSettings, "mix": MixSettings, "augment": Augment, "task_score": TaskScorer,
    "task_filter": TaskFilter, "trace_import": TraceImportSettings, "rollout": RolloutSettings,
    "eval": EvalSettings, "rank": RankSettings, "sft": SftSettings, "rl": RlSettings, "report": ReportSettings,
    "trace_filter": TraceFilter,
}  # fmt: skip


@cache
def _adapter(stage: str) -> TypeAdapter:
    return TypeAdapter(SETTINGS[stage])


def config(stage: str, settings: dict) -> Any:
    """The typed settings of `stage` from a spec's plain settings (a ValidationError names the
    field when a spec does not fit: a plan and its stage out of step)."""
    return _adapter(stage).validate_python(settings)
