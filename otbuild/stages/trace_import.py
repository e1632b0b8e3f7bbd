"""Trace import: existing trajectories as trace rows, beside the rollouts, for the trace filter."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeAlias

from pydantic import Field, model_validator

from otbuild.settings.recipe import (
    AtPath,
    FileSource,
    HarborTracesOptions,
    HubDataset,
    MessagesOptions,
    MiniSweAgentOptions,
    Name,
    SweAgentOptions,
)
from otbuild.settings.stages import named_union
from otbuild.sources import hub_files, where
from otbuild.stagekit import Inputs, StageDef, stage_run
from otbuild.tasks.table import Quarantined, check_not_empty, write_quarantine
from otbuild.traces.imports import PATH_FORMS, read_traces
from otbuild.traces.table import write_traces


class MiniSweAgentImport(FileSource, AtPath, MiniSweAgentOptions):
    """mini-swe-agent `.traj.json` files (a file or a folder)."""

    kind: Literal["mini-swe-agent"]


class SweAgentImport(FileSource, AtPath, SweAgentOptions):
    """SWE-agent `.traj` files (a file or a folder)."""

    kind: Literal["swe-agent"]


class MessagesImport(FileSource, AtPath, MessagesOptions):
    """OpenAI-style chats: JSONL (or parquet) rows with a `messages` list."""

    kind: Literal["messages-jsonl"]


class HarborTracesImport(FileSource, AtPath, HarborTracesOptions):
    """Harbor's trace export (`harbor traces export`: what OpenThoughts-Agent publishes its SFT
    sets as): parquet or JSONL rows, one per episode of each trial (otbuild/traces/imports/harbor_traces.py)."""

    kind: Literal["harbor-traces"]


class HfTraceImport(FileSource, HubDataset):
    """Trace files of a dataset on the Hugging Face Hub (or its local cache), read by one of
    the importers above (`format`); the revision is resolved to a commit when planned."""

    kind: Literal["hf-dataset"]
    format: Literal["messages-jsonl", "mini-swe-agent", "swe-agent", "harbor-traces"] = "messages-jsonl"
    # the format's options: None leaves the format's default (IMPORT_OPTIONS)
    episodes: Literal["last", "all"] | None = Field(default=None, description="format harbor-traces (default: its)")
    run_id: str | None = Field(default=None, description="default: the format's")
    model: str | None = Field(default=None, description="default: the format's")
    agent: str | None = Field(default=None, description="default: the format's")

    @model_validator(mode="after")
    def _episodes_for_harbor(self):
        if self.episodes is not None and self.format != "harbor-traces":
            raise ValueError(f"episodes applies to format harbor-traces, not {self.format}")
        return self


TraceImport = Annotated[
    MiniSweAgentImport | SweAgentImport | MessagesImport | HarborTracesImport | HfTraceImport,
    Field(discriminator="kind"),
]

# an import's section, as the recipe names it (`trace_imports.NAME`), with its name and what the
# plan resolves (a Hub dataset's commit and files)
if TYPE_CHECKING:  # made at run time (pydantic's create_model): Any to the type checker
    TraceImportSettings: TypeAlias = Any
else:
    TraceImportSettings = named_union(TraceImport)


@stage_run
def run(cfg: TraceImportSettings, inputs: Inputs, outdir: Path) -> dict:
    stats, files = {}, None
    if cfg.kind == "hf-dataset":  # files of a Hub dataset, each read by the importer of its format
        found = hub_files(cfg, PATH_FORMS[cfg.format])
        files, stats["hub"] = found.paths, found.identity()
    quarantined: list[Quarantined] = []  # small records; the traces are streamed to parquet

    def traces():
        for item in read_traces(cfg, files):
            if isinstance(item, Quarantined):
                quarantined.append(item)
            else:
                yield item

    written = write_traces(outdir / "traces.parquet", traces())
    check_not_empty(f"trace_imports.{cfg.name}", where(cfg), written, quarantined, cfg.allow_empty)
    name = f"import:{cfg.name}"
    return {
        "traces": written,
        "quarantined": write_quarantine(outdir / "quarantine.parquet", quarantined, name),
        "quarantined_by_reason": dict(Counter(q.reason for q in quarantined)),
        **stats,
    }


def estimate(m, n, e) -> None:
    """The traces its data says (a parquet's rows), else the default of a source's rows."""
    e.counts["traces"] = m.brought(n, e, ("source", "tasks"))


STAGE = StageDef(
    "trace_import",
    2,
    ("traces.parquet", "quarantine.parquet"),
    __name__,
    TraceImportSettings,
    section="trace_imports",
    plan="named",
    produces="traces",
    traces=True,
    recipe_field=(dict[Name, TraceImport], Field(default_factory=dict)),
    estimate=estimate,
)
