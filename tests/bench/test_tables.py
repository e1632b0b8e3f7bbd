"""Keep the pandas baseline in bench/tables.py honest: at a tiny size it must reproduce the
DuckDB stages' outputs exactly (the script exits non-zero when they differ)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("pandas")


def test_bench_tables_tiny_outputs_match(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "tables.py"), "--rows", "3000", "--out", str(tmp_path), "--repeat", "1"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "outputs: MATCH" in out, out
    for name in ("mix tasks.parquet", "task_filter kept.parquet", "task_filter rejected.parquet"):
        assert f"outputs {name}: MATCH" in out, out
    # the data exercises upsampling and every filter step the benchmark configures
    rejected = tmp_path / "run-duckdb" / "task_filter" / "rejected.parquet"
    import pyarrow.parquet as pq

    reasons = {r.split(":")[0] for r in pq.read_table(rejected, columns=["reason"]).column(0).to_pylist()}
    assert {"duplicate", "too_short", "too_long", "exclude_regex", "not_sampled"} <= reasons
    mixed = pq.read_table(tmp_path / "run-duckdb" / "mix" / "tasks.parquet", columns=["mix_upsampled"])
    assert any(mixed.column(0).to_pylist())
