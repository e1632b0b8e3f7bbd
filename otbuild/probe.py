"""`otbuild probe RECIPE`: each source's health before the run. A probe recipe is derived from
RECIPE (recipes/RECIPE_probe.yaml, a recipe like any other: built, cached and audited by its
content ids, so a second probe reuses what is built): every source of RECIPE (all of them, not
only those a mix takes), each a seeded sample of N tasks, then `task_check` (the recipe's section,
else its defaults, with the teacher's sandbox settings) and `difficulty` (the recipe's pilot,
else its teacher as the pilot with k = PILOT_K). Once built, the per-source table is read from
its artifacts (DuckDB, grouped by the tasks' `source` column) and written as probe.json and
probe.html beside its results view (docs/task-filter.md).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import yaml

from otbuild import duck
from otbuild.errors import ConfigError
from otbuild.estimate.pilot import Pilot, calibrate
from otbuild.fsio import atomic_path
from otbuild.plan import RESULTS, Plan
from otbuild.plan.planners import TEACHER_TRIALS
from otbuild.recipe.load import LoadedRecipe
from otbuild.stages import STAGES
from otbuild.stages.difficulty import BANDS, UNSCORED
from otbuild.traces import outcome as oc

SUFFIX = "_probe"
TASKS = 25  # tasks per source, by default (OpenThoughts-Agent's probes: 25 tasks each)
PILOT_K = 4  # the teacher's trials per task where the recipe has no difficulty section
MARK = "# written by `otbuild probe"  # how a probe knows the file is its own to rewrite
HEADER = MARK + " {name}` from recipes/{name}.yaml: do not edit (a probe rewrites it)\n"
# the pilot's and the solutions' trials that never reached a verdict for infrastructure reasons
ERRORS = (oc.INFRASTRUCTURE, oc.NOT_RUN)
TABLE = "read_parquet(?, union_by_name = true)"  # the files given as the query's parameter
PER_SOURCE = "SELECT source, count(*) FROM {t} GROUP BY 1"
PASS_RATE_OVER = "the pilot's scored trials of the valid tasks (binomial standard error over those trials)"


def probe_name(name: str) -> str:
    return f"{name}{SUFFIX}"


def probe_path(name: str, root: Path) -> Path:
    return Path(root) / "recipes" / f"{probe_name(name)}.yaml"


def derive(loaded: LoadedRecipe, tasks: int = TASKS, seed: int = 0) -> tuple[dict, str | None]:
    """The probe recipe's document, and who pilots it (None: no teacher or difficulty section,
    so only validation runs)."""
    data = loaded.data
    sources = data.get("sources") or {}
    if not sources:
        raise ConfigError(f"{loaded.path}: sources: the recipe has none: nothing to probe")
    doc: dict = {"description": f"{tasks} tasks of each source of {loaded.name}, validated and piloted"}
    # the prompt style its trials use; constrained decoding is for an eval of a trained checkpoint
    if harness := {k: v for k, v in (data.get("harness") or {}).items() if k != "constrained_decoding"}:
        doc["harness"] = harness
    if "prices" in data:
        doc["prices"] = data["prices"]
    doc["sources"] = {name: _sampled(src, tasks, seed) for name, src in sources.items()}
    teacher = data.get("teacher") or {}

    def where_the_teacher_runs(section: dict) -> dict:  # the plan's teacher_trials, as the recipe would get them
        return {**{k: teacher[k] for k in TEACHER_TRIALS if k in teacher}, **section}

    # a broken source is a finding here, not a failed build
    doc["task_check"] = {**where_the_teacher_runs(data.get("task_check") or {}), "max_dropped_fraction": 1.0}
    pilot: str | None = None
    if data.get("difficulty") is not None:
        doc["difficulty"] = {**where_the_teacher_runs(data["difficulty"]), "allow_all_impossible": True}
        d = doc["difficulty"]
        who = f"{d.get('engine')}:{d.get('model') or d.get('engine')}"
        pilot = f"the recipe's difficulty section ({who}, k={d.get('k', 8)})"
    elif teacher:
        fields = set(STAGES["difficulty"].settings.model_fields) - {"samples_per_task", "verify", "prompt"}
        doc["difficulty"] = {
            **{k: v for k, v in teacher.items() if k in fields},
            "k": PILOT_K,
            "allow_all_impossible": True,
        }
        who = f"{teacher.get('engine')}:{teacher.get('model') or teacher.get('engine')}"
        pilot = f"the recipe's teacher ({who}) with k={PILOT_K}: no difficulty section"
    return doc, pilot


def _sampled(src: dict, tasks: int, seed: int) -> dict:
    """A source cut to `tasks` of its tasks: a seeded sample (its stratification kept), or a
    generator's first `tasks` (synthetic: the same seed, a smaller count)."""
    src = dict(src)
    if src.get("kind") == "synthetic":
        src["count"] = min(int(src.get("count") or tasks), tasks)
        return src
    sample = {"n": tasks, "seed": seed}
    if isinstance(src.get("sample"), dict) and src["sample"].get("stratify"):
        sample["stratify"] = src["sample"]["stratify"]
    return {**src, "sample": sample}


def write_recipe(loaded: LoadedRecipe, root: Path, tasks: int = TASKS, seed: int = 0) -> tuple[Path, str | None]:
    """recipes/NAME_probe.yaml from `derive` (rewritten only when it changes); a file there that
    no probe wrote is left alone (ConfigError)."""
    doc, pilot = derive(loaded, tasks, seed)
    path = probe_path(loaded.name, root)
    header = HEADER.format(name=loaded.name)
    text = header + yaml.safe_dump(doc, sort_keys=False)
    if path.exists() and not path.read_text().startswith(MARK):
        raise ConfigError(f"{path}: a recipe no probe wrote has the probe's name; rename it to probe {loaded.name}")
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            tmp.write_text(text)
    return path, pilot


# the pilot's rates per trial that the teacher's rollouts take where the pilot is the teacher's model
TRIAL_RATES = (
    "turns_per_trial",
    "input_tokens_per_request",
    "output_tokens_per_request",
    "seconds_per_trial",
    "verifier_s_per_trial",
    "unverified_seconds_per_trial",
)


def as_pilot(plan: Plan, root: Path) -> Pilot:
    """The built probe as `plan --estimate`'s pilot: its stages' rates (task_check's keep rate and
    seconds per trial, the pilot's), and the pilot's rates per trial offered to the teacher's
    rollouts too (taken only where the teacher is the same model: estimate/pilot.py's match)."""
    pilot = calibrate(plan, root)
    for (stage, key), rates in list(pilot.measured.items()):
        if stage == "difficulty":
            lent = {k: v for k, v in rates.items() if k in TRIAL_RATES}
            pilot.measured.setdefault(("rollout", key), lent)
    return pilot


def _node(plan: Plan, stage: str):
    return next((n for n in plan.nodes if n.stage == stage), None)


def _files(root: Path, node, *names: str) -> list[str]:
    return [str(p) for name in names if node is not None and (p := root / node.dir / name).exists()]


def summarize(plan: Plan, root: Path, pilot: str | None) -> dict:
    """The built probe's per-source table: tasks probed; valid share and rejections per reason
    (task_check); the pilot's pass rate over the scored trials of the valid tasks with its standard
    error, band histogram, median turns and seconds per trial (difficulty); the infrastructure
    errors of every trial, by class. Each source gets `broken`: why it needs a look, else None."""
    con = duck.connect()
    con.execute(oc.sql_macros())
    sources = [n for n in plan.nodes if n.stage == "source"]
    checked, difficulty = _node(plan, "task_check"), _node(plan, "difficulty")
    rows: dict[str, dict] = {n.label.split("/", 1)[1]: {} for n in sources}

    def add(sql: str, files: list[str], put) -> None:
        for src, *values in con.execute(sql.format(t=TABLE), [files]).fetchall() if files else []:
            put(rows.setdefault(src, {}), *values)

    outputs = [f for n in sources for f in _files(root, n, n.main_output.name)]
    add(PER_SOURCE, outputs, lambda r, k: r.update(tasks=k))
    add(PER_SOURCE, _files(root, checked, "kept.parquet"), lambda r, k: r.update(valid=k))
    add(
        "SELECT source, split_part(reason, ':', 1), count(*) FROM {t} GROUP BY ALL ORDER BY ALL",
        _files(root, checked, "rejected.parquet"),
        lambda r, reason, k: r.setdefault("rejected", {}).update({reason: k}),
    )
    add(
        f"SELECT source, coalesce(band, '{UNSCORED}'), count(*) FROM {{t}} GROUP BY ALL",
        _files(root, difficulty, "tasks.parquet"),
        lambda r, band, k: r.setdefault("bands", {}).update({band: k}),
    )
    pilot_traces = _files(root, difficulty, "traces.parquet")
    unscored = oc.sql_in((*oc.EXCLUDED_FROM_SCORES, oc.UNVERIFIED))
    add(
        f"SELECT source, count(*), count(*) FILTER (o NOT IN {unscored}), count(*) FILTER (o = '{oc.PASSED}'), "
        "median(n_turns), median(duration_s) FROM (SELECT *, otb_outcome(result, exception, timed_out, reward) "
        "AS o FROM {t} WHERE NOT coalesce(is_subagent, false)) GROUP BY 1",
        pilot_traces,
        lambda r, *v: r.update(
            zip(("pilot_trials", "scored_trials", "passed_trials", "median_turns", "median_seconds"), v)
        ),
    )
    every = pilot_traces + _files(root, checked, "oracle/traces.parquet", "noop/traces.parquet")
    add(
        "SELECT source, otb_error(result, exception), count(*) FROM {t} WHERE "
        f"otb_outcome(result, exception, timed_out, reward) IN {oc.sql_in(ERRORS)} GROUP BY ALL ORDER BY 3 DESC, 2",
        every,
        lambda r, error, k: r.setdefault("errors", {}).update({error: k}),
    )
    add(PER_SOURCE, every, lambda r, k: r.update(trials=k))
    out = [_finish(name, r, checked is not None) for name, r in rows.items()]
    return {
        "recipe": plan.recipe.name.removesuffix(SUFFIX),
        "probe_recipe": plan.recipe.name,
        "pilot": pilot,
        "pass_rate_over": PASS_RATE_OVER,
        "sources": out,
        "broken": [r["source"] for r in out if r["broken"]],
    }


def _finish(source: str, r: dict, validated: bool) -> dict:
    """A source's row with its shares, standard error and why it is broken (None: it is not)."""
    tasks, valid = r.get("tasks", 0), r.get("valid", 0)
    scored, passed = r.get("scored_trials", 0), r.get("passed_trials", 0)
    p = passed / scored if scored else None
    errors = sum(r.get("errors", {}).values())
    row = {
        "source": source,
        "tasks": tasks,
        "valid": valid,
        "valid_rate": valid / tasks if tasks and validated else None,
        "rejected": r.get("rejected", {}),
        "pilot_trials": r.get("pilot_trials", 0),
        "scored_trials": scored,
        "passed_trials": passed,
        "pass_rate": p,
        "pass_rate_se": math.sqrt(p * (1 - p) / scored) if p is not None else None,
        "bands": {b: r.get("bands", {}).get(b, 0) for b in (*BANDS, UNSCORED)} if r.get("bands") else {},
        "errors": r.get("errors", {}),
        "trials": r.get("trials", 0),
        "median_turns": r.get("median_turns"),
        "median_seconds": r.get("median_seconds"),
    }
    row["broken"] = _why_broken(row, errors)
    return row


def _why_broken(r: dict, errors: int) -> str | None:
    """One line on why a source needs a look: no tasks, none valid, none passed, mostly errors."""
    if not r["tasks"]:
        return "no tasks: the source gave none"
    if r["valid_rate"] == 0:
        reason, k = max(r["rejected"].items(), key=lambda kv: kv[1], default=("?", 0))
        return f"0 of {r['tasks']} tasks valid: mostly {reason} ({k})"
    if r["trials"] and errors > r["trials"] / 2:
        cls, k = next(iter(r["errors"].items()))
        return f"{errors} of {r['trials']} trials ended in infrastructure errors (mostly {cls}: {k})"
    if r["scored_trials"] and not r["passed_trials"]:
        return f"the pilot passed 0 of {r['scored_trials']} scored trials"
    return None


def write(summary: dict, root: Path) -> tuple[Path, Path]:
    """results/NAME_probe/probe.json and probe.html."""
    from otbuild.report.page import render_probe

    out = Path(root) / RESULTS / summary["probe_recipe"]
    out.mkdir(parents=True, exist_ok=True)
    paths = out / "probe.json", out / "probe.html"
    for path, text in zip(paths, (json.dumps(summary, indent=1, default=str) + "\n", render_probe(summary))):
        with atomic_path(path) as tmp:
            tmp.write_text(text)
    return paths
