"""Keep bench/decontaminate.py honest: at a tiny size the DuckDB stage, the indexed Python
version and the pair-by-pair rule must name the same benchmark task for every row."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_decontaminate_tiny_outputs_match(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "decontaminate.py"),
            "--rows",
            "1500",
            "--benchmark-tasks",
            "30",
            "--pairwise-rows",
            "1500",
            "--fuzzy-pairwise-rows",
            "1",
            "--out",
            str(tmp_path),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and out.count("outputs: MATCH") == 2, out
    contaminated = int(out.split("contaminated rows ")[1].split(" ")[0].replace(",", ""))
    assert 10 <= contaminated < 100, out  # the generator's leaks (~1.2%) are found, and little else
    assert "python-pairwise+fuzzy 0.8" in out and "x (extrapolated)" in out, out  # the table, with its ratios
    ngrams, fuzzy = (line for line in out.splitlines() if "planted found: " in line)
    planted = {
        k: tuple(map(int, v.split("/")))
        for k, v in (p.split(" ") for p in ngrams.split("planted found: ")[1].split(";")[0].split(", "))
    }
    assert planted["copy"][0] == planted["copy"][1] and planted["quote"][0] == planted["quote"][1], out
    assert planted["reworded"][0] == 0 < planted["reworded"][1], out  # the 13-grams miss every reworded leak
    assert f"reworded {planted['reworded'][1]}/{planted['reworded'][1]}" in fuzzy, out  # the fuzzy pass finds them all
