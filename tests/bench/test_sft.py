"""bench/sft.py runs end to end at a tiny size: otbuild's trainer (typed settings, as the stage
passes them) and TRL's SFTTrainer train on the same tokens and the ratio is printed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("trl")


@pytest.mark.slow
def test_bench_sft_tiny():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "sft.py"), "--traces", "16", "--repeats", "1"],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    rows = {
        m[1]: (int(m[2]), int(m[3]))
        for m in re.finditer(r"^(otbuild \(DeepSpeed\)|TRL SFTTrainer)\s+(\d+)\s+(\d+)\s", proc.stdout, re.M)
    }
    assert set(rows) == {"otbuild (DeepSpeed)", "TRL SFTTrainer"}, out[-5000:]
    assert rows["otbuild (DeepSpeed)"] == rows["TRL SFTTrainer"], out  # same steps, same tokens
    assert re.search(r"^ratio otbuild / TRL: best [\d.]+x", proc.stdout, re.M), out
