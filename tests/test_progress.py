"""Long jobs' progress on the console of the Snakemake run (otbuild/progress.py), in process:
a job's status file, the run's watcher lines (the log to follow first, then done/total, ETA),
SFT's step lines in its log. The real run is checked on the smoke build (tests/e2e/test_workflow.py)."""

from __future__ import annotations

import json
import os

from otbuild import progress
from otbuild.progress import JobProgress, StepProgress, Watcher, describe_log

LOG = "logs/rollout/" + "ab" * 8 + "/0-of-2.log"


def test_a_job_reports_to_the_run_and_the_run_prints_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(progress.LOG_ENV, LOG)
    lines: list[str] = []
    labels = {("rollout", "ab" * 8): "teacher"}
    watcher = Watcher(tmp_path, lambda log: describe_log(log, lambda s, i: labels.get((s, i))), lines.append, every=0)
    job = JobProgress("trials", 12, done=2)  # 2 done by an earlier run (resumed)
    status = tmp_path / progress.status_file(LOG)
    assert json.loads(status.read_text())["done"] == 2
    assert watcher.tick() == [f"otbuild: teacher, shard 1 of 2: trials 2/12 (17%); follow it: tail -f {LOG}"]
    assert watcher.tick() == []  # no news: nothing printed
    job.update(7, "pass 100%", force=True)
    (line,) = watcher.tick()
    assert line.startswith("otbuild: teacher, shard 1 of 2: trials 7/12 (58%), pass 100%, about ")
    assert line.endswith(" left") and "follow" not in line
    job.finish()
    assert not status.exists() and watcher.tick() == []


def test_status_files_of_earlier_runs_are_not_shown(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(progress.LOG_ENV, LOG)
    JobProgress("trials", 12)  # a job killed -9 before this run: its file stayed
    old = tmp_path / progress.status_file(LOG)
    os.utime(old, (1, 1))
    assert Watcher(tmp_path, str, print, every=0).tick() == []


def test_without_a_log_a_job_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(progress.LOG_ENV, raising=False)
    JobProgress("trials", 3).update(3)
    assert not (tmp_path / progress.DIR).exists()


def test_training_steps_on_the_console_and_in_the_log(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    log = "logs/sft/" + "cd" * 8 + ".log"
    monkeypatch.setenv(progress.LOG_ENV, log)
    said: list[str] = []
    steps = StepProgress("SFT", 4, 0, said.append)
    for s in range(1, 5):
        steps.step(s, f"loss {5 - s}")
    assert said[-1].startswith("sft: step 4/4, loss 1")  # the last step always; others every 30 s
    lines = Watcher(tmp_path, lambda p: describe_log(p, lambda s, i: "sft"), print, every=0).tick()
    assert lines == [f"otbuild: sft: SFT steps 4/4 (100%), loss 1; follow it: tail -f {log}"]
    steps.finish()
    assert not list((tmp_path / progress.DIR).iterdir())
    assert describe_log("logs/eval/" + "ef" * 8 + "/1-of-3.log", lambda s, i: None) == f"eval {'ef' * 8}, shard 2 of 3"


def test_a_job_two_recipes_share_is_named_by_its_label_in_the_recipe_being_built(project):
    """The smoke and a recipe that extends it share the teacher's rollouts (one id); building
    the smoke, its console names them as the smoke labels them, not as the other recipe does."""
    import shutil

    from otbuild.workflow import Workflow
    from tests.conftest import REPO

    shutil.copy(REPO / "recipes" / "smoke.yaml", project / "recipes")
    (project / "recipes" / "thesis.yaml").write_text("extends: smoke\nsearch:\n  - {sft.max_steps: [0, 1500]}\n")
    wf = Workflow(project)
    (teacher,) = [n for n in wf.plans["smoke"].nodes if n.label == "teacher"]
    assert any(n.id == teacher.id and n.label != "teacher" for n in wf.plans["thesis"].nodes)
    log = f"logs/rollout/{teacher.id}/0-of-2.log"
    assert wf.describe_log(log, ("smoke",)) == "teacher, shard 1 of 2"
    assert wf.describe_log(log, ("thesis",)).startswith("search/1/") and "teacher, shard 1 of 2" in wf.describe_log(
        log, ("thesis",)
    )
