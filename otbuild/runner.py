"""Run one stage node from its spec (what a Snakemake rule calls) and record its provenance."""

from __future__ import annotations

import importlib
from pathlib import Path

from otbuild.provenance import now, write_record
from otbuild.stages import PROVENANCE, STAGES
from otbuild.stages.settings import config


def run_shard(spec: dict, shard: int) -> None:
    """One shard of a sharded stage; the merge (run_spec) records the provenance."""
    stage = STAGES[spec["stage"]]
    inputs = [Path(i["path"]) for i in spec["inputs"]]
    cfg = config(spec["stage"], spec["settings"])
    importlib.import_module(stage.module).run_shard(cfg, inputs, Path(spec["outdir"]), shard)


def run_spec(spec: dict, rule: str | None = None) -> dict:
    stage = STAGES[spec["stage"]]
    outdir = Path(spec["outdir"])
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / PROVENANCE).unlink(missing_ok=True)  # the record is written last, on success only
    started = now()
    inputs = [Path(i["path"]) for i in spec["inputs"]]
    cfg = config(spec["stage"], spec["settings"])  # the stage's typed settings, the schema's defaults
    stats = importlib.import_module(stage.module).run(cfg, inputs, outdir)
    return write_record(spec, rule or stage.name, started, stats or {})
