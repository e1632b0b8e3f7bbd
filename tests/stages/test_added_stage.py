"""A stage added as docs/architecture.md says ("Adding a stage"), by an installed package and
nothing else: the registry places it, a recipe's section plans it, `plan --estimate` estimates it,
a real Snakemake build runs it, the report's funnel shows it, and `audit --rebuild` rebuilds it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO, make_project

PLUGIN = '''
"""Keeps the first trace of each task: a stage of the trace table, added from outside otbuild."""

from pathlib import Path

from otbuild import duck
from otbuild.settings.base import Strict
from otbuild.stages import StageDef
from otbuild.stagekit import Inputs, stage_run
from otbuild.traces.table import VOLATILE_COLUMNS


class DedupeSettings(Strict):
    per_task: int = 1  # traces kept of each task


@stage_run
def run(cfg: DedupeSettings, inputs: Inputs, outdir: Path) -> dict:
    con = duck.connect()
    paths = ", ".join(duck.sql_literal(str(p)) for p in inputs.named("traces"))
    con.execute(f"CREATE TABLE t AS SELECT *, row_number() OVER (PARTITION BY task ORDER BY trial_name) AS n_ "
                f"FROM read_parquet([{paths}])")
    kept = duck.copy_to_parquet(con, f"SELECT * EXCLUDE (n_) FROM t WHERE n_ <= {cfg.per_task} ORDER BY task, n_",
                                outdir / "kept.parquet")
    dropped = duck.copy_to_parquet(con, f"SELECT * EXCLUDE (n_), 'duplicate_task' AS reason FROM t "
                                        f"WHERE n_ > {cfg.per_task} ORDER BY task, n_", outdir / "rejected.parquet")
    return {"kept": kept, "rejected": dropped, "rejected_by_reason": {"duplicate_task": dropped} if dropped else {}}


STAGE = StageDef("trace_dedupe", 1, ("kept.parquet", "rejected.parquet"), __name__, DedupeSettings,
                 consumes=("traces",), produces="traces", traces=True, filter=True, after="trace_filter",
                 estimate="table", volatile={"*.parquet": tuple(VOLATILE_COLUMNS)}, counts={"traces_kept": "rows"})
'''

RECIPE = """\
trace_imports:
  chats: {kind: messages-jsonl, path: chats.jsonl}
trace_filter: {min_turns: 0}
trace_dedupe: {per_task: 1}
"""


@pytest.fixture
def added(tmp_path):
    """A package on PYTHONPATH whose entry point adds the stage `trace_dedupe`, and a project."""
    site = tmp_path / "site"
    (site / "otbuild_dedupe-0.1.dist-info").mkdir(parents=True)
    (site / "otbuild_dedupe.py").write_text(PLUGIN)
    (site / "otbuild_dedupe-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: otbuild-dedupe\nVersion: 0.1\n"
    )
    (site / "otbuild_dedupe-0.1.dist-info" / "entry_points.txt").write_text(
        "[otbuild.stages]\ntrace_dedupe = otbuild_dedupe:STAGE\n"
    )
    (tmp_path / "project").mkdir()
    project = make_project(tmp_path / "project")
    (project / "recipes" / "dedupe.yaml").write_text(RECIPE)
    chats = [
        {
            "messages": [
                {"role": "user", "content": f"task {i % 3}"},
                {"role": "assistant", "content": f"done, try {i}"},
            ],
            "task": f"t{i % 3}",
            "trial_name": f"trial-{i}",
        }
        for i in range(7)
    ]
    (project / "chats.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chats))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]), "COLUMNS": "200"}
    return project, env


def _run(project, env, *args, timeout=600):
    res = subprocess.run(args, cwd=project, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    return res.stdout


def test_the_registry_places_an_added_stage_and_refuses_a_bad_one(added):
    project, env = added
    code = "from otbuild.stages import STAGES; print(list(STAGES))"
    order = json.loads(
        _run(project, env, sys.executable, "-c", code.replace("print(", "import json; print(json.dumps(") + ")")
    )
    assert order[order.index("trace_filter") + 1] == "trace_dedupe"
    (project / "recipes" / "bad.yaml").write_text(RECIPE.replace("per_task: 1", "per_tsk: 1"))
    res = subprocess.run(
        [sys.executable, "-m", "otbuild", "validate", "bad"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 2 and "bad.yaml: trace_dedupe.per_tsk" in res.stdout + res.stderr


@pytest.mark.slow
def test_an_added_stage_is_planned_estimated_built_reported_and_rebuilt(added):
    project, env = added
    plan = _run(project, env, sys.executable, "-m", "otbuild", "plan", "dedupe")
    assert "trace_dedupe" in plan
    estimate = _run(project, env, sys.executable, "-m", "otbuild", "plan", "dedupe", "--estimate")
    assert "trace_dedupe" in estimate
    _run(project, env, sys.executable, "-m", "snakemake", "dedupe", "--cores", "2")
    [art] = (project / "artifacts" / "trace_dedupe").iterdir()
    record = json.loads((art / "provenance.json").read_text())
    assert list(record["code"]) == [str(project.parent / "site" / "otbuild_dedupe.py")]  # its code, not otbuild's
    assert record["stats"]["kept"] == 3 and record["stats"]["rejected_by_reason"] == {"duplicate_task": 4}
    html = (project / "results" / "dedupe" / "report" / "report.html").read_text()
    assert "trace_dedupe" in html and "duplicate_task" in html
    audit = _run(project, env, sys.executable, "-m", "otbuild", "audit", "dedupe", "trace_dedupe", "--rebuild")
    assert "identical" in audit, audit
