"""Keep bench/tracking.py runnable: at a few steps it prints its table with every mode. And
every benchmark's `--out`: made when missing, refused (exit 2, no traceback) when it cannot be."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_bench_tracking_prints_every_mode(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = tmp_path / "not" / "yet"  # made (issue 26.3)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "tracking.py"), "--steps", "20", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {line.split()[0] for line in proc.stdout.splitlines() if line.strip()}
    assert {"jsonl", "tensorboard", "tensorboard+wandb", "target:"} <= rows
    assert list(out.iterdir()) == []  # its run dirs are removed


@pytest.mark.parametrize("script", ["decontaminate", "llm_stages", "sandbox", "scale", "tables", "tracking"])
def test_bench_out_that_cannot_be_a_folder_is_refused(script, tmp_path):
    (tmp_path / "file").write_text("")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / f"{script}.py"), "--out", str(tmp_path / "file" / "x")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"argument --out: cannot make the folder {tmp_path}/file/x" in proc.stderr and "Traceback" not in proc.stderr
