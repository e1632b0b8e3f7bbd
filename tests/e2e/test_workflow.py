"""Real snakemake runs: content addressing holds end to end, the audit catches drift."""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from otbuild.plan import plan_recipe
from otbuild.stages import STAGES
from otbuild.recipe.load import load_recipe
from otbuild.report.charts import num
from tests.conftest import DATA, REPO, SMOKE_LOG, otbuild, snakemake

pytestmark = pytest.mark.slow

RECIPE = """
sources:
  a: {kind: synthetic, rank: 1, count: 8, seed: 1, families: [files, text]}
  b: {kind: synthetic, rank: 2, count: 3, seed: 2, families: [data]}
mix: {n: 2, total: 10, order: round_robin}
task_filter: {dedup: true, instruction_chars: {min: 10}}
"""


def _write(project, name, text):
    (project / "recipes" / f"{name}.yaml").write_text(text)


def test_edit_rebuilds_exactly_what_it_invalidates(project):
    _write(project, "r", RECIPE)
    ran, _ = snakemake(project, "r")
    assert ran == {"source": 2, "mix": 1, "task_filter": 1, "report": 1, "results_manifest": 1, "r": 1}
    ran, _ = snakemake(project, "r")
    assert ran == {"r": 1}  # nothing but rewriting the results view

    _write(project, "r", RECIPE.replace("min: 10", "min: 200"))
    dry, log = snakemake(project, "r", "-n")
    assert dry == {"task_filter": 1, "report": 1, "results_manifest": 1, "r": 1}, log
    ran, _ = snakemake(project, "r")
    assert ran == {"task_filter": 1, "report": 1, "results_manifest": 1, "r": 1}

    _write(project, "r", RECIPE)  # edit back: everything is already built
    ran, _ = snakemake(project, "r")
    assert ran == {"results_manifest": 1, "r": 1}  # no stage: the manifest names the old ids again
    manifest = json.loads((project / "results" / "r" / "manifest.json").read_text())
    kept = next(a for a in manifest["artifacts"] if a["label"] == "task_filter")
    assert (project / "results" / "r" / "task_filter").resolve() == (project / kept["dir"]).resolve()
    assert {a["label"] for a in manifest["artifacts"]} == {"sources/a", "sources/b", "mix", "task_filter", "report"}
    assert kept["outputs"][0]["rows"] > 0


def test_recipes_sharing_a_prefix_share_artifacts(project):
    _write(project, "r", RECIPE)
    _write(project, "r2", "extends: r\ntask_filter: {sample: {n: 3}}\n")
    snakemake(project, "r")
    ran, _ = snakemake(project, "r2")
    assert ran == {"task_filter": 1, "report": 1, "results_manifest": 1, "r2": 1}
    mixes = list((project / "artifacts" / "mix").iterdir())
    assert len(mixes) == 1 and len(list((project / "artifacts" / "task_filter").iterdir())) == 2


def test_audit_proves_and_catches_drift(project):
    _write(project, "r", RECIPE)
    assert otbuild(project, "audit", "r").returncode == 1  # nothing built yet: nothing proven
    snakemake(project, "r")
    res = otbuild(project, "audit", "r")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "all 5 artifact(s) match" in res.stdout

    mix_dir = next((project / "artifacts" / "mix").iterdir())
    record = json.loads((mix_dir / "provenance.json").read_text())
    assert record["rule"] == "mix" and record["settings"]["total"] == 10
    assert {i["stage"] for i in record["inputs"]} == {"source"} and all(
        len(i["sha256"]) == 64 for i in record["inputs"]
    )
    assert record["outputs"][0]["rows"] == 10 and "duckdb" in record["packages"]

    assert {"otbuild/stages/mix.py", "otbuild/sql/mix.sql", "otbuild/duck.py"} <= record["code"].keys()
    record["code_sha256"] = "0" * 16  # as if the stage's code had changed since the build
    record["code"]["otbuild/duck.py"] = "0" * 16
    (mix_dir / "provenance.json").write_text(json.dumps(record))
    res = otbuild(project, "audit", "r")
    assert res.returncode == 0 and "changed since build" in res.stdout  # reported, not a finding
    assert "otbuild/duck.py" in res.stdout  # named

    with open(mix_dir / "tasks.parquet", "ab") as f:  # tamper with a built artifact
        f.write(b"x")
    res = otbuild(project, "audit", "r")
    assert res.returncode == 1
    assert "drifted" in res.stdout and mix_dir.name in res.stdout
    res = otbuild(project, "audit", str(mix_dir / "tasks.parquet"))
    assert res.returncode == 1 and '"rule": "mix"' in res.stdout

    tasks = next((project / "artifacts" / "source").iterdir()) / "tasks.parquet"
    st, data = tasks.stat(), bytearray(tasks.read_bytes())
    data[len(data) // 2] ^= 1
    with open(tasks, "r+b") as f:  # a byte flipped in place: same inode, size and mtime
        f.write(data)
    os.utime(tasks, ns=(st.st_atime_ns, st.st_mtime_ns))
    for args in (["audit", "r"], ["audit", "--verify", "r"]):
        res = otbuild(project, *args)
        assert res.returncode == 1 and tasks.parent.name in res.stdout, res.stdout


ROLLOUT = """
sources:
  a: {kind: synthetic, rank: 1, count: 6, seed: 4, difficulties: [3]}
teacher: {engine: oracle, shards: 2, concurrency: 1}
"""


def _start(project, *args):
    """Snakemake in the background as a user starts it in a terminal: SIGINT at its default,
    whatever this test run was started with (default_signals)."""
    from otbuild.harness.terminal import default_signals

    return subprocess.Popen(
        [*default_signals(), sys.executable, "-m", "snakemake", *args],
        cwd=project,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _kill_snakemake_and_wait_for_its_jobs(proc):
    """kill -9 of snakemake itself; the jobs it started run on, orphaned, to their end."""
    proc.kill()
    log = proc.communicate()[0]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return log
        time.sleep(0.1)
    raise AssertionError("the killed run's jobs did not end")


def _wait_for(predicate, timeout=120):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_killed_build_recovers_by_itself(project):
    """kill -9 of snakemake mid-rollout and again mid-merge: a plain rerun neither hits
    LockException nor asks for --rerun-incomplete, and keeps what the killed jobs finished."""
    _write(project, "r", ROLLOUT)
    artifacts = project / "artifacts" / "rollout"
    proc = _start(project, "r")  # 1: killed while the shards run
    _wait_for(lambda: any(p.read_text().count("\n") >= 1 for p in artifacts.glob("*/shards/*.partial.jsonl")))
    _kill_snakemake_and_wait_for_its_jobs(proc)
    assert list((project / ".snakemake" / "locks").glob("*.lock"))
    assert len(list(artifacts.glob("*/shards/*-of-2.parquet"))) == 2  # the orphaned jobs finished

    proc = _start(project, "r")  # 2: plain restart, killed while the merge runs
    _wait_for(lambda: list((project / "logs" / "rollout").glob("*/merge.log")) or proc.poll() is not None)
    log = _kill_snakemake_and_wait_for_its_jobs(proc)
    assert "LockException" not in log and "IncompleteFilesException" not in log, log
    assert "removed the locks of a snakemake run that is no longer running" in log
    assert "2 output(s) of killed jobs were complete and are kept" in log
    assert "rule rollout:" not in log  # the finished shards were not rerun
    assert (next(artifacts.iterdir()) / "provenance.json").exists()  # the orphaned merge finished

    ran, log = snakemake(project, "r")  # 3: plain restart again
    assert "LockException" not in log and "IncompleteFilesException" not in log
    assert "output(s) of killed jobs were complete and are kept" in log
    assert ran == {"report": 1, "results_manifest": 1, "r": 1}, log  # the merge's complete outputs were kept
    traces = pq.read_table(project / "results" / "r" / "teacher" / "traces.parquet").to_pylist()
    assert len(traces) == 6 and all(t["reward"] == 1.0 for t in traces)

    _write(project, "r", ROLLOUT.replace("shards: 2, concurrency: 1", "shards: 3, concurrency: 2"))
    dry, log = snakemake(project, "r", "-n")  # execution knobs: nothing reruns
    assert dry == {"r": 1}, log


def test_failed_stage_leaves_nothing_that_looks_complete(project):
    (project / "data").mkdir()
    (project / "data" / "broken.parquet").write_text("not parquet")
    _write(project, "r", "sources:\n  h: {kind: harbor-parquet, rank: 1, path: data/broken.parquet}\n")
    _, log = snakemake(project, "r", check=False)
    assert "Error in rule source" in log
    assert re.search(r"log: logs/source/[0-9a-f]{16}\.log \(check log file\(s\) for error details\)", log), log
    src = project / "artifacts" / "source"
    assert not any(p.name == "provenance.json" for p in src.rglob("*")) if src.exists() else True
    assert "broken.parquet" in (next((project / "logs" / "source").iterdir())).read_text()


def test_a_path_that_does_not_exist_stops_the_build_before_any_job(project):
    """Issue 26.1: `validate` warns (data may come later); `snakemake NAME` and `otbuild build
    NAME` print the warnings, then refuse before any job or lock: exit 2, naming the file that
    set the key (an `extends` parent here), the key and the path. A dry run only warns."""
    _write(
        project,
        "base",
        "sources:\n  mine: {kind: harbor-dir, rank: 1, path: data/nothere}\n"
        "teacher: {engine: oracle}\ntrace_filter: {}\n",
    )
    _write(project, "r", "extends: base\ntrace_filter: {min_turns: 1}\n")
    said = f"{project}/recipes/base.yaml: sources.mine.path: {project}/data/nothere does not exist"
    res = otbuild(project, "validate", "r")
    assert res.returncode == 0 and f"warning: {said}; the build needs it" in " ".join(res.stderr.split())
    for cmd in ([sys.executable, "-m", "snakemake", "r"], [sys.executable, "-m", "otbuild", "build", "r"]):
        proc = subprocess.run(cmd, cwd=project, capture_output=True, text=True, check=False)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert f"otbuild: error: {said}; the build needs it" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
        assert not (project / "artifacts").exists() and not (project / "logs").exists()
    dry, log = snakemake(project, "r", "-n")
    assert f"otbuild: warning: {said}; the build needs it" in log and dry["source"] == 1


def test_ctrl_c_names_each_interrupted_job_and_how_to_resume(project):
    """Issue 26.3: Ctrl-C (SIGINT to the foreground process group) mid-rollout: one line per
    interrupted job with its log, no RuleException quoting the spec, and the command to resume;
    which then finishes the build."""
    import signal

    _write(project, "r", ROLLOUT)
    proc = _start(project, "r")
    _wait_for(
        lambda: (
            sum(p.read_text().count("\n") for p in (project / "artifacts" / "rollout").glob("*/shards/*.partial.jsonl"))
            >= 1
        )
    )
    os.killpg(proc.pid, signal.SIGINT)
    log = proc.communicate(timeout=120)[0]
    assert proc.returncode != 0
    after = log.split("otbuild: interrupted (Ctrl-C): stopping the running jobs", 1)[1]
    lines = re.findall(r"^otbuild: interrupted: rollout; its log: logs/rollout/\w+/\d-of-2\.log$", after, re.M)
    assert 1 <= len(lines) <= 2, after
    assert "RuleException" not in after and "message: None" not in after and '"settings"' not in after, after
    assert "otbuild: to resume, run `snakemake r` again" in after, after
    ran, _ = snakemake(project, "r")
    assert ran["report"] == 1


def test_invalid_recipe_stops_snakemake_before_anything_runs(project):
    _write(project, "r", RECIPE.replace("order: round_robin", "ordr: round_robin"))
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "r"], cwd=project, capture_output=True, text=True, check=False
    )
    assert proc.returncode != 0
    assert "mix.ordr: unknown key; did you mean 'order'?" in proc.stderr
    assert not (project / "artifacts").exists()


def test_an_invalid_recipe_blocks_only_its_own_target(project):
    """A malformed recipe beside a good one: the good one builds (with a warning naming the
    bad one); asking for the bad one, or one extending it, is its error and exit 2."""
    _write(project, "r", RECIPE)
    _write(project, "bad", RECIPE.replace("order: round_robin", "ordr: round_robin"))
    _write(project, "child", "extends: bad\n")
    _write(project, "deep", "description: " + "[" * 20000 + "]" * 20000 + "\n")
    ran, log = snakemake(project, "r")
    assert ran == {"source": 2, "mix": 1, "task_filter": 1, "report": 1, "results_manifest": 1, "r": 1}
    assert (
        "warning: recipes/bad.yaml is not valid, so target 'bad' cannot be built (the others can): "
        f"{project}/recipes/bad.yaml: mix.ordr: unknown key" in log
    )
    assert "target 'child' cannot be built" in log and "target 'deep' cannot be built" in log
    for target in ("bad", "child"):
        proc = subprocess.run(
            [sys.executable, "-m", "snakemake", "-n", target], cwd=project, capture_output=True, text=True, check=False
        )
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert f"otbuild: {project}/recipes/bad.yaml: mix.ordr: unknown key; did you mean 'order'?" in proc.stderr


def test_snakemake_warns_when_another_installation_s_otbuild_would_run(project, tmp_path):
    """Issue 26.7: the `otbuild` on PATH belongs to another environment (a venv whose otbuild
    is another package) than the snakemake run: the workflow says so before anything runs.
    And the jobs' `python -m otbuild` is checked against the package the Snakefile came from."""
    from otbuild import installation

    env_a, other = tmp_path / "envA", tmp_path / "other"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_a)], check=True)
    (other / "otbuild").mkdir(parents=True)
    (other / "otbuild" / "__init__.py").write_text('__version__ = "9.9"\n')
    (next((env_a / "lib").glob("python3*")) / "site-packages" / "other.pth").write_text(f"{other}\n")
    (env_a / "bin" / "otbuild").write_text(f"#!{env_a}/bin/python -E\nimport sys\n")  # -E: not our PYTHONPATH
    (env_a / "bin" / "otbuild").chmod(0o755)
    _write(project, "r", RECIPE)
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "r"],
        cwd=project,
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": f"{env_a}/bin:{os.environ['PATH']}"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    said = " ".join(proc.stderr.split())
    assert (
        f"otbuild: warning: the `otbuild` on your PATH ({env_a}/bin/otbuild: otbuild 9.9 from {other}/otbuild) "
        f"is another installation than the one this snakemake runs"
    ) in said, proc.stderr
    _, log = snakemake(project, "-n", "r")
    assert "otbuild: warning" not in log  # the same installation: nothing to say
    elsewhere = tmp_path / "elsewhere"
    assert installation.problems(project, elsewhere)[0].startswith(
        f"this workflow was loaded from {elsewhere}, but its jobs (`{sys.executable} -m otbuild` in {project}) "
        f"import otbuild"
    )


def test_smoke_recipe_builds(smoke_build):
    project, ran = smoke_build
    assert ran == {
        "source": 3,
        "mix": 1,
        "task_filter": 1,
        "rollout": 2,
        "rollout_merge": 1,
        "trace_filter": 1,
        "sft": 2,
        "rl": 1,
        "eval": 2,
        "eval_merge": 2,
        "report": 1,
        "results_manifest": 1,
        "smoke": 1,
    }  # sft and eval: the student's and its untrained base's
    res = otbuild(project, "show", "results/smoke/task_filter/kept.parquet")
    assert res.returncode == 0 and "synthetic-" in res.stdout
    traces = pq.read_table(project / "results" / "smoke" / "teacher" / "traces.parquet").to_pylist()
    assert len(traces) == 110 and all(t["reward"] == 1.0 for t in traces)  # the oracle solves them all
    assert all(t["n_turns"] >= 5 and t["conversations"][0]["role"] == "user" for t in traces)
    res = otbuild(project, "show", "results/smoke/trace_filter/kept.parquet", "--row", "0")
    assert res.returncode == 0 and "Output:" in res.stdout and "agent@sandbox:/app#" in res.stdout  # compact replies
    # the student: trained, RLOO-tuned, evaluated on held-out tasks (n = 3), reported
    sft_log = (project / "results" / "smoke" / "sft" / "train_log.jsonl").read_text().splitlines()
    assert sft_log and all("loss" in json.loads(line) for line in sft_log)
    rl_log = [
        json.loads(line) for line in (project / "results" / "smoke" / "rl" / "train_log.jsonl").read_text().splitlines()
    ]
    assert len(rl_log) == 2 and all("reward_mean" in r for r in rl_log)
    summary = pq.read_table(project / "results" / "smoke" / "eval" / "summary.parquet").to_pylist()
    assert [(s["benchmark"], s["repeats"], s["n_tasks"], s["n_exceptions"]) for s in summary] == [("heldout", 3, 12, 0)]
    base = pq.read_table(project / "results" / "smoke" / "base" / "eval" / "summary.parquet").to_pylist()
    assert [(s["benchmark"], s["repeats"], s["n_tasks"]) for s in base] == [("heldout", 3, 12)]
    assert summary[0]["mean"] > base[0]["mean"]  # the thesis: the student passes tasks its base does not
    assert json.loads((project / "results" / "smoke" / "base" / "sft" / "checkpoint.json").read_text())["steps"] == 0
    heldout = {
        r["task_id"] for r in pq.read_table(project / "results" / "smoke" / "eval" / "scores.parquet").to_pylist()
    }
    trained = {t["task_id"] for t in traces}
    assert heldout and not heldout & trained  # held-out tasks never enter training
    html = (project / "results" / "smoke" / "report" / "report.html").read_text()
    assert "SFT loss curve" in html and "No SFT checkpoint" not in html and "No RL checkpoint" not in html
    _, log = snakemake(project, "--report", "snakemake-report.html", "smoke")  # report() marks
    assert "Adding report.html" in log and "Adding dataset_card.md" in log
    assert (project / "snakemake-report.html").stat().st_size > 0


def test_snakemake_report_and_summary_know_otbuild_s_results_and_logs(smoke_build, tmp_path):
    """Issue 39.1-2 on the smoke build: `snakemake --report x.zip` holds otbuild's report page,
    the dataset card and the manifest (Results), the eval summary (Evaluation) and the training
    logs (Training), each with its caption, beside Snakemake's runtimes; `--summary` names each
    job's log."""
    import zipfile

    project, _ = smoke_build
    node = {n.label: n for n in plan_recipe(load_recipe("smoke", project)).nodes}
    _, log = snakemake(project, "--report", str(tmp_path / "report.zip"), "smoke")
    for name in ("report.html", "dataset_card.md", "manifest.json", "summary.parquet", "train_log.jsonl"):
        assert f"Adding {name}" in log, (name, log)
    with zipfile.ZipFile(tmp_path / "report.zip") as z:
        names = z.namelist()
        data = next(z.read(n).decode() for n in names if n.endswith("report.html") and "/data/" not in n)
        shipped = {n.rsplit("/", 1)[-1] for n in names}
        results = next(z.read(n) for n in names if n.endswith("/manifest.json"))
    assert {"report.html", "dataset_card.md", "manifest.json", "summary.parquet", "train_log.jsonl"} <= shipped
    assert json.loads(results) == json.loads((project / "results" / "smoke" / "manifest.json").read_text())
    for category in ("Results", "Evaluation", "Training"):
        assert f'"{category}"' in data, category
    assert "Manifest of recipe <strong>smoke</strong>" in data and "Eval summary" in data and "SFT training log" in data
    assert "runtimes" in data.lower()  # Snakemake's own statistics
    _, summary = snakemake(project, "--summary", "smoke")
    for label, log_path in (
        ("teacher", "logs/rollout/{id}/0-of-2.log"),
        ("sft", "logs/sft/{id}.log"),
        ("report", "logs/report/{id}.log"),
    ):
        assert log_path.format(id=node[label].id) in summary, (label, summary[-3000:])


def test_snakemake_lint_says_nothing_but_the_answered_software_advice(project):
    """Issue 39.3: `snakemake --lint` over the workflow (every recipe of the repository) flags no
    rule without a log, no path made with `+`, no function beside rules; what it still advises
    (a conda env or container per rule) docs/architecture.md answers."""
    for recipe in (REPO / "recipes").glob("*.yaml"):
        shutil.copy(recipe, project / "recipes")
    _, log = snakemake(project, "--lint", check=False)
    said = {line.strip() for line in log.splitlines() if line.startswith("    * ")}
    assert said == {"* Specify a conda environment or container for each rule.:"}, log
    assert "Lints for snakefile" not in log  # nothing about the .smk files themselves
    answer = (REPO / "docs" / "architecture.md").read_text()
    assert "## Jobs run in the installed environment" in answer and "`conda:`" in answer


def test_smoke_build_says_what_it_made_and_shows_progress(smoke_build):
    """Issue 26.4 on `snakemake smoke`: long jobs' progress on the console, naming the log to
    follow; at the end where the results and report are and the headline numbers: the student's
    pass@1 beside its untrained base's (issue 45: above it), and no warning (its RL steps have
    advantages, its eval scores; tests/report/test_report.py builds the cases where they fire)."""
    project, _ = smoke_build
    log = (project / SMOKE_LOG).read_text()
    plan = plan_recipe(load_recipe("smoke", project))
    node = {n.label: n for n in plan.nodes}
    for shard in (0, 1):  # the rollout shards: named by label, with done/total and the log
        assert re.search(
            rf"otbuild: teacher, shard {shard + 1} of 2: trials \d+/55 \(\d+%\).*; follow it: "
            rf"tail -f logs/rollout/{node['teacher'].id}/{shard}-of-2.log",
            log,
        ), shard
    assert re.search(
        rf"otbuild: sft: SFT steps \d+/1,500 \(\d+%\).*; follow it: tail -f logs/sft/{node['sft'].id}.log", log
    )
    assert re.search(r"otbuild: sft: SFT steps [\d,]+/1,500 \(\d+%\), loss [\d.]+", log)
    said = log[log.index("otbuild: smoke is built in ") :]
    report = json.loads((project / "results" / "smoke" / "report" / "provenance.json").read_text())["stats"]["costs"]
    score, base = (
        pq.read_table(project / "results" / "smoke" / label / "summary.parquet").to_pylist()[0]
        for label in ("eval", "base/eval")
    )
    for line in (
        "  results      results/smoke/  (manifest.json",
        "  report       results/smoke/report/report.html",
        "  tasks kept   110 (task_filter)",
        "  traces kept  110 (trace_filter)",
        (
            f"  pass@1       heldout student {num(score['mean'])} ± {num(score['stderr'])} "
            f"vs base {num(base['mean'])} ± {num(base['stderr'])} (3 repeats x 12 tasks"
        ),
        f"  tokens       {report['input_tokens']:,} in, {report['output_tokens']:,} out "
        f"({report['requests']:,} requests); cost – (no prices: set `prices:` in the recipe)",
        "  job time     ",
    ):
        assert line in said, (line, said)
    assert score["mean"] > base["mean"] and "warning:" not in said, said
    rl = [json.loads(x) for x in (project / "results" / "smoke" / "rl" / "train_log.jsonl").read_text().splitlines()]
    assert any(r["loss"] != 0 and r["grad_norm"] > 0 for r in rl), rl  # a learning signal
    assert not list((project / ".otbuild" / "progress").glob("*.json"))  # every job cleaned up


GPU_RULES = {s.name for s in STAGES.values() if s.gpu}  # a sharded stage's shard jobs; its merge on a CPU


@pytest.mark.parametrize(
    "recipe",
    [
        "otagent_v2_100k",
        "otagent_v2_10k",
        "ablate_mixing",
        "ablate_task_filter",
        "ablate_teacher",
        "ablate_trace_filter",
    ],
)
def test_slurm_dry_run_from_the_repo_root(recipe):
    """The literal user command; the `slurm` link makes the profile resolvable from here.
    Every GPU rule lands on GPU resources (GPUs per node), the CPU rules do not; multi-node
    rules run their own srun (`mpi`), or the plugin would squeeze them into `srun -n1`."""
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--profile", "slurm", recipe, "-n"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "slurm_partition=<cpu-partition>" in log and "This was a dry-run" in log
    assert (
        "otbuild: warning: profile slurm (slurm/config.yaml) still has placeholders: <account> (line " in log
    )  # issue 26.7
    jobs: dict[str, set] = {}  # rule -> the resources lines of its jobs, from the dry run
    for block in log.split("\nrule ")[1:]:
        name = block.split(":", 1)[0].strip()
        jobs.setdefault(name, set()).add(next((ln for ln in block.splitlines() if "resources:" in ln), ""))
    assert GPU_RULES & set(jobs), sorted(jobs)
    for rule, lines in jobs.items():
        on_gpu = {"slurm_partition=<gpu-partition>" in ln and "gres=gpu:<gpu-model>:" in ln for ln in lines}
        assert on_gpu == {rule in GPU_RULES}, (rule, lines)
        assert all("mpi=srun" in ln for ln in lines if re.search(r"\bnodes=([2-9]|\d\d)", ln)), (rule, lines)
    if "sft" in jobs:
        assert all("nodes=4" in ln for ln in jobs["sft"])  # multi-node DeepSpeed


def test_a_profile_s_unfilled_placeholders_are_named_once_filled_nothing(tmp_path):
    """Issue 26.7: each `<...>` of profiles/slurm once, with its line; comments do not count."""
    from otbuild.profiles import profile_warnings

    text = (REPO / "profiles" / "slurm" / "config.yaml").read_text()
    (tmp_path / "config.yaml").write_text(text)
    (warning,) = profile_warnings(["--profile", str(tmp_path), "-n", "smoke"])
    placeholders = re.findall(r"<[\w-]+>", warning)
    assert placeholders == ["<account>", "<cpu-partition>", "<gpu-partition>", "<gpu-model>"], warning
    for p in placeholders:
        text = text.replace(p, "filled")
    (tmp_path / "config.yaml").write_text(text)
    assert profile_warnings(["--profile", str(tmp_path), "-n", "smoke"]) == []
    assert "<" in text  # `# Replace every <...> placeholder` stays: a comment


@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data/dev is not present")
def test_real_sources_mixed_with_synthetic_build_through_the_trace_filter(project):
    """Issue 6's end to end: real task sources + the synthetic one -> mix -> oracle rollouts in
    the sandbox (container-only tasks recorded, not run) + imported trajectories -> filter."""
    recipe = f"""
sources:
  synth: {{kind: synthetic, rank: 1, count: 6, seed: 4}}
  nl2bash: {{kind: nl2bash, rank: 2, path: {DATA}/nl2bash/nl2bash_pairs.jsonl}}
  superuser: {{kind: stackexchange, rank: 3, path: {DATA}/stackexchange/superuser_bash_accepted.jsonl}}
  swe: {{kind: swe-instances, rank: 4, path: {DATA}/swebench_verified/instances.jsonl}}
mix: {{n: 4, total: 16, order: round_robin}}
teacher: {{engine: oracle, shards: 2, concurrency: 2}}
trace_imports:
  mini: {{kind: mini-swe-agent, path: {DATA}/trajectories/mini_swe_agent_swebench_verified}}
trace_filter: {{min_turns: 5}}
"""
    _write(project, "real", recipe)
    ran, _ = snakemake(project, "real")
    assert ran["source"] == 4 and ran["trace_import"] == 1 and ran["trace_filter"] == 1
    traces = pq.read_table(project / "results" / "real" / "teacher" / "traces.parquet").to_pylist()
    by_source = {}
    for t in traces:
        by_source.setdefault(t["source"], []).append(t)
    assert {k: len(v) for k, v in by_source.items()} == {"synth": 4, "nl2bash": 4, "superuser": 4, "swe": 4}
    assert all(t["reward"] == 1.0 for t in by_source["synth"])
    assert all(t["exception"] == "TaskNotRunnableLocally" for t in by_source["swe"])
    kept = pq.read_table(project / "results" / "real" / "trace_filter" / "kept.parquet").to_pylist()
    rejected = pq.read_table(project / "results" / "real" / "trace_filter" / "rejected.parquet").to_pylist()
    assert len(kept) + len(rejected) == 16 + 5  # rollouts + imported mini-swe-agent trajectories
    assert {r["reason"] for r in rejected if r["source"] == "swe"} == {"exception: TaskNotRunnableLocally"}
    assert any(k["source"] == "import:mini" or k["agent"] == "mini-swe-agent" for k in kept)
    assert all(k["n_turns"] >= 5 for k in kept)


def test_ablation_smoke_builds_shares_and_ranks(project):
    """Issue 5's definition of done, on the CPU: a real ablation grid, end to end."""
    for name in ("smoke", "ablate_trace_filter_smoke"):
        shutil.copy(REPO / "recipes" / f"{name}.yaml", project / "recipes")
    ran, _ = snakemake(project, "ablate_trace_filter_smoke")
    # the candidates differ only in the trace filter: one rollout, two filters, two students
    assert ran["rollout_merge"] == 1 and ran["trace_filter"] == 2 and ran["sft"] == 2 and ran["rank"] == 1
    out = project / "results" / "ablate_trace_filter_smoke"
    ranking = pq.read_table(out / "ranking" / "ranking.parquet").to_pylist()
    assert sorted(r["candidate"] for r in ranking) == ["trace_filter.min_turns=5", "trace_filter.min_turns=7"]
    assert all(r["complete"] and r["rank"] is not None for r in ranking)
    for cand in ("trace_filter.min_turns=5", "trace_filter.min_turns=7"):
        assert (out / "candidates" / cand / "eval" / "summary.parquet").exists()
    html = (out / "report" / "report.html").read_text()
    assert "Ranking" in html and "mean z" in html.lower()
    assert otbuild(project, "audit", "ablate_trace_filter_smoke").returncode == 0
