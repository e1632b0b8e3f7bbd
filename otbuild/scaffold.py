"""`otbuild init DIR`: a project that uses the installed workflow, from project_template/.

The template's Snakefile, smoke and paper recipes and profiles are the repository's own files
(links in the source tree, copies in the wheel), so a new project starts from exactly what the
repository runs. A file that is already there is never overwritten.
"""

from __future__ import annotations

import os
from pathlib import Path

from otbuild.errors import ConfigError

TEMPLATE = Path(__file__).with_name("project_template")
# Template files stored under another name (a dot file would not be package data).
RENAMED = {"gitignore": ".gitignore"}
# `snakemake --profile slurm` looks in the working directory first: this link resolves it.
PROFILE_LINKS = {"slurm": Path("profiles", "slurm")}


def template_files() -> list[Path]:
    """The template's files, relative to it."""
    return sorted(p.relative_to(TEMPLATE) for p in TEMPLATE.rglob("*") if p.is_file())


def init_project(dest: Path) -> list[Path]:
    """Write the template into `dest` (made if missing) and return what was written. Raises
    ConfigError naming every path that already exists, before writing anything."""
    files = {rel: dest / RENAMED.get(rel.as_posix(), rel) for rel in template_files()}
    links = {dest / name: target for name, target in PROFILE_LINKS.items()}
    taken = [p for p in [*files.values(), *links] if p.exists() or p.is_symlink()]
    if taken:
        raise ConfigError(
            f"otbuild init {dest}: {', '.join(str(p) for p in taken)} already exist(s); init "
            "writes only new files, so move them aside or pick another DIR"
        )
    for rel, path in files.items():
        _write_new(path, (TEMPLATE / rel).read_bytes())
    for link, target in links.items():
        link.symlink_to(target)
    return [*files.values(), *links]


def _write_new(path: Path, data: bytes) -> None:
    """Write `path` whole or not at all, and never over a file that appeared meanwhile."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_bytes(data)
        os.link(tmp, path)  # unlike a rename, fails if `path` exists
    finally:
        tmp.unlink(missing_ok=True)
