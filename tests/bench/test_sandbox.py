"""bench/sandbox.py at a tiny size: every trial passes (reward 1) and the table is printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from otbuild.sandbox import backend_problem

ROOT = Path(__file__).resolve().parents[2]
HARBOR = Path(os.environ.get("OTBUILD_HARBOR") or ROOT / ".venv-harbor" / "bin" / "harbor")  # as bench/sandbox.py

pytestmark = pytest.mark.skipif(backend_problem("bwrap") is not None, reason="bubblewrap unusable here")


def test_bench_sandbox_tiny(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "sandbox.py"),
            "--trials",
            "4",
            "--concurrency",
            "1,2",
            "--no-harbor",
            "--steps",
            "3",
            "--profile-trials",
            "2",
            "--out",
            str(tmp_path),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "otbuild trial loop" in out and "per trial ms" in out, out
    assert "otbuild per-turn latency" in out and "otbuild phase profile" in out, out
    assert "otbuild start-up" in out and ("PASS" in out or "FAIL" in out), out
    assert "trials: ALL PASSED (reward 1)" in out, out
    # a row per concurrency level: system, concurrency, trials
    for c in (1, 2):
        assert re.search(rf"otbuild\W+{c}\W+4\W", out), out


@pytest.mark.slow
@pytest.mark.skipif(
    not HARBOR.is_file(),
    reason="no Harbor CLI ($OTBUILD_HARBOR or .venv-harbor: make harbor-env): the Harbor side is not run",
)
def test_bench_sandbox_against_harbor_tiny(tmp_path):
    """With Harbor's CLI: both systems at concurrency 1 and the per-trial verdict between them."""
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "sandbox.py"),
            "--trials",
            "3",
            "--concurrency",
            "1",
            "--harbor-concurrency",
            "1",
            "--steps",
            "0",
            "--profile-trials",
            "0",
            "--out",
            str(tmp_path),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert re.search(r"harbor\W+1\W+3\W", out), out
    assert re.search(r"^(PASS|FAIL): concurrency 1: otbuild .* ms/trial vs harbor .* ms/trial", out, re.M), out
