"""Keep bench/near_dedup.py honest: at a tiny size near_dedup drops every planted exact twin,
most planted near twins and no task that is no twin, beside exact dedup as the baseline."""

from __future__ import annotations

import re

from tests.conftest import run_bench


def test_bench_near_dedup_tiny(tmp_path):
    out = run_bench("near_dedup.py", "--n", "3000", "--out", str(tmp_path), timeout=300)
    assert "outputs: OK" in out and "stray drops: 0" in out, out
    near = next(line for line in out.splitlines() if re.match(r"\s+3,000 near ", line))
    assert "time x" in near and "RSS x" in near, out  # the ratios against the baseline
    exact_found, total = map(int, re.search(r"exact (\d+)/(\d+)", near).groups())
    found, planted = map(int, re.search(r"near (\d+)/(\d+)", near).groups())
    assert exact_found == total > 0 and planted > 100 and found >= 0.9 * planted, out
    assert re.search(r"\s+3,000 exact .* near 0/\d+ +baseline", out), out  # exact dedup finds no near twin
