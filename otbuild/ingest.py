"""`otbuild ingest harbor-job DIR`: an existing Harbor job dir as otbuild's eval tables."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from otbuild import duck
from otbuild.harbor.ingest import job_scores

SCORES = pa.schema([("model", pa.string()), ("benchmark", pa.string()), ("repeat", pa.int64()),
                    ("task", pa.string()), ("reward", pa.float64()), ("partial_credit", pa.float64()),
                    ("exception", pa.string()),
                    ("timed_out", pa.bool_()), ("duration", pa.float64())])


def harbor_job(job_dir: Path, out: Path, benchmark: str | None = None) -> dict:
    """scores.parquet and summary.parquet (the eval stage's tables) in `out`."""
    rows = [{**r, "benchmark": r["benchmark"] or benchmark or Path(job_dir).name,
             "reward": r["reward"] if r["reward"] is not None else 0.0,
             "partial_credit": r["reward"] if r["reward"] is not None else 0.0,
             "timed_out": r["exception"] == "AgentTimeoutError"} for r in job_scores(Path(job_dir))]
    if not rows:
        raise ValueError(f"{job_dir}: no Harbor trial dirs (expected a job dir with <trial>/result.json)")
    con = duck.connect()
    con.register("ingested", pa.Table.from_pylist(rows, SCORES))
    con.execute("CREATE OR REPLACE TEMP VIEW ev_scores AS SELECT * FROM ingested ORDER BY benchmark, repeat, task")
    duck.run_template(con, "eval_summary.sql")
    out.mkdir(parents=True, exist_ok=True)
    return {"scores": duck.copy_to_parquet(con, "SELECT * FROM ev_scores", out / "scores.parquet"),
            "benchmarks": duck.copy_to_parquet(con, "SELECT * FROM ev_summary", out / "summary.parquet")}
