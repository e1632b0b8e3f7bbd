"""Report: settings {"recipe": NAME, "nodes": [{"label", "stage", "id", "dir"}, ...]} (every
node of the recipe's plan), inputs = those nodes' main outputs (so the report is rebuilt exactly
when an artifact changes) -> report.html (self-contained page) and dataset_card.md (README-style
card of the final trace set, or task set). The logic lives in otbuild/report/."""

from __future__ import annotations

from pathlib import Path

from otbuild.report import build
from otbuild.settings.stages import ReportSettings


def run(cfg: ReportSettings, inputs: list[Path], outdir: Path) -> dict:
    return build(cfg, Path(outdir))
