"""Recovery after a killed snakemake run: which locks go and which stay (the end-to-end kill -9
check is tests/e2e/test_workflow.py::test_a_killed_build_recovers_by_itself)."""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from otbuild.recovery import recover, remove_dead_trial_containers, runs_snakemake


def _locked(root, owner=None):
    locks = root / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    (locks / "0.input.lock").write_text("artifacts/x\n")
    if owner:
        (locks / "otbuild-owner.json").write_text(json.dumps(owner))
    return locks / "0.input.lock"


def test_locks_of_a_dead_run_on_this_host_are_removed(tmp_path, capsys):
    lock = _locked(tmp_path, {"host": socket.gethostname(), "pid": 999999999})
    recover(tmp_path)
    assert not lock.exists() and "no longer running (pid 999999999)" in capsys.readouterr().err


def test_locks_taken_on_another_host_stay_with_the_command_to_run(tmp_path, capsys):
    lock = _locked(tmp_path, {"host": "login-other", "pid": 42})
    recover(tmp_path)
    assert lock.exists()
    assert "held by a snakemake started on login-other (pid 42)" in (err := capsys.readouterr().err)
    assert "snakemake --unlock" in err


def _spawn(argv, cwd):
    """`argv` in a process group of its own, so `_end` ends what it started too."""
    proc = subprocess.Popen(argv, cwd=cwd, start_new_session=True)
    time.sleep(0.2)
    return proc


def _end(proc) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # `timeout` killed alone leaves its child running
    proc.wait()


def test_locks_of_a_live_snakemake_stay(tmp_path):
    lock = _locked(tmp_path)
    program = tmp_path / "bin" / "snakemake"  # a console script named snakemake, run by Python
    program.parent.mkdir()
    program.write_text("import time\ntime.sleep(60)\n")
    live = _spawn([sys.executable, str(program), "r"], tmp_path)
    try:
        recover(tmp_path)
        assert lock.exists()
    finally:
        _end(live)
    recover(tmp_path)
    assert not lock.exists()


def test_a_wrapper_naming_snakemake_is_not_a_live_run(tmp_path):
    """`timeout 600 snakemake R` (or time, srun) outlives a killed snakemake, and wraps the
    restart itself: neither may keep the dead run's locks."""
    lock = _locked(tmp_path, {"host": socket.gethostname(), "pid": 999999999})
    program = tmp_path / "bin" / "snakemake"  # wrapped, but not Snakemake's process (a shell runs it)
    program.parent.mkdir()
    program.write_text("#!/bin/sh\nsleep 60\n")
    program.chmod(0o755)
    wrapper = _spawn(["timeout", "60", str(program)], tmp_path)
    try:
        recover(tmp_path)
        assert not lock.exists()
    finally:
        _end(wrapper)


def test_snakemake_is_told_apart_from_what_wraps_or_mentions_it():
    def runs(cmd):
        return runs_snakemake([a.encode() for a in cmd.split()])

    for cmd in (
        "/venv/bin/python3.12 /venv/bin/snakemake smoke",
        "python -u -m snakemake -n smoke",
        "python3 -X dev /x/snakemake",
        "snakemake smoke",
    ):
        assert runs(cmd), cmd
    for cmd in (
        "timeout 600 snakemake smoke",
        "/usr/bin/time -v snakemake smoke",
        "srun snakemake smoke",
        "bash -c snakemake",
        "python -c snakemake",
        "python -m pytest tests/snakemake",
        "python /x/run_snakemake.py",
        "vim Snakefile",
        "",
    ):
        assert not runs(cmd), cmd


@pytest.mark.slow
def test_a_run_killed_then_restarted_under_timeout_recovers(project):
    """The issue's repro: setsid snakemake R & ...; kill -9 -- -$!; timeout 600 snakemake R."""
    (project / "recipes" / "r.yaml").write_text(
        "sources:\n  a: {kind: synthetic, rank: 1, count: 4, seed: 4, difficulties: [3]}\n"
        "teacher: {engine: oracle, shards: 2, concurrency: 1}\n"
    )
    first = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "r"],
        cwd=project,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while not list((project / "artifacts").glob("rollout/*/shards/*.partial.jsonl")):
        assert first.poll() is None and time.monotonic() < deadline, "the first run never reached its rollouts"
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGKILL)  # the run and all its jobs
    first.wait()
    assert list((project / ".snakemake" / "locks").glob("*.lock"))

    console_script = Path(sys.executable).with_name("snakemake")
    restart = subprocess.run(
        ["timeout", "600", str(console_script), "r"], cwd=project, capture_output=True, text=True, check=False
    )
    log = restart.stdout + restart.stderr
    assert restart.returncode == 0, log[-4000:]
    assert "LockException" not in log and "removed the locks of a snakemake run" in log
    assert (project / "results" / "r" / "teacher" / "traces.parquet").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="trial roots are tmpfs mounts only as root")
def test_the_trial_tmpfs_of_a_killed_build_is_unmounted_at_the_next_start(tmp_path, capsys):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, time\nfrom pathlib import Path\nfrom otbuild.sandbox import open_sandbox\n"
                "from otbuild.sources.synthetic import generate\n"
                f"box = open_sandbox(next(generate(1, 3)).task, Path({str(tmp_path)!r}))\n"
                "print(box.root, flush=True)\ntime.sleep(600)\n"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    root = holder.stdout.readline().strip()
    assert root in Path("/proc/self/mounts").read_text()
    holder.kill()  # kill -9: nothing closes its trial
    holder.wait()
    remove_dead_trial_containers()
    assert root not in Path("/proc/self/mounts").read_text()
    assert re.search(r"unmounted \d+ trial tmpfs", capsys.readouterr().err)
