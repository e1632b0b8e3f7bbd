"""The difficulty stage: a pilot's pass@k per task, its band, infrastructure errors counted
apart; the guard on a pilot that says nothing; RL leaving out trivial and impossible tasks."""

import json
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from otbuild.sandbox import SandboxError, backend_problem
from otbuild.sources.synthetic import generate
from otbuild.stagekit import Inputs
from otbuild.stages import difficulty
from otbuild.stages.difficulty import DifficultySettings
from otbuild.tasks.table import TaskRecord, write_tasks
from otbuild.tasks.taskdir import TaskDir
from otbuild.traces.table import write_traces
from tests.conftest import otbuild, snakemake
from tests.conftest import trace_import as trace_import_settings
from tests.stagekit.test_failures import row
from tests.support.killed_shard import kill_after, shard_command

needs_sandbox = pytest.mark.skipif(backend_problem("bwrap") is not None, reason="bubblewrap unusable here")


def _tasks(path, n: int, broken=(), seed=5):
    """n synthetic tasks whose oracle solves them, but for those in `broken` (their solve.sh does nothing)."""
    records = []
    for i, rec in enumerate(generate(n, seed, difficulties=[1])):
        if i in broken:
            task = TaskDir(rec.task.name)
            for rel, f in rec.task.files.items():
                task.add(rel, f.data, f.executable)
            task.add("solution/solve.sh", "#!/bin/sh\nexit 0\n", executable=True)
            rec = TaskRecord(task, rec.runnable_locally, rec.metadata)
        records.append(rec)
    write_tasks(path, records, source="synth")
    return path


def _verdicts(outdir) -> list[dict]:
    cols = ["path", "pass_rate", "pilot_trials", "pilot_errors", "band", "band_reason"]
    return pq.read_table(outdir / "tasks.parquet", columns=cols).to_pylist()


def _pilot(tasks, outdir, **settings):
    cfg = DifficultySettings(**{"engine": "oracle", "concurrency": 4, **settings})
    for shard in range(cfg.shards):
        difficulty.run_shard(cfg, Inputs.of(tasks=[tasks]), outdir, shard)
    return difficulty.run(cfg, Inputs.of(tasks=[tasks]), outdir)


def test_bands_follow_the_pass_rate_and_errors_do_not_count_as_failures(tmp_path):
    """Trace rows of known outcomes per task (the merge's input): each band's edges, an
    infrastructure error that leaves the pass rate alone, a task with no scored trial."""
    tasks = _tasks(tmp_path / "tasks.parquet", 9)
    ids = pq.read_table(tasks, columns=["task_id"]).column(0).to_pylist()
    passes = [0, 2, 3, 4, 5, 6, 7, 8]  # of 8 scored trials each: task i's
    rows = []
    for i, p in enumerate(passes):
        rows += [row("1", reward=1.0, task_id=ids[i])] * p + [row("0", reward=0.0, task_id=ids[i])] * (8 - p)
    rows += [row("EngineError", "EngineError", reward=None, task_id=ids[3])] * 2  # apart: 4 of 8 stays hard
    rows += [row("DiskLimitExceededError", reward=0.0, task_id=ids[4])]  # the task's own failure: scored
    rows += [row("SandboxError", "SandboxError", reward=None, task_id=ids[8])] * 3  # nothing scored
    write_traces(tmp_path / "out" / "shards" / "0-of-1.parquet", rows)
    stats = difficulty.run(DifficultySettings(engine="oracle"), Inputs.of(tasks=[tasks]), tmp_path / "out")
    got = _verdicts(tmp_path / "out")
    assert [r["band"] for r in got] == [
        "impossible",
        "very_hard",  # 2/8 = 0.25: the top of (0, 25%]
        "hard",
        "hard",  # 4/8 = 0.5, with 2 errors left out
        "medium",  # 5/9: the disk-limit failure scored 0
        "medium",  # 6/8 = 0.75
        "easy",
        "trivial",
        None,
    ]
    assert got[3]["pass_rate"] == 0.5 and (got[3]["pilot_trials"], got[3]["pilot_errors"]) == (8, 2)
    assert got[4]["pass_rate"] == pytest.approx(5 / 9) and got[4]["pilot_trials"] == 9
    assert got[8]["pass_rate"] is None and (got[8]["pilot_trials"], got[8]["pilot_errors"]) == (0, 3)
    assert got[8]["band_reason"] == "unscored: none of its 3 pilot trials scored (infrastructure x3 (SandboxError))"
    assert all(r["band_reason"] is None for r in got[:8])
    assert stats["bands"] == {
        "impossible": 1,
        "very_hard": 1,
        "hard": 2,
        "medium": 2,
        "easy": 1,
        "trivial": 1,
        "unscored": 1,
    }
    assert stats["pilot_errors"] == 5 and stats["scored_trials"] == 65 and stats["trials"] == 70
    assert stats["pass_rate_mean"] == pytest.approx(sum([0, 2 / 8, 3 / 8, 4 / 8, 5 / 9, 6 / 8, 7 / 8, 1]) / 8)
    # every input row and column is kept, in order, with the pilot's columns added
    assert pq.read_table(tmp_path / "out" / "tasks.parquet", columns=["task_id"]).column(0).to_pylist() == ids
    assert not (tmp_path / "out" / "rejected.parquet").exists()


def test_a_pilot_whose_trials_are_all_errors_fails_naming_the_numbers(tmp_path):
    tasks = _tasks(tmp_path / "tasks.parquet", 2)
    ids = pq.read_table(tasks, columns=["task_id"]).column(0).to_pylist()
    write_traces(
        tmp_path / "out" / "shards" / "0-of-1.parquet",
        [row("EngineError", "EngineError", reward=None, task_id=t) for t in ids for _ in range(3)],
    )
    with pytest.raises(RuntimeError, match=r"none of the 6 pilot trials was scored \(6 infrastructure errors"):
        difficulty.run(DifficultySettings(engine="oracle"), Inputs.of(tasks=[tasks]), tmp_path / "out")
    assert not (tmp_path / "out" / "tasks.parquet").exists()


@needs_sandbox
def test_the_oracle_pilot_finds_solved_tasks_trivial_and_broken_ones_impossible(tmp_path):
    """Real trials under bwrap: the oracle passes every trial of a task whose solve.sh works,
    none of one whose solve.sh does nothing; the pass rates are the test's own count."""
    tasks = _tasks(tmp_path / "tasks.parquet", 5, broken={1, 4})
    stats = _pilot(tasks, tmp_path / "out", k=3, shards=2)
    got = _verdicts(tmp_path / "out")
    assert [(r["pass_rate"], r["pilot_trials"], r["band"]) for r in got] == [
        (0.0, 3, "impossible") if i in {1, 4} else (1.0, 3, "trivial") for i in range(5)
    ]
    assert stats["bands"]["trivial"] == 3 and stats["bands"]["impossible"] == 2
    traces = pq.read_table(tmp_path / "out" / "traces.parquet", columns=["task", "sample_idx", "reward"]).to_pylist()
    assert len(traces) == 15 and sorted({t["sample_idx"] for t in traces}) == [0, 1, 2]  # k trials each
    # the pilot's trials are traces a recipe can import (trace_imports: kind harbor-traces)
    from otbuild.stages import trace_import

    imported = trace_import.run(
        trace_import_settings("harbor-traces", tmp_path / "out" / "traces.parquet"), [], tmp_path / "imp"
    )
    assert imported == {"traces": 15, "quarantined": 0, "quarantined_by_reason": {}}


@needs_sandbox
def test_a_pilot_that_solves_nothing_fails_unless_allowed(tmp_path):
    tasks = _tasks(tmp_path / "tasks.parquet", 2, broken={0, 1})
    with pytest.raises(RuntimeError, match=r"solved none of the 2 tasks .*0 of 4 scored trials passed"):
        _pilot(tasks, tmp_path / "out", k=2)
    stats = _pilot(tasks, tmp_path / "out", k=2, allow_all_impossible=True)
    assert stats["bands"]["impossible"] == 2 and [r["band"] for r in _verdicts(tmp_path / "out")] == ["impossible"] * 2


@needs_sandbox
def test_a_sandbox_failure_is_retried_then_counted_apart_not_as_a_failed_attempt(tmp_path, monkeypatch):
    """Task 0's sandbox cannot be set up (a SandboxError, induced here); task 1's fails once,
    then its retry passes: neither lowers a pass rate."""
    from otbuild.harness import trial

    tasks = _tasks(tmp_path / "tasks.parquet", 3)
    names = pq.read_table(tasks, columns=["path"]).column(0).to_pylist()
    real, failed_once = trial.open_sandbox, []

    def open_sandbox(task, workdir, **kw):
        if task.name == names[0] or (task.name == names[1] and not failed_once):
            failed_once.extend([True] if task.name == names[1] else [])
            raise SandboxError(f"task {task.name!r}: could not set up its trial (induced)")
        return real(task, workdir, **kw)

    monkeypatch.setattr(trial, "open_sandbox", open_sandbox)
    stats = _pilot(
        tasks, tmp_path / "out", k=2, concurrency=1, infra_retries=1, backoff_sec=0.01, max_infra_failures=1.0
    )
    got = _verdicts(tmp_path / "out")
    assert [(r["band"], r["pilot_trials"], r["pilot_errors"]) for r in got] == [
        (None, 0, 2),
        ("trivial", 2, 0),  # its failed first attempt was retried
        ("trivial", 2, 0),
    ]
    assert got[0]["band_reason"] == "unscored: none of its 2 pilot trials scored (infrastructure x2 (SandboxError))"
    assert stats["pilot_errors"] == 2 and stats["bands"]["unscored"] == 1
    traces = pq.read_table(tmp_path / "out" / "traces.parquet", columns=["task", "metadata"]).to_pylist()
    retried = [json.loads(t["metadata"]).get("retried_exceptions") for t in traces if t["task"] == names[1]]
    assert sorted(retried, key=str) == [None, ["SandboxError"]]


def test_rl_leaves_out_the_bands_it_skips_and_counts_them(tmp_path):
    from otbuild.settings.stages import RlSettings
    from otbuild.stages.rl import without_bands

    src = _tasks(tmp_path / "plain.parquet", 5)
    table = pq.read_table(src)
    bands = ["trivial", "medium", "impossible", None, "hard"]
    pq.write_table(table.append_column("band", pa.array(bands, pa.string())), tmp_path / "tasks.parquet")
    cfg = RlSettings(steps=1)
    inputs, skipped = without_bands(
        cfg, Inputs.of(checkpoint=[tmp_path / "ck"], tasks=[tmp_path / "tasks.parquet"]), tmp_path / "rl"
    )
    assert skipped == {"skipped_bands": {"trivial": 1, "impossible": 1}, "tasks_trained_on": 3}
    assert pq.read_table(inputs[1], columns=["band"]).column(0).to_pylist() == ["medium", None, "hard"]
    assert inputs.names == ("checkpoint", "tasks")
    # a table without bands, or skip_bands: [], is used as it is
    assert without_bands(cfg, Inputs.of(checkpoint=[tmp_path / "ck"], tasks=[src]), tmp_path / "rl")[1] == {}
    none = RlSettings(steps=1, skip_bands=[])
    assert without_bands(none, [tmp_path / "ck", tmp_path / "tasks.parquet"], tmp_path / "rl")[1] == {}
    pq.write_table(table.slice(0, 1).append_column("band", pa.array(["trivial"])), tmp_path / "trivial.parquet")
    with pytest.raises(RuntimeError, match=r"every one of the 1 tasks is in skip_bands"):
        without_bands(cfg, [tmp_path / "ck", tmp_path / "trivial.parquet"], tmp_path / "rl")


def test_k_not_samples_per_task_and_the_verifier_on():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="set k"):
        DifficultySettings(engine="oracle", samples_per_task=4)
    with pytest.raises(ValidationError, match="the pilot needs the verifier"):
        DifficultySettings(engine="oracle", verify=False)


def test_the_estimate_counts_tasks_times_k_pilot_trials_and_the_draw_caps_the_tasks(project):
    (project / "recipes" / "e.yaml").write_text("""
sources:
  a: {kind: synthetic, count: 30, seed: 1}
difficulty: {engine: openai, model: m, base_url: 'http://127.0.0.1:9/v1', k: 4, shards: 2, max_episodes: 5}
task_filter:
  draw: {column: band, shares: {medium: 0.7, easy: 0.2, hard: 0.1}, total: 10}
""")
    proc = otbuild(project, "plan", "--estimate", "e", "--json")
    assert proc.returncode == 0, proc.stderr
    st = json.loads(proc.stdout)["stages"]
    pilot = st["difficulty"]
    assert pilot["counts"]["tasks"]["estimate"] == 30 and pilot["counts"]["trials"]["estimate"] == 120
    assert pilot["requests"]["estimate"] == 120 * 5  # the assumed 30 turns capped at max_episodes
    assert [j["count"] for j in pilot["jobs"]] == [2, 1]  # two shards and the merge
    assert st["task_filter"]["counts"]["tasks_kept"]["estimate"] == 10


def test_the_pilot_runs_in_the_teachers_sandbox_where_its_section_leaves_it_unset(tmp_path):
    from otbuild.plan import plan_recipe
    from otbuild.recipe.load import load_recipe

    (tmp_path / "recipes").mkdir()
    recipe = (
        "sources:\n  a: {kind: synthetic, count: 5, seed: 1}\n"
        "teacher: {engine: oracle, sandbox: podman, limits: {memory_mb: 3072}, max_episodes: 7}\n"
    )

    def pilot(section: str):
        (tmp_path / "recipes" / "r.yaml").write_text(recipe + section)
        return next(n for n in plan_recipe(load_recipe("r", tmp_path)).nodes if n.stage == "difficulty").config

    inherited = pilot("difficulty: {engine: oracle, k: 2}\n")
    assert inherited.sandbox == "podman" and inherited.limits.memory_mb == 3072  # the teacher's
    assert inherited.max_episodes != 7  # not the teacher's turn budget
    assert pilot("difficulty: {engine: oracle, k: 2, sandbox: bwrap}\n").sandbox == "bwrap"


# -- through the CLI and snakemake -----------------------------------------------------------
@needs_sandbox
@pytest.mark.slow
def test_a_killed_pilot_shard_resumes_without_redoing_a_trial(tmp_path):
    tasks = _tasks(tmp_path / "tasks.parquet", 10, broken={3})
    settings = DifficultySettings(engine="oracle", k=3, shards=2, concurrency=1).model_dump()
    outdir = tmp_path / "artifacts" / "difficulty" / ("d" * 16)
    cmd = shard_command("difficulty", settings, tasks, outdir, 0)
    done_before = kill_after(cmd, outdir / "shards" / "0-of-2.partial.jsonl", 4)
    assert 4 <= done_before < 15
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{done_before} already done, {15 - done_before} to run" in res.stdout
    for args in (["--shard", "1"], []):
        res = subprocess.run(cmd[:-2] + args, capture_output=True, text=True, check=False)
        assert res.returncode == 0, res.stdout + res.stderr
    got = _verdicts(outdir)
    assert [r["band"] for r in got] == ["impossible" if i == 3 else "trivial" for i in range(10)]
    assert all(r["pilot_trials"] == 3 for r in got)  # each trial once
    assert len(pq.read_table(outdir / "traces.parquet", columns=["task"])) == 30


@needs_sandbox
@pytest.mark.slow
def test_a_build_with_a_pilot_and_a_draw_by_band(project):
    """The real snakemake CLI: tasks -> difficulty (the oracle, k 2) -> task_filter.draw by band."""
    _tasks(project / "tasks.parquet", 8, broken={0, 2, 5})
    (project / "recipes" / "d.yaml").write_text("""
sources:
  a: {kind: harbor-parquet, path: tasks.parquet}
difficulty: {engine: oracle, k: 2, shards: 2, concurrency: 2}
task_filter:
  draw: {column: band, shares: {trivial: 0.5, impossible: 0.5}, total: 4, seed: 1}
""")
    ran, log = snakemake(project, "d")
    assert (ran["difficulty"], ran["difficulty_merge"], ran["task_filter"]) == (2, 1, 1), log[-3000:]
    [pilot] = list((project / "artifacts" / "difficulty").glob("*/tasks.parquet"))
    bands = pq.read_table(pilot, columns=["band"]).column(0).to_pylist()
    assert bands == ["impossible" if i in {0, 2, 5} else "trivial" for i in range(8)]
    assert len(pq.read_table(pilot.parent / "traces.parquet", columns=["task"])) == 16
    [kept] = list((project / "artifacts" / "task_filter").glob("*/kept.parquet"))
    assert sorted(pq.read_table(kept, columns=["band"]).column(0).to_pylist()) == ["impossible"] * 2 + ["trivial"] * 2
    rejected = pq.read_table(kept.parent / "rejected.parquet", columns=["reason"]).column(0).to_pylist()
    assert sorted(set(rejected)) == [
        "draw: band=impossible over its share 0.5 (2 of 4)",
        "draw: band=trivial over its share 0.5 (2 of 4)",
    ]


@needs_sandbox
@pytest.mark.slow
def test_a_random_pilot_finds_every_task_impossible_and_the_guard_says_so(tmp_path, tiny_model, local_server):
    """The tiny random model served as an OpenAI endpoint: it never solves a task (its trials
    end on its context window, a task failure that scores 0), so every task is impossible and
    the stage fails naming the numbers, unless that is allowed."""
    tasks = _tasks(tmp_path / "tasks.parquet", 2)
    pilot = {"engine": "openai", "base_url": local_server, "model": str(tiny_model), "max_tokens": 64, "k": 2}
    with pytest.raises(RuntimeError, match=r"solved none of the 2 tasks it was scored on \(0 of 4 scored trials"):
        _pilot(tasks, tmp_path / "out", **pilot)
    allowed = DifficultySettings(**pilot, allow_all_impossible=True)  # the merge again, on the same shards
    stats = difficulty.run(allowed, Inputs.of(tasks=[tasks]), tmp_path / "out")
    got = _verdicts(tmp_path / "out")
    assert [(r["band"], r["pass_rate"], r["pilot_trials"], r["pilot_errors"]) for r in got] == [
        ("impossible", 0.0, 2, 0)
    ] * 2
    assert stats["outcomes"] == {"task_failure": 4}
