"""What a Snakemake job gives a stage: its memory and scratch space (what the profile asks
for the job: otbuild/profiles.py).

A Slurm job knows its memory (SLURM_MEM_PER_NODE: the profile's `mem_mb`, sbatch --mem);
OTBUILD_JOB_MEM_MB says it elsewhere. Snakemake sets TMPDIR from the job's `tmpdir`
resource; some clusters set SLURM_TMPDIR (node-local scratch).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

DEFAULT_DUCKDB_MB = 1024
DUCKDB_SHARE = 0.75  # the rest of the job is for Python and pyarrow batches (a few hundred MB)


def duckdb_memory() -> str:
    """DuckDB's memory limit: OTBUILD_DUCKDB_MEMORY when set (e.g. "4GB"); else three quarters
    of the job's memory (OTBUILD_JOB_MEM_MB, else SLURM_MEM_PER_NODE); else 1GB. Beyond it
    DuckDB spills to disk."""
    if limit := os.environ.get("OTBUILD_DUCKDB_MEMORY"):
        return limit
    job = os.environ.get("OTBUILD_JOB_MEM_MB") or os.environ.get("SLURM_MEM_PER_NODE", "")
    mb = int(int(job) * DUCKDB_SHARE) if job.isdigit() and int(job) > 0 else DEFAULT_DUCKDB_MB
    return f"{max(mb, 256)}MB"


def spill_dir() -> Path:
    """Where DuckDB spills: OTBUILD_DUCKDB_TEMP, else the job's scratch ($SLURM_TMPDIR, then
    $TMPDIR, as tempfile finds it), in a folder otbuild-duckdb; in the shared temp dir, this
    user's own otbuild-duckdb-UID (never one someone else made: it holds the tables' rows)."""
    base = os.environ.get("OTBUILD_DUCKDB_TEMP") or os.environ.get("SLURM_TMPDIR")
    if base:
        return Path(base) / "otbuild-duckdb"
    from otbuild.rundir import private_dir

    return private_dir(Path(tempfile.gettempdir()) / f"otbuild-duckdb-{os.geteuid()}")
