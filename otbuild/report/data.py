"""What a report shows, read from the artifact dirs of a plan: provenance records (rows, stats,
settings), parquet outputs through DuckDB (mix per source, trace turns and rewards, eval
summaries, rankings) and the training logs (JSON lines per optimizer step).

`load(cfg)` takes the report stage's settings (`ReportSettings`: the recipe's name, every node
of the plan in topological order as label, stage, id and dir, the prices), and returns a
`Report`: one `Group` per candidate of an ablation (labels `candidates/<name>/...`) or one
group for a plain recipe, plus the ranking when there is one. Everything a section needs is
None or empty when the recipe has no such artifact; the page says so in one line.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otbuild import duck
from otbuild.artifact import PROVENANCE, REBUILD
from otbuild.plan import BASE
from otbuild.report import costs
from otbuild.stages import STAGES

CANDIDATES = "candidates/"
SEARCH = "search/"  # a search's candidates: search/STEP/NAME/...; its rankings and decisions: search/STEP/...
TRAIN_LOG = "train_log.jsonl"  # a training stage's per-step log (otbuild/train/checkpoint.py: LOG)
TABLE_COLUMNS = ("loss", "reward_mean", "pass_rate", "lr", "grad_norm")
PANEL_KEYS = ("lr", "grad_norm", "tokens_per_second")  # drawn small below a training curve


@dataclass
class Artifact:
    label: str  # the full label in the plan, e.g. "candidates/mix.order=shuffle/mix"
    local: str  # the label within its group, e.g. "mix"
    stage: str
    id: str
    dir: Path
    record: dict | None  # provenance.json, None when it is missing
    candidate: str | None = None  # an ablation candidate's name

    @property
    def rebuild(self) -> dict | None:
        """The last `otbuild audit --rebuild` of this artifact (when, and whether it matched)."""
        try:
            return json.loads((self.dir / REBUILD).read_text())
        except (OSError, ValueError):
            return None

    @property
    def stats(self) -> dict:
        return (self.record or {}).get("stats") or {}

    @property
    def settings(self) -> dict:
        return (self.record or {}).get("settings") or {}

    @property
    def main_output(self) -> Path:
        outs = STAGES[self.stage].outputs if self.stage in STAGES else ()
        if outs:
            return self.dir / outs[0]
        recorded = (self.record or {}).get("outputs") or [{}]
        return Path(recorded[0].get("path", self.dir))

    @property
    def rows(self) -> int | None:
        """Rows of the main output as its provenance record states them."""
        for o in (self.record or {}).get("outputs", []):
            if Path(o["path"]).name == self.main_output.name:
                return o.get("rows")
        return None

    @property
    def rejected(self) -> int | None:
        """Rows a filter rejected or a source quarantined (None: the stage drops nothing)."""
        if "rejected_by_reason" in self.stats:
            return self.stats.get("rejected")
        if "quarantined_by_reason" in self.stats:
            return self.stats.get("quarantined")
        return None

    @property
    def reasons(self) -> dict[str, int]:
        """Rows dropped per reason; a decontamination reason says which rules found them
        (`contaminated by B (exact 2, ngram 5)`: the task filter's per-rule counts)."""
        reasons = self.stats.get("rejected_by_reason") or self.stats.get("quarantined_by_reason") or {}
        rules = self.stats.get("contaminated") or {}
        return {_with_rules(r, rules): n for r, n in reasons.items()}


def _with_rules(reason: str, rules: dict[str, dict[str, int]]) -> str:
    found = rules.get(reason.removeprefix("contaminated by ")) if reason.startswith("contaminated by ") else None
    counts = ", ".join(f"{rule} {n}" for rule, n in (found or {}).items() if n)
    return f"{reason} ({counts})" if counts else reason


@dataclass
class Step:
    """One step of the funnel: the rows a stage (or several nodes of it, summed) produced."""

    name: str
    stage: str
    labels: list[str]
    rows: int | None
    rejected: int | None = None
    reasons: dict[str, int] = field(default_factory=dict)


@dataclass
class Curve:
    label: str
    path: Path
    metric: str  # the logged key plotted
    points: list[tuple[float, float]]
    summary: dict  # steps, first, last, min, max, tokens_seen...
    sample: list[dict]  # about 10 evenly spaced log lines (the last included) for the table
    columns: list[str]  # other logged values shown in that table
    panels: list[tuple[str, list[tuple[float, float]]]] = field(default_factory=list)  # PANEL_KEYS logged
    tracking: dict = field(default_factory=dict)  # the manifest's: TensorBoard event files, wandb run


@dataclass
class TraceSet:
    labels: list[str]
    paths: list[Path]
    rows: int
    turns: list[tuple[int, int]]  # (n_turns, traces)
    rewards: list[tuple[str, int]]  # (bin label, traces)
    reward_summary: dict
    turns_summary: dict
    teachers: list[tuple[str, int]]  # (teacher/model, traces)
    sources: list[tuple[str, int]]  # (source, traces)


@dataclass
class Group:
    name: str | None  # the candidate's name, None for a plain recipe
    artifacts: list[Artifact]
    funnel: list[Step] = field(default_factory=list)
    mix: dict | None = None  # label, rows per source
    sources: list[dict] = field(default_factory=list)
    filters: list[Artifact] = field(default_factory=list)
    teachers: list[Artifact] = field(default_factory=list)
    traces: TraceSet | None = None
    tasks: Artifact | None = None  # the final task set (what the card describes without traces)
    sft: Curve | None = None
    rl: Curve | None = None
    eval: list[dict] = field(default_factory=list)  # the student's summary rows, then the base's
    eval_label: str | None = None
    secrets: list[dict] = field(default_factory=list)  # per final table: label, path, rows, found (redaction)
    base_label: str | None = None  # `eval.base`: the untrained base's eval (its rows' `base` is true)

    @property
    def title(self) -> str:
        return f"candidate {self.name}" if self.name else "recipe"


@dataclass
class Report:
    recipe: str
    description: str
    artifacts: list[Artifact]
    groups: list[Group]
    ranking: list[dict] = field(default_factory=list)
    zscores: list[dict] = field(default_factory=list)
    ranking_label: str | None = None
    search: list[dict] = field(default_factory=list)  # a search's decisions, stage by stage (stages/decide.py)
    costs: costs.Costs = field(default_factory=costs.Costs)
    resolved: dict = field(default_factory=dict)  # what the recipe sets that enters its ids
    estimate: list[dict] = field(default_factory=list)  # otbuild.report.estimate.compare's rows
    estimate_made_at: str | None = None  # when `otbuild plan --estimate` made it
    estimate_notes: list[tuple[str, str]] = field(default_factory=list)  # (label, note) of its stages
    headline: Any = None  # otbuild.report.headline.Headline, set by otbuild.report.build


def artifacts(nodes, root: Path = Path(".")) -> list[Artifact]:
    """The report settings' nodes (`ReportNode`s) with their records (None where not built)."""
    arts = []
    for n in nodes:
        d = root / n.dir
        local, name = n.label, None
        if local.startswith(CANDIDATES):
            name, _, local = local[len(CANDIDATES) :].partition("/")
        elif local.startswith(SEARCH) and local.count("/") > 2:
            step, name, local = local[len(SEARCH) :].split("/", 2)
            name = f"stage {step}: {name}"
        arts.append(Artifact(n.label, local, n.stage, n.id, d, _record(d), name))
    return arts


def load(cfg, root: Path = Path(".")) -> Report:
    arts = artifacts(cfg.nodes, root)
    con = duck.connect()
    scans: dict[Path, dict[str, int]] = {}  # a table candidates share is scanned once
    groups = [_group(con, name, members, scans) for name, members in by_candidate(arts)]
    rep = Report(
        cfg.recipe, cfg.description, arts, groups, costs=costs.collect(arts, cfg.prices, root), resolved=cfg.resolved
    )
    from otbuild.report.estimate import compare, load_saved

    if saved := load_saved(cfg.recipe, root):  # not an input: shown as volatile (docs/estimate.md)
        rep.estimate, rep.estimate_made_at = compare(saved, arts, rep.costs, root), saved.get("made_at")
        rep.estimate_notes = [
            (label, note)
            for label, st in (saved.get("stages") or {}).items()
            for note in dict.fromkeys(st.get("notes") or [])
            if not note.startswith("built")
        ]
    rep.search = [
        {"label": a.label, **json.loads((a.dir / a.main_output.name).read_text())}
        for a in arts
        if STAGES[a.stage].checkpoint and a.record is not None
    ]
    rank = next((a for a in arts if STAGES[a.stage].ranks), None)
    if rank and not rep.search:  # a search's rankings are in its decisions
        outs = STAGES[rank.stage].outputs
        rep.ranking_label = rank.label
        rep.ranking = _rows(con, f"SELECT * FROM read_parquet({_lit(rank.dir / outs[0])}) ORDER BY rank, candidate")
        rep.zscores = _rows(
            con, f"SELECT * FROM read_parquet({_lit(rank.dir / outs[1])}) ORDER BY candidate, benchmark"
        )
    return rep


def by_candidate(arts: list[Artifact]) -> list[tuple[str | None, list[Artifact]]]:
    """The artifacts of each candidate of an ablation or a search (None: a plain recipe's), in
    plan order."""
    names = list(dict.fromkeys(a.candidate for a in arts if STAGES[a.stage].over != "grid"))
    return [(name, [a for a in arts if a.candidate == name]) for name in names]


def pipeline(arts: list[Artifact]) -> list[Artifact]:
    """The artifacts on the way from raw tasks to the trace set (not the eval's benchmarks)."""
    return [a for a in arts if a.stage in funnel() and not _is_benchmark(a)]


def funnel() -> list[str]:
    """The funnel's steps, in pipeline order (the registry's): the stages whose main output is
    a task or a trace table."""
    return [name for name, d in STAGES.items() if d.tasks or d.traces]


def final_tasks(arts: list[Artifact]) -> Artifact | None:
    """The task set the rollouts start from: the last task stage of the pipeline."""
    tasks = [a for a in pipeline(arts) if STAGES[a.stage].tasks]
    return tasks[-1] if tasks else None


def final_traces(arts: list[Artifact]) -> list[Artifact]:
    """The trace set: the trace filter's, else the rollouts and imported traces."""
    line = [a for a in pipeline(arts) if STAGES[a.stage].traces]
    return [a for a in line if STAGES[a.stage].filter] or line


def _record(d: Path) -> dict | None:
    try:
        return json.loads((d / PROVENANCE).read_text())
    except (OSError, ValueError):
        return None


def _lit(p: Path | str) -> str:
    return duck.sql_literal(str(p))


def _rows(con, sql: str) -> list[dict]:
    cur = con.execute(sql)
    cols = [c[0] for c in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def _is_benchmark(a: Artifact) -> bool:
    return a.local.startswith("benchmarks/")


def _group(con, name: str | None, arts: list[Artifact], scans: dict[Path, dict[str, int]] | None = None) -> Group:
    g = Group(name, arts)
    line = pipeline(arts)
    for stage in funnel():
        nodes = [a for a in line if a.stage == stage]
        if not nodes:
            continue
        rows = [a.rows for a in nodes]
        rejected = [a.rejected for a in nodes if a.rejected is not None]
        reasons: dict[str, int] = {}
        for a in nodes:
            for k, v in (a.reasons if a.rejected is not None else {}).items():
                reasons[k] = reasons.get(k, 0) + v
        group = nodes[0].local.split("/")[0] if "/" in nodes[0].local else stage  # sources/NAME: "sources"
        step_name = nodes[0].local if len(nodes) == 1 else f"{group} ({len(nodes)})"
        g.funnel.append(
            Step(
                step_name,
                stage,
                [a.local for a in nodes],
                total_rows(rows),
                sum(rejected) if rejected else None,
                reasons,
            )
        )
    g.sources = [_source_info(con, a) for a in line if STAGES[a.stage].brings == "tasks"]
    g.filters = [a for a in line if STAGES[a.stage].filter]
    g.teachers = [a for a in line if STAGES[a.stage].traces and not STAGES[a.stage].filter]
    mix = next((a for a in line if a.stage == "mix"), None)
    if mix and mix.main_output.exists():
        g.mix = {
            "label": mix.local,
            "settings": mix.settings,
            "sources": _rows(
                con,
                (
                    "SELECT source, count(*) AS rows, count(*) FILTER (WHERE mix_copy > 0) AS upsampled_copies, "
                    f"min(mix_rank) AS rank FROM read_parquet({_lit(mix.main_output)}) "
                    "GROUP BY source ORDER BY rank, source"
                ),
            ),
        }
    if trace_final := final_traces(arts):
        g.traces = _traces(con, trace_final)
    g.tasks = final_tasks(arts)
    g.secrets = secrets([*([g.tasks] if g.tasks else []), *trace_final], {} if scans is None else scans)
    for a in arts:
        if STAGES[a.stage].training and getattr(g, a.stage) is None and not is_base(a):  # the training sections
            setattr(g, a.stage, _curve(a, STAGES[a.stage].curve))
    for ev in evals(arts):
        if ev.main_output.exists():
            base = is_base(ev)
            sql = f"SELECT * FROM read_parquet({_lit(ev.main_output)}) ORDER BY benchmark, model"
            g.eval += [{**r, "base": base} for r in _rows(con, sql)]
            setattr(g, "base_label" if base else "eval_label", ev.local)
    return g


def secrets(tables: list[Artifact], scans: dict[Path, dict[str, int]]) -> list[dict]:
    """For each built table (the final task set, the trace set: what `otbuild publish` and the
    exports hand over), what redaction would take out of it, per pattern found: a lab sees a
    leak before it publishes. Scanned batch by batch (otbuild/tasks/redact.py: `scan`)."""
    from otbuild.tasks.redact import scan

    out = []
    for a in tables:
        path = a.main_output
        if not path.exists():
            continue
        if path not in scans:
            scans[path] = scan(path)
        out.append(
            {"label": a.local, "path": str(path), "rows": a.rows, "found": {k: n for k, n in scans[path].items() if n}}
        )
    return out


def is_base(a: Artifact) -> bool:
    """An artifact of `eval.base`'s untrained base (base/sft, base/eval), not the student's."""
    return a.local.startswith(BASE)


def trained() -> list[str]:
    """The stages that train a checkpoint: a section each, its curve (Group.sft, Group.rl)."""
    return [n for n, d in STAGES.items() if d.training]


def evals(arts: list[Artifact]) -> list[Artifact]:
    """The student's eval, then the untrained base's (`eval.base`), of those that are planned."""
    return sorted((a for a in arts if a.stage == "eval"), key=is_base)


def total_rows(counts: list[int | None]) -> int | None:
    """The sum of counts, None when one of them is not known."""
    return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)


def _source_info(con, a: Artifact) -> dict:
    """A source for the card: kind and settings, rows, quarantine, licences named in task metadata."""
    s, licences = a.settings, source_licences(con, a)
    return {
        "label": a.local,
        "name": s.get("name", a.local.split("/")[-1]),
        "kind": s.get("kind", "?"),
        "rows": a.rows,
        "quarantined": a.stats.get("quarantined", 0),
        "quarantined_by_reason": a.stats.get("quarantined_by_reason") or {},
        "settings": {k: v for k, v in s.items() if k not in ("name", "kind") and v is not None},
        "licences": licences,
        "id": a.id,
    }


def source_licences(con, a: Artifact) -> list[tuple[str, int]]:
    """The licences a source artifact names, with their rows: its `license` (or `licence`)
    setting, else each one its tasks' metadata records, most rows first."""
    s = a.settings
    for key in ("license", "licence"):
        if s.get(key):
            return [(str(s[key]), a.rows or 0)]
    if not a.main_output.exists():
        return []
    return con.execute(
        "SELECT lic, count(*) FROM (SELECT coalesce(json_extract_string(metadata, '$.license'), "
        "json_extract_string(metadata, '$.licence')) AS lic "
        f"FROM read_parquet({_lit(a.main_output)})) WHERE lic IS NOT NULL GROUP BY lic ORDER BY 2 DESC, 1"
    ).fetchall()


def _traces(con, nodes: list[Artifact]) -> TraceSet | None:
    paths = [a.main_output for a in nodes if a.main_output.exists()]
    if not paths:
        return None
    src = f"read_parquet([{', '.join(_lit(p) for p in paths)}], union_by_name = true)"
    cols = {r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {src}").fetchall()}
    rows = con.execute(f"SELECT count(*) FROM {src}").fetchone()[0]
    turns = (
        con.execute(f"SELECT n_turns, count(*) FROM {src} WHERE n_turns IS NOT NULL GROUP BY 1 ORDER BY 1").fetchall()
        if "n_turns" in cols
        else []
    )
    rewards, rsum = [], {}
    if "reward" in cols:
        lo, hi, mean, med, n = con.execute(
            f"SELECT min(reward), max(reward), avg(reward), median(reward), count(reward) FROM {src}"
        ).fetchone()
        rsum = {"traces": n, "mean": mean, "median": med, "min": lo, "max": hi, "missing": rows - n}
        distinct = con.execute(
            f"SELECT reward, count(*) FROM {src} WHERE reward IS NOT NULL GROUP BY 1 ORDER BY 1"
        ).fetchall()
        if len(distinct) <= 12:  # few values (pass/fail, partial credit): one bin per value
            rewards = [(_fmt(v), c) for v, c in distinct]
        else:
            rewards = _bins(con, src, lo, hi, 10)
    tsum = {}
    if turns:
        n = sum(c for _, c in turns)
        tsum = {"traces": n, "mean": sum(t * c for t, c in turns) / n, "min": turns[0][0], "max": turns[-1][0]}
    who = next((c for c in ("teacher", "model") if c in cols), None)
    teachers = con.execute(f"SELECT {who}, count(*) FROM {src} GROUP BY 1 ORDER BY 2 DESC, 1").fetchall() if who else []
    sources = (
        con.execute(f"SELECT source, count(*) FROM {src} GROUP BY 1 ORDER BY 2 DESC, 1").fetchall()
        if "source" in cols
        else []
    )
    return TraceSet(
        [a.local for a in nodes],
        paths,
        rows,
        turns,
        rewards,
        rsum,
        tsum,
        [(str(t), c) for t, c in teachers],
        [(str(s), c) for s, c in sources],
    )


def _bins(con, src: str, lo: float, hi: float, k: int) -> list[tuple[str, int]]:
    width = (hi - lo) / k
    counts = dict(
        con.execute(
            f"SELECT least(CAST(floor((reward - {lo!r}) / {width!r}) AS INTEGER), {k - 1}) AS b, count(*) "
            f"FROM {src} WHERE reward IS NOT NULL GROUP BY 1"
        ).fetchall()
    )
    return [(f"{_fmt(lo + i * width)}–{_fmt(lo + (i + 1) * width)}", counts.get(i, 0)) for i in range(k)]


def _fmt(v: float) -> str:
    return f"{v:.3g}"


def _curve(a: Artifact, keys: tuple[str, ...]) -> Curve | None:
    """The per-step log of a training dir: the first of `keys` that the log has, by step."""
    path, lines = train_log(a)
    if path is None:
        return None
    metric = next((k for k in keys if any(_finite(r.get(k)) for r in lines)), None)
    if metric is None:
        return None
    pts = _points(lines, metric)
    ys = [y for _, y in pts]
    summary = {"steps": len(pts), "first": ys[0], "last": ys[-1], "min": min(ys), "max": max(ys)}
    for k, shown in (
        ("epoch", "epoch"),
        ("tokens_seen", "tokens_seen"),
        ("supervised_tokens_seen", "supervised_tokens_seen"),
        ("time", "time (s)"),
    ):
        if lines and k in lines[-1]:
            summary[shown] = lines[-1][k]
    every = max(1, math.ceil(len(lines) / 10))
    sample = lines[::every] + ([lines[-1]] if (len(lines) - 1) % every else [])
    columns = [c for c in TABLE_COLUMNS if c != metric and any(c in r for r in sample)]
    panels = [(k, p) for k in PANEL_KEYS if k != metric and (p := _points(lines, k))]
    try:
        tracking = json.loads((a.dir / "checkpoint.json").read_text()).get("tracking") or {}
    except (OSError, ValueError, AttributeError):
        tracking = {}
    return Curve(a.local, path, metric, pts, summary, sample, columns, panels, tracking)


def train_log(a: Artifact) -> tuple[Path | None, list[dict]]:
    """A training dir's log and its lines (JSON objects, one per optimizer step)."""
    path = a.dir / TRAIN_LOG if (a.dir / TRAIN_LOG).exists() else None
    lines = []
    for raw in path.read_text().splitlines() if path else ():
        try:
            rec = json.loads(raw)
        except ValueError:
            continue  # a torn last line of a killed run
        if isinstance(rec, dict):
            lines.append(rec)
    return path, lines


def _points(lines: list[dict], key: str) -> list[tuple[float, float]]:
    return [(float(r.get("step", i + 1)), float(r[key])) for i, r in enumerate(lines) if _finite(r.get(key))]


def _finite(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
