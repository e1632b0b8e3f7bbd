"""`otbuild probe`: each source's health before the run. A real probe of a tiny project (two
synthetic sources and a harbor-dir source whose solutions were sabotaged) under bwrap with the
oracle as the pilot, built by snakemake; its page in headless Chromium; `plan --estimate` taking
its rates; a second probe building nothing. The recipe's derivation and the verdicts on their own."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml

from otbuild.errors import ConfigError
from otbuild.probe import PILOT_K, _finish, derive, write_recipe
from otbuild.recipe.load import load_recipe
from otbuild.sandbox import backend_problem
from otbuild.sources.synthetic import generate
from otbuild.tasks.export import export_tasks
from otbuild.tasks.table import write_tasks
from tests.conftest import job_counts, make_project, otbuild
from tests.report.test_report import CHROMIUM, chromium, png_size

needs_sandbox = pytest.mark.skipif(backend_problem("bwrap") is not None, reason="bubblewrap unusable here")

RECIPE = """\
sources:
  files: {kind: synthetic, rank: 1, count: 6, seed: 1, families: [files], difficulties: [1]}
  text: {kind: synthetic, rank: 2, count: 6, seed: 2, families: [text], difficulties: [1]}
  broken: {kind: harbor-dir, rank: 3, path: broken_tasks, sample: {n: 5, seed: 3}}
mix: {n: 1, total: 4}
task_check: {}
teacher: {engine: oracle, sandbox: bwrap, concurrency: 2, max_episodes: 40, verify: true}
"""


def _project(tmp_path: Path, text: str = RECIPE) -> Path:
    """A project whose recipe `tiny` has three sources; `broken`'s tasks are Harbor task dirs whose
    solve.sh does nothing, so every one of them fails validation (solution_fails)."""
    project = make_project(tmp_path)
    records = list(generate(4, 9, families=["python"], difficulties=[1]))
    write_tasks(tmp_path / "broken.parquet", records, source="broken")
    export_tasks(tmp_path / "broken.parquet", project / "broken_tasks")
    for d in (project / "broken_tasks").iterdir():
        (d / "solution" / "solve.sh").write_text("#!/bin/bash\ntrue\n")
    (project / "recipes" / "tiny.yaml").write_text(text)
    return project


def test_the_probe_recipe_samples_every_source_and_pilots_with_the_teacher(tmp_path):
    project = _project(tmp_path)
    doc, pilot = derive(load_recipe("tiny", project), tasks=3, seed=7)
    assert list(doc["sources"]) == ["files", "text", "broken"]  # all of them, not the mix's Top-1
    assert doc["sources"]["files"]["count"] == 3 and doc["sources"]["broken"]["sample"] == {"n": 3, "seed": 7}
    assert doc["task_check"] == {"sandbox": "bwrap", "max_dropped_fraction": 1.0}  # the teacher's sandbox
    assert doc["difficulty"] == {
        "engine": "oracle",
        "sandbox": "bwrap",
        "concurrency": 2,
        "max_episodes": 40,
        "k": PILOT_K,
        "allow_all_impossible": True,
    }
    assert "teacher" not in doc and "mix" not in doc and pilot.startswith("the recipe's teacher (oracle:oracle)")
    own = RECIPE + "difficulty: {engine: oracle, k: 2}\n"
    (project / "recipes" / "tiny.yaml").write_text(own)
    doc, pilot = derive(load_recipe("tiny", project))
    assert doc["difficulty"] == {"sandbox": "bwrap", "engine": "oracle", "k": 2, "allow_all_impossible": True}
    assert doc["sources"]["broken"]["sample"] == {"n": 25, "seed": 0} and "difficulty section" in pilot
    path, _ = write_recipe(load_recipe("tiny", project), project)
    assert load_recipe(path, project).recipe.task_check.max_dropped_fraction == 1.0  # a valid recipe
    path.write_text("sources: {}\n")
    with pytest.raises(ConfigError, match="no probe wrote"):  # someone's own recipe is left alone
        write_recipe(load_recipe("tiny", project), project)


def test_a_bad_recipe_exits_2_naming_it(tmp_path):
    project = _project(tmp_path, "sources: {}\nteacher: {engine: oracle}\n")
    res = otbuild(project, "probe", "tiny")
    assert res.returncode == 2 and "sources: the recipe has none" in res.stderr, res.stderr
    res = otbuild(project, "probe", "nosuch")
    assert res.returncode == 2 and "no such recipe" in res.stderr


def test_a_source_of_mostly_errors_or_no_passes_is_flagged():
    row = {"tasks": 4, "valid": 4, "trials": 16}
    ok = _finish("s", {**row, "scored_trials": 8, "passed_trials": 2, "errors": {"SandboxError": 1}}, True)
    assert ok["broken"] is None and ok["pass_rate"] == 0.25 and ok["pass_rate_se"] == pytest.approx(0.153, abs=1e-3)
    errors = _finish("s", {**row, "scored_trials": 2, "passed_trials": 1, "errors": {"EngineError": 9}}, True)
    assert errors["broken"] == "9 of 16 trials ended in infrastructure errors (mostly EngineError: 9)"
    none = _finish("s", {**row, "scored_trials": 8, "passed_trials": 0}, True)
    assert none["broken"] == "the pilot passed 0 of 8 scored trials"
    invalid = _finish("s", {"tasks": 4, "valid": 0, "rejected": {"noop_passes": 1, "solution_fails": 3}}, True)
    assert invalid["broken"] == "0 of 4 tasks valid: mostly solution_fails (3)" and invalid["valid_rate"] == 0
    assert _finish("s", {}, True)["broken"] == "no tasks: the source gave none"


@pytest.fixture(scope="module")
def probed(tmp_path_factory) -> tuple[Path, object]:
    project = _project(tmp_path_factory.mktemp("probe"))
    res = otbuild(project, "probe", "tiny", "--tasks", "3", "--cores", "2")
    return project, res


@needs_sandbox
@pytest.mark.slow
def test_a_real_probe_flags_the_broken_source_and_passes_the_good_ones(probed):
    project, res = probed
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]
    assert "pilot: the recipe's teacher (oracle:oracle) with k=4" in res.stderr
    summary = json.loads((project / "results" / "tiny_probe" / "probe.json").read_text())
    rows = {r["source"]: r for r in summary["sources"]}
    assert list(rows) == ["files", "text", "broken"] and summary["broken"] == ["broken"]
    assert rows["broken"]["tasks"] == 3 and rows["broken"]["valid_rate"] == 0
    assert rows["broken"]["rejected"] == {"solution_fails": 3}
    assert rows["broken"]["broken"] == "0 of 3 tasks valid: mostly solution_fails (3)"
    for name in ("files", "text"):
        r = rows[name]
        assert r["valid_rate"] == 1 and r["broken"] is None, r
        assert r["scored_trials"] == r["pilot_trials"] == 3 * PILOT_K and r["pass_rate"] == 1
        assert r["bands"]["trivial"] == 3 and r["median_turns"] > 0 and r["median_seconds"] > 0
    assert "0 of 3 tasks valid: mostly solution_fails (3)" in res.stdout  # the console's table
    recipe = yaml.safe_load((project / "recipes" / "tiny_probe.yaml").read_text())
    assert recipe["difficulty"]["k"] == PILOT_K
    built = [p.name for p in (project / "artifacts" / "difficulty").iterdir()]
    assert len(built) == 1  # the probe is a recipe like any other: its artifacts are content-addressed


@needs_sandbox
@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is absent (apt-get install -y chromium)")
def test_the_page_shows_the_broken_source_at_a_glance_in_chromium(probed, tmp_path):
    project, _ = probed
    url = (project / "results" / "tiny_probe" / "probe.html").resolve().as_uri()
    dom = chromium("--dump-dom", url, tmp=tmp_path)
    assert dom.returncode == 0, dom.stderr[-3000:]
    assert [x for x in dom.stderr.splitlines() if "Uncaught" in x or "ERROR:CONSOLE" in x] == []
    rows = re.findall(r'<tr class="(broken|healthy)">\s*<td>(\w+)</td>', dom.stdout)
    assert rows == [("healthy", "files"), ("healthy", "text"), ("broken", "broken")]
    assert re.search(r'<p class="flag" id="verdict"><b>1 of 3 sources look broken:</b> broken', dom.stdout)
    assert '<td class="why">0 of 3 tasks valid: mostly solution_fails (3)</td>' in dom.stdout
    assert "100% ± 0%" in dom.stdout
    shot = tmp_path / "probe.png"
    res = chromium("--window-size=1280,700", "--hide-scrollbars", f"--screenshot={shot}", url, tmp=tmp_path)
    assert res.returncode == 0 and png_size(shot) == (1280, 700) and shot.stat().st_size > 20_000
    if keep := os.environ.get("OTBUILD_REPORT_SCREENSHOTS"):
        Path(keep).mkdir(parents=True, exist_ok=True)
        (Path(keep) / "probe.png").write_bytes(shot.read_bytes())


@needs_sandbox
@pytest.mark.slow
def test_plan_estimate_takes_the_probes_rates_and_a_second_probe_builds_nothing(probed):
    project, first = probed
    assert first.returncode == 0
    res = otbuild(project, "plan", "tiny", "--estimate", "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "rates also from the built probe" in res.stderr
    est = json.loads(res.stdout)
    assert est["pilots"] == ["tiny_probe"]
    rates = {r["rate"]: r for r in est["stages"]["task_check"]["rates"]}
    assert rates["keep_rate"]["estimate"] == pytest.approx(2 / 3, abs=1e-3) and not rates["keep_rate"]["assumed"]
    assert rates["keep_rate"]["source"].startswith("pilot tiny_probe: task_check (9 ")  # 9 tasks probed
    assert rates["seconds_per_trial"]["source"].startswith("pilot tiny_probe: task_check")
    teacher = {r["rate"]: r for r in est["stages"]["teacher"]["rates"]}
    assert teacher["turns_per_trial"]["source"] == f"pilot tiny_probe: difficulty ({2 * 3 * PILOT_K} trials)"
    again = otbuild(project, "probe", "tiny", "--tasks", "3", "--cores", "2")
    assert again.returncode == 0, again.stderr[-3000:]
    assert job_counts(again.stdout + again.stderr) == {"tiny_probe": 1}  # only the results view
    assert "0 of 3 tasks valid" in again.stdout


def test_a_dry_run_writes_the_probe_recipe_and_runs_nothing(tmp_path):
    project = _project(tmp_path)
    res = otbuild(project, "probe", "tiny", "--tasks", "2", "-n")
    assert res.returncode == 0, res.stderr[-3000:]
    counts = job_counts(res.stdout + res.stderr)
    assert counts["task_check"] == 1 and counts["difficulty"] == 1 and counts["source"] == 3, counts
    assert (project / "recipes" / "tiny_probe.yaml").is_file() and not (project / "artifacts").exists()
    assert not (project / "results" / "tiny_probe" / "probe.json").exists()


def test_every_shipped_recipe_gives_a_valid_probe_recipe(tmp_path):
    """The repo's recipes (the paper's, the smoke, ablations, searches) each give a probe recipe
    that loads and plans: every source, task_check, and a pilot (their teachers)."""
    from otbuild.plan import plan_recipe
    from tests.conftest import REPO

    (tmp_path / "recipes").mkdir()
    for p in sorted((REPO / "recipes").glob("*.yaml")):
        (tmp_path / "recipes" / p.name).write_text(p.read_text())
    shipped = sorted(p.stem for p in (tmp_path / "recipes").glob("*.yaml"))
    assert len(shipped) >= 10
    for name in shipped:
        loaded = load_recipe(name, tmp_path)
        path, pilot = write_recipe(loaded, tmp_path, tasks=25)
        nodes = plan_recipe(load_recipe(path, tmp_path)).nodes
        assert {n.stage for n in nodes} == {"source", "task_check", "difficulty", "report"}, name
        assert sum(n.stage == "source" for n in nodes) == len(loaded.data["sources"]) and pilot, name
