"""The report page (one self-contained HTML file: inline CSS and SVG, no JS, nothing fetched)
and the dataset card (README-style markdown with HF front matter), both from jinja2 templates
in otbuild/report/templates/ over a `Report` (otbuild/report/data.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jinja2
import yaml
from markupsafe import Markup

import otbuild
from otbuild.artifact import PROVENANCE
from otbuild.progress import duration
from otbuild.report import charts
from otbuild.report.data import Group, Report, trained
from otbuild.train.checkpoint import VOLATILE_LOG_KEYS

TEMPLATES = Path(__file__).parent / "templates"
# What the page and the card show that a rebuild from the same inputs does not give again (the
# jobs' runtimes and throughput, the rebuild results) sits between these markers, which
# `otbuild audit --rebuild` sets aside (docs/reproducibility.md).
VOLATILE_BEGIN, VOLATILE_END = "<!-- otbuild:volatile -->", "<!-- /otbuild:volatile -->"
_html = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_md = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES),
    autoescape=False,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)
for _env in (_html, _md):
    _env.filters["num"] = charts.num
    _env.globals.update(
        volatile_begin=Markup(VOLATILE_BEGIN),
        volatile_end=Markup(VOLATILE_END),
        volatile_log_keys=tuple(VOLATILE_LOG_KEYS),
    )


def _md_cell(value) -> str:
    """Text from data in a markdown table cell: one line, pipes and HTML escaped."""
    s = "" if value is None else str(value)
    s = re.sub(r"\s+", " ", s).strip()
    return s.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("`", "\\`")


_md.filters["cell"] = _md_cell
_md.filters["json"] = lambda v: _md_cell(v if isinstance(v, str) else json.dumps(v, separators=(", ", ": ")))
_md.filters["num"] = lambda v: _md_cell(charts.num(v))


def render_html(rep: Report, up: str | None = None) -> str:
    """The page; `up` is the way from the page's folder to the project root (`../../../` from
    artifacts/report/<id>/ and from results/<recipe>/report/ alike), for the links to each
    artifact's record (None: absolute file links)."""
    groups = [_group_charts(g) for g in rep.groups]
    ranking = None
    if rep.ranking:
        ranking = charts.bars(
            [(r["candidate"], r["mean_z"] or 0.0) for r in rep.ranking], title="mean z-score per candidate"
        )
    search = [
        charts.bars(
            [
                (("chosen: " if c["name"] == d["winner"] else "") + c["name"], c["score"] or 0.0)
                for c in d["candidates"]
            ],
            errors=[c["stderr"] for c in d["candidates"]],
            title=f"stage {d['step']}: {d['metric']} per candidate (mean ± standard error)",
        )
        for d in rep.search
    ]
    head = rep.headline
    flags: dict[tuple, list[str]] = {}
    for name, f in head.flags:
        flags.setdefault((name, f.section), []).append(f"{f.label}: {f.text}")
    benchmarks = list(dict.fromkeys(s.benchmark for p in head.parts for s in p.scores))

    def record(a) -> str:
        rel = Path(a.dir) / PROVENANCE
        return up + rel.as_posix() if up is not None and not rel.is_absolute() else rel.resolve().as_uri()

    resolved = yaml.safe_dump(rep.resolved, sort_keys=True, allow_unicode=True) if rep.resolved else ""
    return _html.get_template("report.html.j2").render(
        rep=rep,
        groups=groups,
        ranking_chart=ranking,
        search_charts=search,
        css=Markup((TEMPLATES / "report.css").read_text()),
        version=otbuild.__version__,
        anchor=_anchor,
        amount=amount,
        duration=duration,
        head=head,
        flags=flags,
        benchmarks=benchmarks,
        record=record,
        resolved=resolved,
    )


def amount(v: float | None) -> str:
    """A cost or GPU-hours: two decimals from 0.01 up, else two significant digits; – for None."""
    return "–" if v is None else f"{v:,.2f}" if v >= 0.01 or v == 0 else f"{v:.2g}"


def _anchor(*parts) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", "-".join(str(p) for p in parts if p)).strip("-").lower()


def _group_charts(g: Group) -> dict:
    training = trained()
    c: dict = dict.fromkeys(("funnel", "mix", "turns", "rewards", *training, "eval")) | {"g": g}
    if g.funnel:
        c["funnel"] = charts.bars([(s.name, s.rows or 0) for s in g.funnel], title="rows per stage")
    if g.mix:
        c["mix"] = charts.bars([(r["source"], r["rows"]) for r in g.mix["sources"]], title="mixed tasks per source")
    if g.traces and g.traces.turns:
        c["turns"] = charts.columns(
            [(str(t), n) for t, n in g.traces.turns], title="traces per turn count", xlabel="turns", ylabel="traces"
        )
    if g.traces and g.traces.rewards:
        c["rewards"] = charts.columns(g.traces.rewards, title="traces per reward", xlabel="reward", ylabel="traces")
    for key in training:
        if cv := getattr(g, key, None):
            name = key.upper()
            c[key] = charts.line(cv.points, title=f"{name} {cv.metric} per step", xlabel="step", ylabel=cv.metric)
            c[f"{key}_panels"] = [
                charts.line(pts, title=f"{name} {k} per step", xlabel="step", ylabel=k, width=360, height=220)
                for k, pts in cv.panels
            ]
    if g.eval:
        c["eval"] = charts.bars(
            [(_bench_label(r, g.eval), r["mean"] or 0.0) for r in g.eval],
            errors=[r["stderr"] for r in g.eval],
            title="eval score per benchmark (mean ± standard error)",
            domain=(0.0, 1.0),
        )
    return c


def _bench_label(row: dict, rows: list[dict]) -> str:
    """A benchmark's name, with the model where several answered; the untrained base's (`eval.base`) as such."""
    if row.get("base"):
        return f"{row['benchmark']} (untrained base)"
    models = {r["model"] for r in rows if not r.get("base")}
    return row["benchmark"] if len(models) <= 1 else f"{row['benchmark']} ({row['model']})"


def render_card(rep: Report) -> str:
    licences = sorted({lic for g in rep.groups for s in g.sources for lic, _ in s["licences"]})
    rows = max([g.traces.rows if g.traces else (g.tasks.rows or 0) if g.tasks else 0 for g in rep.groups] + [0])
    front = {
        "pretty_name": f"otbuild {rep.recipe}",
        **hub_metadata(licences),
        "tags": ["otbuild", "agentic", "terminal", "traces" if any(g.traces for g in rep.groups) else "tasks"],
        "size_categories": [size_category(rows)],
    }
    best = rep.ranking[0]["candidate"] if rep.ranking else None
    return _md.get_template("dataset_card.md.j2").render(
        rep=rep,
        front=yaml.safe_dump(front, sort_keys=False).strip(),
        best=best,
        licences=licences,
        version=otbuild.__version__,
        nonnull=_nonnull,
    )


def hub_metadata(licences: list[str]) -> dict:
    """A dataset card's Hub metadata (huggingface_hub's DatasetCardData names): `license` is the
    one licence the sources record, all of them when they differ, `unknown` when none does;
    agentic tasks and traces are English text generation."""
    return {
        "license": licences[0] if len(licences) == 1 else (licences or "unknown"),
        "task_categories": ["text-generation"],
        "language": ["en"],
    }


# The Hub's size_categories (dataset-card metadata), by upper bound. Its names leave the bounds
# open and the Hub sets no rule for a count on one: here a bucket holds its lower bound
# (10_000_000 rows: "10M<n<100M"), so every count has exactly one name.
SIZE_CATEGORIES = (
    (1_000, "n<1K"),
    (10_000, "1K<n<10K"),
    (100_000, "10K<n<100K"),
    (1_000_000, "100K<n<1M"),
    (10_000_000, "1M<n<10M"),
    (100_000_000, "10M<n<100M"),
    (1_000_000_000, "100M<n<1B"),
    (10_000_000_000, "1B<n<10B"),
    (100_000_000_000, "10B<n<100B"),
    (1_000_000_000_000, "100B<n<1T"),
)


def size_category(rows: int) -> str:
    """A dataset card's `size_categories` value for `rows` rows."""
    return next((name for bound, name in SIZE_CATEGORIES if rows < bound), "n>1T")


def _nonnull(settings: dict, skip: tuple[str, ...] = ()) -> dict:
    return {k: v for k, v in settings.items() if v not in (None, False, {}, []) and k not in skip}


def render_probe(summary: dict) -> str:
    """`otbuild probe`'s page (otbuild/probe.py): the per-source table, a broken source's row red
    with its one-line why."""
    return _html.get_template("probe.html.j2").render(
        p=summary, css=Markup((TEMPLATES / "report.css").read_text()), version=otbuild.__version__
    )
