"""Keep bench/llm_stages.py honest: at a tiny size the streamed merge and the whole-table
baseline write the same table (the script exits non-zero when they differ)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_llm_stages_tiny_outputs_match(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "llm_stages.py"),
            "--rows",
            "700",
            "--shards",
            "3",
            "--out",
            str(tmp_path),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "outputs identical" in out, out
    assert "ratio" in out and "whole-table" in out
