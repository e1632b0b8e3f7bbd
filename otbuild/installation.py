"""Which otbuild runs: the Snakefile's jobs call `python -m otbuild` (otbuild.workflow.OTBUILD)
with the Python that runs Snakemake, in the project folder. When that imports another otbuild
than the one the workflow was loaded from (a folder named otbuild/ in the project, PYTHONPATH),
or when the `otbuild` on PATH belongs to another environment than this Snakemake, the build
would silently run other code than the user thinks: say so, before anything runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import otbuild

# What a job's `python -m otbuild` imports: the same sys.path (-c, like -m, puts the current
# folder first); SCRIPT: as a console script does (its own folder first, not the current one).
_WHERE = "import otbuild, os; print(otbuild.__version__); print(os.path.dirname(os.path.realpath(otbuild.__file__)))"
_SCRIPT = "import sys; sys.path.pop(0); " + _WHERE


def _where(python: list[str], code: str, cwd: Path) -> tuple[str, Path] | None:
    """(version, package dir) of the otbuild `python` (with its flags) imports, or None."""
    try:
        res = subprocess.run([*python, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = res.stdout.split()
    return (lines[0], Path(lines[1])) if res.returncode == 0 and len(lines) == 2 else None


def _interpreter(script: Path) -> list[str] | None:
    """The Python of a console script and its flags (its #! line), or None."""
    try:
        with open(script, "rb") as f:
            first = f.readline(4096).decode(errors="replace").strip()
    except OSError:
        return None
    parts = first[2:].split() if first.startswith("#!") else []
    return parts if parts and "python" in Path(parts[0]).name else None


def problems(cwd: Path, workflow_dir: Path) -> list[str]:
    """Warnings about the otbuild this workflow's jobs and the user's `otbuild` command run;
    `workflow_dir`: the otbuild package the Snakefile was loaded from (its folder)."""
    workflow_dir = Path(os.path.realpath(workflow_dir))
    said = []
    jobs = _where([sys.executable], _WHERE, cwd)
    if jobs is None:
        said.append(f"the jobs' `{sys.executable} -m otbuild` cannot import otbuild in {cwd}: every job would fail")
    elif jobs[1] != workflow_dir:
        said.append(
            f"this workflow was loaded from {workflow_dir}, but its jobs (`{sys.executable} -m otbuild` "
            f"in {cwd}) import otbuild {jobs[0]} from {jobs[1]} (a folder named otbuild here, or "
            "PYTHONPATH): they would run other code than the workflow's"
        )
    on_path = shutil.which("otbuild")
    python = _interpreter(Path(on_path)) if on_path else None
    if python and python[0] != sys.executable:
        theirs = _where(python, _SCRIPT, cwd)
        if theirs is not None and theirs[1] != workflow_dir:
            said.append(
                f"the `otbuild` on your PATH ({on_path}: otbuild {theirs[0]} from {theirs[1]}) is another "
                f"installation than the one this snakemake runs (otbuild {otbuild.__version__} from "
                f"{workflow_dir}, with {sys.executable}): run `{python[0]} -m snakemake ...` (or "
                "`otbuild build`) to build with yours, or install otbuild into this snakemake's environment"
            )
    return said


def warn(cwd: Path, workflow_dir: Path) -> None:
    for message in problems(cwd, workflow_dir):
        print(f"otbuild: warning: {message}", file=sys.stderr)
