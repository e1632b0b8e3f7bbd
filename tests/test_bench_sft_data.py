"""bench/sft_data.py runs end to end at a tiny size: both sides prepare the same traces."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_bench_sft_data_tiny(tmp_path):
    baseline = "84dd1f7"
    if subprocess.run(["git", "cat-file", "-e", baseline], cwd=ROOT, capture_output=True).returncode:
        pytest.skip(f"no git history with the baseline commit {baseline}")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "sft_data.py"), "--traces", "3", "--cutoff", "4096",
                           "--baseline", baseline], check=False, capture_output=True, text=True, timeout=600,
                          cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for step in ("tokenizer", "tokenize", "total"):
        assert re.search(rf"^{step} .*x$", proc.stdout, re.M), out
    tokens = re.search(r"tokens: baseline (\d+), otbuild (\d+)", proc.stdout)
    # the same traces at the same cutoff: the same order of tokens (otbuild lays reasoning out as
    # Qwen3 does, a few newlines per turn more)
    assert tokens and 0.95 < int(tokens[2]) / int(tokens[1]) < 1.05, out
