"""bench/sandbox.py at a tiny size: every trial passes (reward 1) and the table is printed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from otbuild.sandbox import backend_problem

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(backend_problem("bwrap") is not None, reason="bubblewrap unusable here")


def test_bench_sandbox_tiny(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "sandbox.py"), "--trials", "4", "--concurrency", "1,2",
         "--no-harbor", "--steps", "3", "--profile-trials", "2", "--out", str(tmp_path)],
        check=False, capture_output=True, text=True, timeout=60, cwd=ROOT,
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
