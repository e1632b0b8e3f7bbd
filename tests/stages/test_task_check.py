"""task_check: each task's reference solution and a do-nothing agent, run in the sandbox. On
otbuild's synthetic tasks under bwrap with a few made broken on purpose (a solve.sh that does
nothing, a verifier that passes anything, no solution, a verifier that prints megabytes of
binary and ANSI codes), an attacker's solve.sh, a real Terminal-Bench task under podman, a
kill -9 mid-stage, the drop guard, the plan and the estimate, and a real snakemake build."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from otbuild.errors import StageError
from otbuild.plan import plan_recipe
from otbuild.recipe.load import load_recipe
from otbuild.sandbox import backend_problem
from otbuild.sources import read_source
from otbuild.sources.synthetic import generate
from otbuild.stagekit import Inputs
from otbuild.stages import STAGES, task_check
from otbuild.stages.task_check import TaskCheckSettings
from otbuild.tasks.table import TaskRecord, write_tasks
from otbuild.tasks.taskdir import TaskDir
from tests.conftest import DATA, REPO, make_project, snakemake, source

needs_sandbox = pytest.mark.skipif(backend_problem("bwrap") is not None, reason="bubblewrap unusable here")
needs_podman = pytest.mark.skipif(
    backend_problem("podman") is not None, reason=f"podman unusable here: {backend_problem('podman')}"
)
TB2 = DATA / "terminal_bench_tasks" / "harbor_format" / "tb2_ot_fewshots"
PASS = "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"


def _copy(task: TaskDir, name: str, drop: str = "", **files: str) -> TaskDir:
    """`task` under another name, without the files under `drop`, with `files` (a/b as a__b) set."""
    out = TaskDir(name)
    for rel, f in task.files.items():
        if not (drop and rel.startswith(drop)):
            out.add(rel, f.data, f.executable)
    for key, text in files.items():
        out.add(key.replace("__", "/").replace("_sh", ".sh"), text, executable=True)
    return out


def _rows(path: Path, columns: str = "*") -> list[dict]:
    return duckdb.sql(f"SELECT {columns} FROM '{path}'").fetchall() if path.exists() else []


def _run(tasks: Path, outdir: Path, **settings) -> dict:
    cfg = TaskCheckSettings(**{"max_dropped_fraction": 1.0, **settings})
    for k in range(cfg.shards):
        task_check.run_shard(cfg, Inputs.of(tasks=[tasks]), outdir, k)
    return task_check.run(cfg, Inputs.of(tasks=[tasks]), outdir)


def _verdicts(outdir: Path) -> tuple[list[str], dict[str, str]]:
    kept = [p for (p,) in _rows(outdir / "kept.parquet", "path")]
    rejected = dict(_rows(outdir / "rejected.parquet", "path, reason"))
    return kept, rejected


HOSTILE_OUTPUT = """#!/bin/bash
head -c 3000000 /dev/urandom
printf '\\033[2J\\033[31mreward: 1.0\\033]0;title\\007\\n'
echo 0 > /logs/verifier/reward.txt
"""


@pytest.fixture(scope="module")
def validated(tmp_path_factory) -> tuple[Path, dict, list[TaskRecord]]:
    """Six synthetic tasks under bwrap, three of them good and four made broken (a solve.sh that
    does nothing, a verifier that passes anything, no solution, a verifier whose output is
    megabytes of binary and ANSI codes), shuffled among the good ones, in 2 shards."""
    tmp = tmp_path_factory.mktemp("task_check")
    good = list(generate(6, 5, difficulties=[1]))
    t = [r.task for r in good]
    broken = [
        _copy(t[3], "solve-does-nothing", solution__solve_sh="#!/bin/bash\ntrue\n"),
        _copy(t[4], "verifier-passes-anything", tests__test_sh=PASS),
        _copy(t[5], "no-solution", drop="solution/"),
        _copy(t[0], "verifier-prints-garbage", tests__test_sh=HOSTILE_OUTPUT),
    ]
    records = [good[0], TaskRecord(broken[0], True), good[1], TaskRecord(broken[1], True)]
    records += [TaskRecord(broken[2], True), good[2], TaskRecord(broken[3], True)]
    tasks = tmp / "tasks.parquet"
    write_tasks(tasks, records, source="synth")
    stats = _run(tasks, tmp / "out", shards=2, concurrency=2)
    return tmp, stats, good


@needs_sandbox
def test_validation_drops_exactly_the_broken_tasks_with_their_reasons(validated):
    tmp, stats, good = validated
    kept, rejected = _verdicts(tmp / "out")
    assert kept == [r.task.name for r in good[:3]]  # in input order, unchanged
    assert {k: v.split(":")[0] for k, v in rejected.items()} == {
        "solve-does-nothing": "solution_fails",
        "verifier-passes-anything": "noop_passes",
        "no-solution": "no_solution",
        "verifier-prints-garbage": "solution_fails",
    }
    assert rejected["solve-does-nothing"] == "solution_fails: the reference solution gets reward 0.0"
    assert stats["rejected_by_reason"] == {
        "no_solution": 1,
        "environment_fails": 0,
        "solution_fails": 2,
        "noop_passes": 1,
    }
    # the task without a solution runs neither trial (no_solution: drop); each other task two
    assert stats["trials_by_engine"] == {"oracle": 6, "noop": 6} and stats["trials"] == 12
    kept_schema = pq.read_schema(tmp / "out" / "kept.parquet")
    assert kept_schema.names == pq.read_schema(tmp / "tasks.parquet").names  # the task table as it was
    row = duckdb.sql(
        f"SELECT * FROM '{tmp / 'out' / 'rejected.parquet'}' WHERE path = 'solve-does-nothing'"
    ).fetchall()[0]
    names = pq.read_schema(tmp / "out" / "rejected.parquet").names
    rec = dict(zip(names, row, strict=True))
    assert rec["rejected_by"] == "task_check" and rec["oracle_outcome"] == "failed" and rec["noop_outcome"] == "failed"
    assert rec["verifier_output"]  # what the task's verifier said about the untouched file


@needs_sandbox
def test_hostile_verifier_output_stays_bounded_and_is_kept_as_data(validated):
    tmp, _, _ = validated
    (said,) = duckdb.sql(
        f"SELECT verifier_output FROM '{tmp / 'out' / 'rejected.parquet'}' WHERE path = 'verifier-prints-garbage'"
    ).fetchall()[0]
    assert 0 < len(said) <= 2000  # output_chars; the verifier printed 3 MB
    assert "\x1b[31mreward: 1.0" in said  # its fake reward line is text in a row, not a reward
    assert said.encode("utf-8")  # undecodable bytes were replaced: the row is valid UTF-8


@needs_sandbox
def test_dropping_most_tasks_fails_naming_the_reasons_and_sources(validated):
    tmp, _, _ = validated
    cfg = TaskCheckSettings(shards=2, max_dropped_fraction=0.3)
    with pytest.raises(StageError) as e:
        task_check.run(cfg, Inputs.of(tasks=[tmp / "tasks.parquet"]), tmp / "out")
    msg = str(e.value)
    assert "4 of the 7 tasks (57.1%) fail their check, more than max_dropped_fraction 0.3" in msg
    assert "no_solution: 1, noop_passes: 1, solution_fails: 2" in msg and "synth: 4 of 7 dropped" in msg


@needs_sandbox
def test_without_a_solution_a_task_can_be_kept_when_doing_nothing_fails(tmp_path):
    good = list(generate(2, 8, difficulties=[1]))
    nosol = _copy(good[1].task, "no-solution", drop="solution/")
    lax = _copy(good[0].task, "no-solution-lax", drop="solution/", tests__test_sh=PASS)
    write_tasks(tmp_path / "t.parquet", [good[0], TaskRecord(nosol, True), TaskRecord(lax, True)], source="s")
    stats = _run(tmp_path / "t.parquet", tmp_path / "out", no_solution="keep")
    kept, rejected = _verdicts(tmp_path / "out")
    assert kept == [good[0].task.name, "no-solution"]
    assert list(rejected) == ["no-solution-lax"] and rejected["no-solution-lax"].startswith("noop_passes:")
    assert stats["trials_by_engine"] == {"oracle": 1, "noop": 3}


ATTACK = """#!/bin/bash
# everything a task's solution could try against its host and its neighbours
echo 1 > /logs/verifier/reward.txt; echo '{{"reward": 1}}' > /logs/verifier/reward.json
echo "reward: 1.0"
echo pwned > {canary} 2>/dev/null
ln -s {canary} /app/link 2>/dev/null; echo pwned > /app/link 2>/dev/null
ln -s {host_dir} /app/hostdir 2>/dev/null; touch /app/hostdir/planted 2>/dev/null
for d in /tmp/otbuild-trials-*/*/ {host_dir}; do touch "$d/planted" 2>/dev/null; done
touch /planted 2>/dev/null
"""


@needs_sandbox
def test_an_attacking_solution_changes_neither_its_verdict_nor_a_neighbours_nor_the_host(tmp_path):
    host_dir = tmp_path / "host"
    host_dir.mkdir()
    canary = host_dir / "canary.txt"
    canary.write_text("host data\n")
    good = list(generate(3, 21, difficulties=[1]))
    attack = ATTACK.format(canary=canary, host_dir=host_dir)
    attacker = _copy(
        good[1].task,
        "attacker",
        solution__solve_sh=attack,
        tests__test_sh=(
            "#!/bin/bash\ntest -e /app/link -o -e /planted && echo 1 || echo 0\necho 0 > /logs/verifier/reward.txt\n"
        ),
    )
    records = [good[0], TaskRecord(attacker, True), good[2]]
    write_tasks(tmp_path / "t.parquet", records, source="s")
    alone = tmp_path / "alone.parquet"
    write_tasks(alone, [good[0], good[2]], source="s")
    _run(tmp_path / "t.parquet", tmp_path / "out", concurrency=3)
    _run(alone, tmp_path / "alone", concurrency=3)
    kept, rejected = _verdicts(tmp_path / "out")
    assert kept == _verdicts(tmp_path / "alone")[0] == [good[0].task.name, good[2].task.name]
    assert rejected["attacker"] == "solution_fails: the reference solution gets reward 0.0"  # its own writes: no reward
    assert canary.read_text() == "host data\n" and sorted(p.name for p in host_dir.iterdir()) == ["canary.txt"]
    assert not Path("/planted").exists()


@needs_podman
@pytest.mark.skipif(not TB2.is_dir(), reason=f"dev data not found at {TB2}")
def test_a_real_terminal_bench_task_under_podman_and_its_image_is_the_teachers(tmp_path):
    """tb2_ot_fewshots/hello-world as it is: its verifier installs pytest from the network,
    which the sandbox does not give it, so its solution 'fails' with the verifier's words to
    say why; with an offline verifier of the same check it is kept, and the image podman built
    for it is the one a rollout of it looks up (tagged by its environment's hash)."""
    from otbuild.sandbox.podman.images import IMAGE_REPO, environment_hash, image_exists

    cfg = source("harbor-dir", TB2)
    real = next(r for r in read_source(cfg) if isinstance(r, TaskRecord) and r.task.name == "hello-world")
    nonce = uuid.uuid4().hex[:12]  # an image no run before this one built
    offline = _copy(
        real.task,
        "hello-world-offline",
        tests__test_sh='#!/bin/bash\n[ "$(cat /app/hello.txt)" = "Hello, world!" ] && r=1 || r=0\n'
        "echo checked hello.txt: $r; echo $r > /logs/verifier/reward.txt\n",
    )
    offline.add("environment/Dockerfile", real.task.text("environment/Dockerfile") + f"\n# {nonce}\n")
    write_tasks(tmp_path / "t.parquet", [real, TaskRecord(offline, True)], source="tb2")
    tag = f"{IMAGE_REPO}:{environment_hash(offline)[:24]}"
    try:
        stats = _run(tmp_path / "t.parquet", tmp_path / "out", sandbox="podman", concurrency=2)
        kept, rejected = _verdicts(tmp_path / "out")
        assert kept == ["hello-world-offline"], rejected
        assert rejected["hello-world"].startswith("solution_fails:")
        (said,) = duckdb.sql(f"SELECT verifier_output FROM '{tmp_path / 'out' / 'rejected.parquet'}'").fetchall()[0]
        assert said and len(said) <= 2000
        assert stats["outcomes_by_engine"]["noop"] == {"failed": 2}
        assert image_exists(tag)  # what the teacher's trials of it use (ensure_image: this tag, else a build)
    finally:
        subprocess.run(["podman", "rmi", "-f", tag], capture_output=True, check=False)


@needs_sandbox
@pytest.mark.slow
def test_kill_9_mid_stage_resumes_without_redoing_finished_trials(tmp_path):
    """kill -9 of a shard job while its solutions run, and again while its no-op trials run:
    each rerun runs only the trials not yet done, and the stage's verdicts are whole."""
    tasks = tmp_path / "tasks.parquet"
    write_tasks(tasks, generate(24, 5, difficulties=[3]), source="synth")
    outdir = tmp_path / "artifacts" / "task_check" / ("a" * 16)
    settings = TaskCheckSettings(concurrency=1).model_dump()
    spec = json.dumps(
        {
            "stage": "task_check",
            "id": "a" * 16,
            "settings": settings,
            "inputs": [{"id": "t", "stage": "mix", "path": str(tasks), "name": "tasks"}],
            "outdir": str(outdir),
        }
    )
    cmd = [sys.executable, "-m", "otbuild", "stage", "task_check", "--spec", spec, "--shard", "0"]
    oracle, noop = (outdir / e / "shards" / "0-of-1.partial.jsonl" for e in ("oracle", "noop"))

    def kill_when(partial: Path, lines: int) -> int:
        proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (not partial.exists() or len(partial.read_text().splitlines()) < lines):
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return len(partial.read_text().splitlines())

    in_oracle = kill_when(oracle, 4)
    assert 4 <= in_oracle < 24 and not (outdir / "oracle" / "shards" / "0-of-1.parquet").exists()
    in_noop = kill_when(noop, 3)  # the rerun resumed the solutions, finished them, then started the no-ops
    oracle_done = outdir / "oracle" / "shards" / "0-of-1.parquet"
    assert oracle_done.exists() and 3 <= in_noop < 24
    written = oracle_done.stat().st_mtime_ns
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"shard 0: 24 trials, {in_noop} already done, {24 - in_noop} to run" in res.stdout
    assert res.stdout.count("trials, ") == 1  # the solutions' shard was not run again
    assert oracle_done.stat().st_mtime_ns == written
    cfg = TaskCheckSettings(concurrency=1)
    stats = task_check.run(cfg, Inputs.of(tasks=[tasks]), outdir)
    assert stats["trials_by_engine"] == {"oracle": 24, "noop": 24} and stats["kept"] == 24


RECIPE = """\
sources:
  synth: {kind: synthetic, rank: 1, count: 6, seed: 4, families: [files], difficulties: [1]}
"""


def _plan(tmp_path: Path, text: str) -> dict:
    (tmp_path / "recipes").mkdir(exist_ok=True)
    (tmp_path / "recipes" / "r.yaml").write_text(text)
    return {n.label: n for n in plan_recipe(load_recipe("r", tmp_path)).nodes}


def test_the_section_plans_the_stage_after_near_dedup_with_the_teachers_sandbox(tmp_path):
    teacher = "teacher: {engine: oracle, sandbox: podman, limits: {memory_mb: 3072}, max_episodes: 7}\n"
    plain = _plan(tmp_path, RECIPE + "near_dedup: {}\n" + teacher)
    assert "task_check" not in plain
    nodes = _plan(tmp_path, RECIPE + "near_dedup: {}\ntask_check: {}\n" + teacher)
    v = nodes["task_check"]
    assert [i.label for i in v.inputs] == ["near_dedup"] and [i.label for i in nodes["teacher"].inputs] == [
        "task_check"
    ]
    assert v.config.sandbox == "podman" and v.config.limits.memory_mb == 3072  # the teacher's
    assert v.config.max_episodes == 500  # not the teacher's turn budget: the solution's replay has its own
    assert v.identity == {"sandbox": "podman", "limits": {"memory_mb": 3072}}
    own = _plan(tmp_path, RECIPE + "near_dedup: {}\ntask_check: {sandbox: bwrap}\n" + teacher)["task_check"]
    assert own.config.sandbox == "bwrap" and own.config.limits.memory_mb == 3072
    alone = _plan(tmp_path, RECIPE + "task_check: {no_solution: keep, shards: 3}\n")["task_check"]
    assert [i.label for i in alone.inputs] == ["sources/synth"] and alone.identity == {"no_solution": "keep"}


def test_a_bad_setting_names_its_key(tmp_path):
    from otbuild.errors import ConfigError

    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "r.yaml").write_text(RECIPE + "task_check: {no_solution: maybe}\n")
    with pytest.raises(ConfigError, match=r"task_check\.no_solution"):
        load_recipe("r", tmp_path)


def test_its_estimate_is_two_trials_per_task_and_a_keep_rate(tmp_path):
    from otbuild.estimate.profile import find_profile
    from otbuild.estimate.run import estimate

    _plan(tmp_path, RECIPE + "task_check: {}\n")
    est = estimate(plan_recipe(load_recipe("r", tmp_path)), [], find_profile(None, tmp_path), tmp_path)
    st = next(s for s in est.stages if s.stage == "task_check")
    assert st.counts["tasks_in"].estimate == 6 and st.counts["trials"].estimate == 12
    assert st.counts["tasks_kept"].estimate == pytest.approx(6 * 0.8, abs=1)
    assert STAGES["task_check"].filter and STAGES["task_check"].tasks  # a step of the report's funnel


@needs_sandbox
@pytest.mark.slow
def test_a_real_snakemake_build_validates_before_the_rollouts(tmp_path):
    project = make_project(tmp_path)
    (project / "recipes" / "tiny.yaml").write_text(
        RECIPE + "task_check: {shards: 2}\nteacher: {engine: oracle, sandbox: bwrap, concurrency: 2}\n"
    )
    ran, log = snakemake(project, "tiny", "--cores", "2")
    assert ran["task_check"] == 2 and ran["task_check_merge"] == 1 and ran["rollout"] == 1, log[-3000:]
    (art,) = (project / "artifacts" / "task_check").iterdir()
    record = json.loads((art / "provenance.json").read_text())
    assert record["stats"]["kept"] == 6 and record["stats"]["trials"] == 12, record["stats"]
    assert pq.ParquetFile(art / "rejected.parquet").metadata.num_rows == 0
    assert "task_check" in (project / "results" / "tiny" / "report" / "report.html").read_text()
    again, _ = snakemake(project, "tiny", "--cores", "2")
    assert again == {"tiny": 1}  # nothing but rewriting the results view


def test_the_repo_docs_name_the_section():
    text = (REPO / "docs" / "task-filter.md").read_text()
    assert "task_check:" in text and "noop_passes" in text


HARBOR = Path(os.environ.get("OTBUILD_HARBOR") or REPO / ".venv-harbor" / "bin" / "harbor")


@needs_sandbox
@pytest.mark.skipif(not HARBOR.is_file(), reason=f"Harbor is not installed at {HARBOR}: run scripts/harbor-env.sh")
def test_through_harbor_its_oracle_and_nop_agents_decide_alike(tmp_path):
    """sandbox: harbor runs Harbor's own oracle and nop agents (here in otbuild's environment):
    the same verdicts as otbuild's harness gives."""
    good = list(generate(2, 13, difficulties=[1]))
    lax = _copy(good[1].task, "verifier-passes-anything", tests__test_sh=PASS)
    broken = _copy(good[0].task, "solve-does-nothing", solution__solve_sh="#!/bin/bash\ntrue\n")
    write_tasks(tmp_path / "t.parquet", [good[0], TaskRecord(lax, True), TaskRecord(broken, True)], source="s")
    stats = _run(tmp_path / "t.parquet", tmp_path / "out", sandbox="harbor", harbor={"environment": "otbuild"})
    kept, rejected = _verdicts(tmp_path / "out")
    assert kept == [good[0].task.name], rejected
    assert rejected["verifier-passes-anything"].startswith("noop_passes:")
    assert rejected["solve-does-nothing"].startswith("solution_fails:")
    assert stats["trials_by_engine"] == {"oracle": 3, "noop": 3}
    agents = {e: {a for (a,) in _rows(tmp_path / "out" / e / "traces.parquet", "agent")} for e in ("oracle", "noop")}
    assert agents == {"oracle": {"oracle"}, "noop": {"nop"}}
