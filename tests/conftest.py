"""Shared test helpers: small task parquets, a throwaway project, real snakemake runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from otbuild.tasks.table import TaskRecord, write_tasks
from otbuild.tasks.taskdir import TaskDir

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "dev"


def make_task(name: str, instruction: str, **metadata) -> TaskRecord:
    t = TaskDir(name)
    t.add("instruction.md", instruction)
    t.add("task.toml", 'version = "1.0"\n')
    t.add("tests/test.sh", "#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n", executable=True)
    return TaskRecord(t, runnable_locally=True, metadata=metadata)


def write_source(path: Path, source: str, instructions: list[str], **metadata_lists) -> Path:
    records = [
        make_task(f"{source}-{i}", text, **{k: v[i] for k, v in metadata_lists.items()})
        for i, text in enumerate(instructions)
    ]
    write_tasks(path, records, source=source)
    return path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """An empty otbuild project: the repo's Snakefile, rules and profiles, own recipes/."""
    for name in ("Snakefile", "rules", "profiles"):
        (tmp_path / name).symlink_to(REPO / name)
    (tmp_path / "recipes").mkdir()
    return tmp_path


def snakemake(project: Path, *args: str, check: bool = True) -> tuple[Counter, str]:
    """Run the real snakemake CLI in `project`; return the jobs it ran per rule, and its log."""
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", *args], cwd=project, capture_output=True, text=True, check=False,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    log = proc.stdout + proc.stderr
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed ({proc.returncode}):\n{log[-6000:]}")
    return job_counts(log), log


def job_counts(log: str) -> Counter:
    counts: Counter = Counter()
    if "Job stats:" in log:
        table = log.split("Job stats:", 1)[1]
        for line in table.splitlines()[3:]:
            m = re.match(r"^(\S+)\s+(\d+)$", line.strip())
            if not m or m.group(1) == "total":
                break
            counts[m.group(1)] = int(m.group(2))
    return counts


def otbuild(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "otbuild", *args], cwd=project, capture_output=True, text=True, check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
