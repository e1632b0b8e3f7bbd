"""Where an estimate (`otbuild plan --estimate`, otbuild/estimate/) is kept, and how it compares
with what a build measured.

`otbuild plan --estimate NAME` saves its JSON to .otbuild/estimates/NAME.json (the project's build
state, beside the digest cache: not an artifact, so making an estimate rebuilds nothing). The
report of NAME, when built, reads it (if there) and shows estimate and actual side by side; that
section is volatile (docs/reproducibility.md): it is not part of what the report's inputs determine.
"""

from __future__ import annotations

import json
from pathlib import Path

from otbuild.stages import STAGES

ESTIMATES = Path(".otbuild") / "estimates"


def save(est, root: Path = Path(".")) -> Path:
    """Record the estimate where the recipe's report looks for it (.otbuild/estimates/RECIPE.json)."""
    from otbuild.fsio import atomic_path

    path = root / ESTIMATES / f"{est.recipe}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(est.json(), indent=1, sort_keys=False))
    return path


def load_saved(recipe: str, root: Path = Path(".")) -> dict | None:
    """The estimate last made for `recipe` (None when none was)."""
    try:
        return json.loads((root / ESTIMATES / f"{recipe}.json").read_text())
    except (OSError, ValueError):
        return None


def _stat(a, path: str):
    v = a.rows if path == "rows" else a.stats
    for part in path.split(".") if path != "rows" else ():
        v = v.get(part) if isinstance(v, dict) else None
    return v


def build_wall_seconds(arts, root: Path = Path(".")) -> float | None:
    """The recipe's jobs from the first one's start to the last one's end: each benchmark file is
    written when its job ends (its mtime) after `s` seconds of running."""
    from otbuild.report.costs import benchmark_files, read_benchmark

    spans = []
    for a in {(a.stage, a.id): a for a in arts}.values():
        for p in benchmark_files(a.stage, a.id, root):
            end = p.stat().st_mtime
            spans += [(end - j["s"], end) for j in read_benchmark(p)]
    return max(e for _, e in spans) - min(s for s, _ in spans) if spans else None


def compare(saved: dict, arts, costs, root: Path = Path(".")) -> list[dict]:
    """The estimate's figures beside what the build measured: per stage label its counts,
    requests, tokens, cost, GPU-hours and job seconds; in total the same and the wall time.
    Each row: label, metric, estimate, low, high, actual, error ((estimate - actual) / actual).
    Only what the estimate expected to build counts, in the totals too."""
    rows = []

    def row(label, metric, est, actual):
        if est is None or actual is None:
            return
        err = (est["estimate"] - actual) / actual if actual else None
        rows.append(
            {
                "label": label,
                "metric": metric,
                **{k: est[k] for k in ("estimate", "low", "high")},
                "actual": actual,
                "error": err,
            }
        )

    by_label = {a.label: a for a in arts}
    usage: dict[str, dict] = {}
    for u in costs.usage:
        d = usage.setdefault(u.label, {"requests": 0, "input_tokens": 0, "output_tokens": 0, "cost": None})
        for k in ("requests", "input_tokens", "output_tokens"):
            d[k] += getattr(u, k)
        if u.cost is not None:
            d["cost"] = (d["cost"] or 0) + u.cost
    runtime = {r.label: r for r in costs.runtimes}
    pending = [
        label
        for label, s in saved.get("stages", {}).items()
        if not s.get("built") and (a := by_label.get(label)) is not None and a.record is not None
    ]
    for label in pending:  # built since the estimate (what was built before cost nothing there)
        s, a = saved["stages"][label], by_label[label]
        for name, est in s["counts"].items():
            # the stage's counts a build's record holds (the registry's StageDef.counts)
            if (path := STAGES[s["stage"]].counts.get(name) if s["stage"] in STAGES else None) is not None:
                row(label, name, est, _stat(a, path))
        for k in ("requests", "input_tokens", "output_tokens", "cost"):
            if label in usage and (s[k] or {}).get("high"):
                row(label, k, s[k], usage[label][k])
        if label in runtime:
            row(label, "job_seconds", s["job_seconds"], runtime[label].seconds)
            if s["gpu_hours"]["high"]:
                row(label, "gpu_hours", s["gpu_hours"], runtime[label].gpu_hours)
    if not pending:
        return rows
    t = saved.get("total", {})
    for k in ("requests", "input_tokens", "output_tokens", "cost"):
        if (t.get(k) or {}).get("high"):
            row("total", k, t[k], sum(usage[label][k] or 0 for label in pending if label in usage))
    for k, field in (("gpu_hours", "gpu_hours"), ("job_seconds", "seconds")):
        if (t.get(k) or {}).get("high"):
            row("total", k, t[k], sum(getattr(runtime[label], field) for label in pending if label in runtime))
    row("total", "wall_seconds", t.get("wall_s"), build_wall_seconds([by_label[label] for label in pending], root))
    return rows
