"""Provenance sidecars: what made an artifact, from what, with which settings, code and packages.

Every artifact dir gets `provenance.json`, written last (atomically), so a dir with a record is
complete. `check` recomputes hashes and says whether the files still match the record.
"""

from __future__ import annotations

import json
import platform
import socket
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import pyarrow.parquet as pq

import otbuild
from otbuild.artifact import PROVENANCE, top_files
from otbuild.codehash import code_files, code_sha256
from otbuild.fsio import write_json
from otbuild.hashing import file_sha256
from otbuild.stages import STAGES

KEY_PACKAGES = (
    "duckdb",
    "pyarrow",
    "snakemake",
    "pydantic",
    "jinja2",
    "click",
    "torch",
    "transformers",
    "deepspeed",
    "vllm",
)  # those installed are recorded


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


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
    return declared + [p for p in top_files(outdir) if p not in declared]


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
        "inputs": [
            {
                **describe_file(Path(i["path"])),
                "id": i["id"],
                "stage": i["stage"],
                **({"name": i["name"]} if i.get("name") else {}),
            }
            for i in spec["inputs"]
        ],
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
