"""Keep bench/tracking.py runnable: at a few steps it prints its table with every mode."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_tracking_prints_every_mode(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "tracking.py"), "--steps", "20", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {line.split()[0] for line in proc.stdout.splitlines() if line.strip()}
    assert {"jsonl", "tensorboard", "tensorboard+wandb", "target:"} <= rows
    assert list(tmp_path.iterdir()) == []  # its run dirs are removed
