"""bench/concurrency.py at a tiny size: every trial passes (reward 1) and the table is printed."""

from __future__ import annotations

import re

import pytest

from otbuild.sandbox import backend_problem
from tests.conftest import run_bench

pytestmark = pytest.mark.skipif(backend_problem("bwrap") is not None, reason="bubblewrap unusable here")


def test_bench_concurrency_tiny(tmp_path):
    out = run_bench(
        "concurrency.py",
        "--concurrency",
        "1,4",
        "--latency",
        "0.2",
        "--turns",
        "4",
        "--rounds",
        "1",
        "--out",
        str(tmp_path),
        timeout=120,
    )
    assert "otbuild trials/s against concurrency" in out and "ideal trials/s" in out, out
    assert re.search(r"^(PASS|FAIL): efficiency >= 85% at every concurrency up to 4", out, re.M), out
    assert "trials: ALL PASSED (reward 1)" in out, out
    # a row per level: concurrency, trials (concurrency x 1 round)
    for c in (1, 4):
        assert re.search(rf"\W{c}\W+{c}\W+[\d.]+\W+[\d.]+\W+{c / 0.8:.2f}\W", out), out
