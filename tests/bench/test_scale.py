"""bench/scale.py runs end to end at a tiny N: every stage (near_dedup, the skills merge and task_check's
merge over tasks, then the trace path) in its own child, the table, the SFT data step in 2 worker processes
reported per trace per worker, and the memory verdict."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_scale", ROOT / "bench" / "scale.py")
assert _spec and _spec.loader
_scale = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_scale)
STAGES = _scale.STAGES  # every stage the benchmark measures: each has its line in the table


@pytest.mark.slow
def test_bench_scale_tiny(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "scale.py"),
            "--n",
            "40,80",
            "--shards",
            "4",
            "--sft-max",
            "80",
            "--sft-workers",
            "2",
            "--out",
            str(tmp_path / "scale"),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    for stage in STAGES:
        assert re.search(rf"^{stage} +80 +[\d.]+ +\d+ +\d+ +-?[\d.]+ +-?[\d.]+$", proc.stdout, re.M), out[-5000:]
    # 80 traces (a few dropped by the trace filter) are 3 batches of 32: 2 workers
    assert re.search(
        r"^sft data N=80: 2 worker processes, [\d.]+ ms per trace, [\d.]+ ms per trace per worker$", proc.stdout, re.M
    ), out[-5000:]
    assert "for every stage and N: PASS" in proc.stdout, out[-5000:]
    assert not (tmp_path / "scale").exists()  # removed without --keep
