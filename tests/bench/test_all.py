"""Every benchmark is run by `make bench` and exercised by a test at a small size, so a refactor
cannot break one unnoticed (bench/tracegen.py is the generator bench/scale.py and
tests/stages/test_scale.py use, bench/outdir.py the scripts' `--out` helper: not benchmarks)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HELPERS = {"tracegen.py", "outdir.py"}


def test_every_benchmark_runs_in_make_bench_and_in_a_test():
    scripts = {p.name for p in (ROOT / "bench").glob("*.py")} - HELPERS
    makefile = (ROOT / "Makefile").read_text()
    target = re.search(r"^bench:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert target, "no bench target in the Makefile"
    assert {m for m in re.findall(r"bench/(\w+\.py)", target[1])} == scripts
    tests = {p.name: p.read_text() for p in (ROOT / "tests" / "bench").glob("test_*.py")}
    for name in sorted(scripts):
        runs = [t for t, text in tests.items() if re.search(rf'"bench" / "{name}"|run_bench\(\s*"{name}"', text)]
        assert runs, f"bench/{name}: no tests/bench/test_*.py runs it"
