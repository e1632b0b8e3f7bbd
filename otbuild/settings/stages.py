"""The settings models that several stages' jobs (or the parts below the stages) share.

A stage's settings are its recipe section (the one definition of every field, its default and
its bounds) as it is, or plus what the plan adds: a source's name, the files and dataset commits
it resolved, the harness prompt style, the checkpoint an eval serves. Each stage names its model
in its own module (`STAGE = StageDef(...)`, otbuild/stages/); a model only that stage uses is
declared there (`SourceSettings`, `TraceImportSettings`, `EvalSettings`, ...). Here, each with who
shares it:
- `named_union` and what it adds (`Named`, the `*Planned` fields): a section of named entries as
  its job gets it, the source's and the trace import's settings;
- `RolloutSettings`: the rollout's settings, what stagekit's trials run (otbuild/stagekit/trials.py)
  and the base of the eval's;
- `SftSettings`, `RlSettings`: the training stages' settings, which their workers (otbuild/train/)
  read too;
- `ReportSettings`: what the plan writes (otbuild/plan/: report_settings) and the report stage
  reads; it cannot live in otbuild/report/, which imports the plan (report/data.py: BASE), without
  the two importing each other.
The plan writes them into the job's spec as JSON (`Node.spec()`); the runner validates them
back into the model (`StageDef.config`), so `run(cfg, inputs, outdir)` and the training
workers get typed settings with the schema's defaults, never a dict with defaults of their own.

A new setting is declared once, in its recipe section; the stage reads it as `cfg.NAME`.
"""

from __future__ import annotations

import typing
from typing import Annotated, Any, Union

from pydantic import Field, create_model

from otbuild.settings.base import Strict, resolved
from otbuild.settings.recipe import (
    NAME_RE,
    AgentModel,
    Price,
    PromptStyle,
)
from otbuild.settings.train import Rl, Sft


class Named(Strict):
    name: str = Field(pattern=NAME_RE, description="the section's key in the recipe")


class HubFilesPlanned(Strict):
    hub: dict[str, str] | None = resolved(
        description="the commit and files the plan resolved (otbuild/hub.py: HubFiles.planned())"
    )


class HarborTasksPlanned(Strict):
    root: str | None = resolved(description="where Harbor's downloaded tasks are looked up")
    tasks_digest: str | None = resolved(description="the digest of the task dirs the plan found")


PLANNED = {"hf-dataset": (HubFilesPlanned,), "harbor-dataset": (HarborTasksPlanned,)}


def named_union(union) -> Any:
    """Each kind of a discriminated union of sections, with its name and what the plan resolves."""

    def planned(section) -> tuple:
        kinds = typing.get_args(section.model_fields["kind"].annotation)
        return next((PLANNED[k] for k in kinds if k in PLANNED), ())

    sections = typing.get_args(typing.get_args(union)[0])
    jobs = tuple(create_model(s.__name__, __base__=(s, Named, *planned(s))) for s in sections)
    return Annotated[Union[jobs], Field(discriminator="kind")]  # noqa: UP007


class RolloutSettings(AgentModel, PromptStyle):
    """The teacher's section with the harness's prompt style: what a shard of trials runs
    (otbuild/stagekit/trials.py), the rollout's settings and the base of the eval's."""


class SftSettings(Sft, PromptStyle):
    """The sft section with the harness's prompt style (the chat format it trains on): what the
    sft stage and its training workers (otbuild/train/) read."""


class RlSettings(Rl, PromptStyle):
    """The rl section with the harness's prompt style its rollouts use: what the rl stage and
    its training workers (otbuild/train/rl/) read."""


class ReportNode(Strict):
    """A node of the recipe's plan, as the report reads its artifacts."""

    label: str
    stage: str
    id: str
    dir: str


class ReportSettings(Strict):
    """The report stage's settings: what the plan makes them of (otbuild/plan/: report_settings)
    and the report (otbuild/report/) reads."""

    recipe: str
    description: str = ""
    nodes: list[ReportNode]
    prices: dict[str, Price] | None = None
    resolved: dict[str, Any] = Field(default_factory=dict)  # what the recipe sets that enters its ids

    def identity_view(self, ident: dict) -> dict:
        """Prices count whole (both numbers, defaults included), as the report shows them."""
        return {**ident, "prices": {m: p.model_dump() for m, p in self.prices.items()}} if self.prices else ident
