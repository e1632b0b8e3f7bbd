"""Provenance sidecars: what made an artifact, from what, with which settings, code and packages.

Every artifact dir gets `provenance.json`, written last (atomically), so a dir with a record is
complete. `check` recomputes hashes and says whether the files still match the record.
"""

from __future__ import annotations

import ast
import hashlib
import json
import platform
import socket
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from importlib import metadata
from pathlib import Path

import pyarrow.parquet as pq

import otbuild
from otbuild.duck import SQL_DIR
from otbuild.fsio import write_json
from otbuild.hashing import file_sha256
from otbuild.stages import PROVENANCE, STAGES

KEY_PACKAGES = ("duckdb", "pyarrow", "snakemake", "pydantic", "jinja2", "click", "torch", "transformers",
                "deepspeed", "vllm")
PACKAGE = Path(otbuild.__file__).parent  # the otbuild package whose code the records hash


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def code_files(stage: str) -> dict[str, str]:
    """sha256 (16 hex) of every file of the stage's code, by path under the package's parent:
    the otbuild modules it imports, directly or not (imports inside functions included; a
    module that imports by name, importlib, brings every module of its package), the
    packages' __init__ files, its SQL templates and the template folders its modules read."""
    d = STAGES[stage]
    files = set(_closure(_module_file(d.module)))
    files |= {SQL_DIR.relative_to(Path(otbuild.__file__).parent) / t for t in d.sql}
    for f in [f for f in files if f.suffix == ".py" and _reads_templates(f)]:
        folder = next(d for d in ((PACKAGE / f).parent / "templates", PACKAGE / "templates") if d.is_dir())
        files |= {p.relative_to(PACKAGE) for p in folder.rglob("*") if p.is_file()}
    return {f"otbuild/{f.as_posix()}": hashlib.sha256((PACKAGE / f).read_bytes()).hexdigest()[:16]
            for f in sorted(files)}


def code_sha256(stage: str, files: dict[str, str] | None = None) -> str:
    """One hash over the stage's code files."""
    files = code_files(stage) if files is None else files
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]


def _module_file(module: str) -> Path | None:
    """`otbuild.a.b` -> a/b.py or a/b/__init__.py (relative to PACKAGE); None if not a module."""
    parts = module.split(".")[1:]
    for f in (Path(*parts, "__init__.py"), Path(*parts).with_suffix(".py") if parts else None):
        if f is not None and (PACKAGE / f).is_file():
            return f
    return None


@cache
def _imports(f: Path) -> tuple[Path, ...]:
    """The otbuild modules (and their packages' __init__ files) that file `f` imports."""
    source = (PACKAGE / f).read_text()
    package = ["otbuild", *f.parent.parts]
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            mod = ".".join(p for p in (base, node.module or "") if p)
            names += [mod, *(f"{mod}.{a.name}" for a in node.names)]
    out = set()
    for name in names:
        parts = name.split(".")
        if parts[0] != "otbuild":
            continue
        out |= {m for i in range(1, len(parts) + 1) if (m := _module_file(".".join(parts[:i])))}
    if "import_module(" in source:  # imports by name: any module of its package may run
        out |= {p.relative_to(PACKAGE) for p in (PACKAGE / f).parent.glob("*.py")}
    return tuple(sorted(out - {f}))


@cache
def _reads_templates(f: Path) -> bool:
    """The module names a `templates` folder (its own, else the package's)."""
    return any(isinstance(n, ast.Constant) and n.value == "templates" for n in ast.walk(ast.parse((PACKAGE / f).read_text())))


def _closure(start: Path) -> list[Path]:
    seen, todo = set(), [start]
    while todo:
        f = todo.pop()
        if f not in seen:
            seen.add(f)
            todo += _imports(f)
    return sorted(seen)


def package_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for p in KEY_PACKAGES:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            pass
    return out


def artifact_files(outdir: Path, stage: str) -> list[Path]:
    """The stage's declared outputs, then every other file at the top of the artifact dir (a
    checkpoint's config and tokenizer files, ...): what the record covers. Hidden files, the
    record itself and subdirs (resume state, shards) are not part of the artifact."""
    declared = [outdir / o for o in STAGES[stage].outputs]
    others = sorted(p for p in outdir.iterdir() if p.is_file() and p not in declared
                    and p.name != PROVENANCE and not p.name.startswith("."))
    return declared + others


def describe_file(path: Path) -> dict:
    info = {"path": str(path), "sha256": file_sha256(path), "bytes": path.stat().st_size}
    if path.suffix == ".parquet":
        info["rows"] = pq.ParquetFile(path).metadata.num_rows
    return info


def write_record(spec: dict, rule: str, started: str, stats: dict) -> dict:
    outdir = Path(spec["outdir"])
    record = {
        "rule": rule,
        "stage": spec["stage"],
        "id": spec["id"],
        "stage_version": STAGES[spec["stage"]].version,
        "settings": spec["settings"],
        "inputs": [{**describe_file(Path(i["path"])), "id": i["id"], "stage": i["stage"]} for i in spec["inputs"]],
        "outputs": [describe_file(p) for p in artifact_files(outdir, spec["stage"])],
        "stats": stats,  # what the stage reports, e.g. rejections per reason
        "code_sha256": code_sha256(spec["stage"], code := code_files(spec["stage"])),
        "code": code,  # the stage's code files by path: `otbuild audit` names what changed
        "otbuild_version": otbuild.__version__,
        "packages": package_versions(),
        "host": socket.gethostname(),
        "command": sys.argv,
        "started_at": started,
        "finished_at": now(),
    }
    write_json(outdir / PROVENANCE, record)
    return record


def read_record(artifact_dir: Path) -> dict | None:
    try:
        return json.loads((Path(artifact_dir) / PROVENANCE).read_text())
    except (OSError, ValueError):
        return None


@dataclass
class Check:
    status: str  # ok | drifted | no-record | not-built | input-drift
    detail: str = ""
    code_drift: bool = False
    code_changed: tuple[str, ...] = ()  # the stage's code files that changed since the build

    @property
    def is_finding(self) -> bool:
        return self.status != "ok"


def _code_drift(record: dict, stage: str) -> tuple[bool, tuple[str, ...]]:
    now_files = code_files(stage)
    then = record.get("code", {})
    changed = tuple(sorted(f for f in then.keys() | now_files.keys() if then.get(f) != now_files.get(f)))
    return record.get("code_sha256") != code_sha256(stage, now_files), changed if then else ()


def check(artifact_dir: Path, stage: str, verify: bool = False) -> Check:
    """Compare the files with the record; `verify` rehashes every file (no digest cache)."""
    artifact_dir = Path(artifact_dir)
    outputs = [artifact_dir / o for o in STAGES[stage].outputs]
    record = read_record(artifact_dir)
    if record is None:
        present = [o.name for o in outputs if o.exists()]
        if not present:
            return Check("not-built")
        return Check("no-record", f"{', '.join(present)} present without {PROVENANCE}")
    problems = []
    for o in record["outputs"]:
        p = Path(o["path"])
        if not p.exists():
            problems.append(f"{p.name} missing")
        elif (digest := file_sha256(p, cached=not verify)) != o["sha256"]:
            problems.append(f"{p.name} sha256 {digest[:12]} != recorded {o['sha256'][:12]}")
    drift = _code_drift(record, stage)
    if problems:
        return Check("drifted", "; ".join(problems), *drift)
    for i in record["inputs"]:
        p = Path(i["path"])
        if p.exists() and file_sha256(p, cached=not verify) != i["sha256"]:
            return Check("input-drift", f"input {p} changed since this artifact was built", *drift)
    return Check("ok", "", *drift)
