"""Reports: one self-contained HTML page per recipe (row-count funnel, per-source mix, turn
and reward distributions, training curves, eval scores, ablation ranking) and a dataset card
for its trace set (or task set). See docs/reports.md. This package is also the `report` stage
(`run`, `STAGE`, registered in otbuild/stages/): its settings name every node of the recipe's
plan, its inputs are their main outputs (so the report is rebuilt exactly when an artifact
changes). The registry imports this module: what it needs beyond its settings is imported
inside `build`.

  data.py    what the page shows, read from artifact dirs (provenance, parquet, train logs)
  charts.py  inline SVG charts (bars with error bars, columns, lines)
  page.py    the page and the card, from templates/ (jinja2)
  captions/  reStructuredText captions for Snakemake's `report()` flags
"""

from __future__ import annotations

from pathlib import Path

from otbuild.settings.stages import ReportSettings
from otbuild.stagekit import RESULTS, Inputs, StageDef, stage_run

CAPTIONS = Path(__file__).parent / "captions"
HTML = "report.html"
CARD = "dataset_card.md"
# The page's links to the records are relative to where it is read: artifacts/report/<id>/ and
# results/<recipe>/report/ both lie three folders below the project (and so a rebuild of the
# report elsewhere writes the same bytes).
RECORD_LINKS_UP = "../../../"


@stage_run
def run(cfg: ReportSettings, inputs: Inputs, outdir: Path) -> dict:
    """The report stage: the inputs are read through the settings' nodes."""
    return build(cfg, Path(outdir))


def build(cfg, outdir: Path, root: Path = Path(".")) -> dict:
    """Write OUTDIR/report.html and OUTDIR/dataset_card.md for the report stage's settings
    (ReportSettings, made by `otbuild.plan.report_settings`); return the stage's stats."""
    from otbuild.fsio import atomic_path
    from otbuild.report.data import load, trained
    from otbuild.report.headline import headline
    from otbuild.report.page import render_card, render_html

    rep = load(cfg, root)
    rep.headline = headline(cfg.recipe, rep.artifacts, rep.costs, rep.ranking)
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    html, card = render_html(rep, RECORD_LINKS_UP), render_card(rep)
    for name, text in ((HTML, html), (CARD, card)):
        with atomic_path(outdir / name) as tmp:
            tmp.write_text(text, encoding="utf-8")
    sections = {
        "funnel": any(g.funnel for g in rep.groups),
        "mix": any(g.mix for g in rep.groups),
        "traces": any(g.traces for g in rep.groups),
        **{n: any(getattr(g, n, None) for g in rep.groups) for n in trained()},
        "eval": any(g.eval for g in rep.groups),
        "ranking": bool(rep.ranking),
    }
    missing = [a.label for a in rep.artifacts if a.record is None]
    found: dict[str, int] = {}  # per pattern, over the tables scanned (each once)
    for counts in {s["path"]: s["found"] for g in rep.groups for s in g.secrets}.values():
        for k, n in counts.items():
            found[k] = found.get(k, 0) + n
    return {
        "groups": len(rep.groups),
        "sections": sections,
        "artifacts": len(rep.artifacts),
        "flags": rep.headline.warnings,
        "artifacts_without_record": missing,
        "secrets_found": found,
        "costs": rep.costs.total,
        "html_bytes": len(html.encode()),
        "card_bytes": len(card.encode()),
    }


# every recipe ends in its report, over every node of its plan (otbuild/plan/planners.py: every_node)
STAGE = StageDef(
    "report",
    2,
    (HTML, CARD),
    __name__,
    ReportSettings,
    plan="every_node",
    over="plan",
    local=True,
    reported=((HTML, RESULTS), (CARD, RESULTS)),
    estimate="table",
)
