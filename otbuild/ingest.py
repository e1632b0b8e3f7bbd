"""`otbuild ingest harbor-job DIR`: an existing Harbor job dir as otbuild's eval tables."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from otbuild import duck
from otbuild.harbor.ingest import job_scores
from otbuild.traces.outcome import EXCLUDED_FROM_SCORES, SCORED_ZERO_ERRORS, classify

SCORES = pa.schema(
    [
        ("model", pa.string()),
        ("benchmark", pa.string()),
        ("repeat", pa.int64()),
        ("task", pa.string()),
        ("reward", pa.float64()),
        ("partial_credit", pa.float64()),
        ("exception", pa.string()),
        ("timed_out", pa.bool_()),
        ("duration", pa.float64()),
        ("outcome", pa.string()),
        ("excluded", pa.bool_()),
    ]
)


def harbor_job(job_dir: Path, out: Path, benchmark: str | None = None) -> dict:
    """scores.parquet and summary.parquet (the eval stage's tables) in `out`, scored as the
    eval stage scores (docs/failures.md): infrastructure failures are left out of the mean."""
    rows = [
        _scored({**r, "benchmark": r["benchmark"] or benchmark or Path(job_dir).name})
        for r in job_scores(Path(job_dir))
    ]
    if not rows:
        raise ValueError(f"{job_dir}: no Harbor trial dirs (expected a job dir with <trial>/result.json)")
    con = duck.connect()
    con.register("ingested", pa.Table.from_pylist(rows, SCORES))
    con.execute("CREATE OR REPLACE TEMP VIEW ev_scores AS SELECT * FROM ingested ORDER BY benchmark, repeat, task")
    duck.run_template(con, "eval_summary.sql")
    out.mkdir(parents=True, exist_ok=True)
    return {
        "scores": duck.copy_to_parquet(con, "SELECT * FROM ev_scores", out / "scores.parquet"),
        "benchmarks": duck.copy_to_parquet(con, "SELECT * FROM ev_summary", out / "summary.parquet"),
    }


def _scored(r: dict) -> dict:
    timed_out = r["exception"] == "AgentTimeoutError"
    outcome = classify(r["exception"], r["exception"], timed_out, r["reward"])
    excluded = outcome in EXCLUDED_FROM_SCORES
    reward = None if excluded else r["reward"] if r["reward"] is not None else 0.0
    partial = 0.0 if outcome in SCORED_ZERO_ERRORS else reward
    return {
        **r,
        "reward": reward,
        "partial_credit": partial,
        "timed_out": timed_out,
        "outcome": outcome,
        "excluded": excluded,
    }
