"""What otbuild itself keeps in an artifact dir beside a stage's outputs, and which of the dir's
files are the artifact. A bottom module: the stage registry, the runner and the trainers all
read it, and it imports nothing of otbuild."""

from __future__ import annotations

from pathlib import Path

PROVENANCE = "provenance.json"  # the record, written last: a dir with one is complete
# the artifact's last `otbuild audit --rebuild` (hidden: not one of its files; otbuild/rebuild.py)
REBUILD = ".rebuild.json"


def top_files(outdir: Path) -> list[Path]:
    """The artifact's files, by name: every plain file at the top of the dir but the record and
    hidden files (a rebuild's result, settings handed to workers); subdirs (resume state,
    shards) are not part of it."""
    return sorted(
        p for p in Path(outdir).iterdir() if p.is_file() and p.name != PROVENANCE and not p.name.startswith(".")
    )
