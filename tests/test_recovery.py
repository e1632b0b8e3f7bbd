"""Recovery after a killed snakemake run: which locks go and which stay (the end-to-end kill -9
check is tests/test_workflow.py::test_a_killed_build_recovers_by_itself)."""

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from otbuild.recovery import recover, remove_dead_trial_containers


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


def test_locks_of_a_live_snakemake_stay(tmp_path):
    lock = _locked(tmp_path)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)  # snakemake"], cwd=tmp_path)
    try:
        time.sleep(0.2)
        recover(tmp_path)
        assert lock.exists()
    finally:
        live.kill()
        live.wait()
    recover(tmp_path)
    assert not lock.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="trial roots are tmpfs mounts only as root")
def test_the_trial_tmpfs_of_a_killed_build_is_unmounted_at_the_next_start(tmp_path, capsys):
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\nfrom pathlib import Path\nfrom otbuild.sandbox import open_sandbox\n"
        "from otbuild.sources.synthetic import generate\n"
        f"box = open_sandbox(next(generate(1, 3)).task, Path({str(tmp_path)!r}))\n"
        "print(box.root, flush=True)\ntime.sleep(600)\n")], stdout=subprocess.PIPE, text=True)
    root = holder.stdout.readline().strip()
    assert root in Path("/proc/self/mounts").read_text()
    holder.kill()  # kill -9: nothing closes its trial
    holder.wait()
    remove_dead_trial_containers()
    assert root not in Path("/proc/self/mounts").read_text()
    assert re.search(r"unmounted \d+ trial tmpfs", capsys.readouterr().err)
