"""bench/sft_data.py runs end to end at a tiny size: both sides prepare the same traces, and 1
and 2 worker processes write the same tokenized set."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_sft_data_tiny(tmp_path):
    baseline = "84dd1f7"
    if subprocess.run(["git", "cat-file", "-e", baseline], cwd=ROOT, capture_output=True).returncode:
        pytest.skip(f"no git history with the baseline commit {baseline}")
    # 40 traces: 2 batches of 32, so 2 workers are 2 processes
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "sft_data.py"),
            "--traces",
            "40",
            "--cutoff",
            "4096",
            "--baseline",
            baseline,
            "--workers",
            "1,2",
            "--repeats",
            "1",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for step in ("tokenizer", "tokenize", "total"):
        assert re.search(rf"^{step} .*x$", proc.stdout, re.M), out
    tokens = re.search(r"tokens: baseline (\d+), otbuild (\d+)", proc.stdout)
    # the same traces at the same cutoff: the same order of tokens (otbuild lays reasoning out as
    # Qwen3 does, a few newlines per turn more)
    assert tokens and 0.95 < int(tokens[2]) / int(tokens[1]) < 1.05, out
    for w in (1, 2):
        assert re.search(rf"^{w} +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+x  \[", proc.stdout, re.M), out
    assert "tokens.arrow: IDENTICAL for every worker count" in proc.stdout, out
    assert re.search(r"^(PASS|FAIL): 2 workers [\d.]+x one \(target >= 1.8x\)$", proc.stdout, re.M), out
