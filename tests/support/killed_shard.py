"""A stage's shard job through the CLI (`otbuild stage NAME --spec ... --shard K`), killed with
SIGKILL (its whole process group) once its partial file holds some finished trials."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def shard_command(stage: str, settings: dict, tasks: Path, outdir: Path, shard: int) -> list[str]:
    """The command line of shard `shard` of `stage` over the task table `tasks`."""
    spec = {
        "stage": stage,
        "id": outdir.name,
        "settings": settings,
        "inputs": [{"id": "t", "stage": "task_filter", "path": str(tasks)}],
        "outdir": str(outdir),
    }
    return [sys.executable, "-m", "otbuild", "stage", stage, "--spec", json.dumps(spec), "--shard", str(shard)]


def kill_after(cmd: list[str], partial: Path, at_least: int, timeout: float = 60) -> int:
    """Start `cmd`, kill -9 its process group once `partial` has `at_least` lines (or after
    `timeout` seconds); returns the lines it had then."""
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (not partial.exists() or len(partial.read_text().splitlines()) < at_least):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return len(partial.read_text().splitlines())
