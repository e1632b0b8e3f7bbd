"""Run one stage node from its spec (what a Snakemake rule calls) and record its provenance."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from otbuild.artifact import PROVENANCE
from otbuild.errors import ConfigError
from otbuild.provenance import now, write_record
from otbuild.stagekit import Inputs, Run, RunShard
from otbuild.stages import STAGES, StageDef, input_name

SPEC_KEYS = ("stage", "id", "settings", "inputs", "outdir")  # what Node.spec() writes


def read_spec(text: str, stage: str) -> dict:
    """A `--spec` argument: the JSON a plan writes for one of `stage`'s nodes (`otbuild plan`
    lists them; the Snakemake rules pass them). Anything else is a ConfigError saying what
    (settings that do not fit the stage's model: when the job validates them, `_job`)."""
    hint = "expected the JSON of one of the plan's nodes, as the workflow's rules pass it"
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--spec: not JSON ({e}); {hint}") from None
    if not isinstance(spec, dict):
        raise ConfigError(f"--spec: found a JSON {type(spec).__name__}; {hint}")
    if missing := [k for k in SPEC_KEYS if k not in spec]:
        raise ConfigError(f"--spec: required key(s) missing: {', '.join(missing)}; {hint}")
    if spec["stage"] != stage:
        raise ConfigError(
            f"--spec: the spec is of a {spec['stage']!r} node, not a {stage!r} one: "
            f"run `otbuild stage {spec['stage']} --spec ...`"
        )
    if not isinstance(spec["inputs"], list) or not all(isinstance(i, dict) and "path" in i for i in spec["inputs"]):
        raise ConfigError(f"--spec: inputs: expected a list of {{id, stage, path, name}}; {hint}")
    return spec


def _job(spec: dict) -> tuple[StageDef, Any, Inputs, Path]:
    """What a shard job and a merge or stage job start from: the stage, its typed settings
    (validated once, here: the schema's defaults filled in), its inputs by name and the outdir."""
    stage = STAGES[spec["stage"]]
    try:
        cfg = stage.config(spec["settings"])
    except ValidationError as e:
        where = "; ".join(f"settings.{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors()[:5])
        raise ConfigError(f"--spec: {where} (a spec from another otbuild version? plan it again)") from None
    inputs = Inputs(
        [i["path"] for i in spec["inputs"]], [i.get("name") or input_name(i.get("stage", "")) for i in spec["inputs"]]
    )
    return stage, cfg, inputs, Path(spec["outdir"])


def run_shard(spec: dict, shard: int) -> None:
    """One shard of a sharded stage; the merge (run_spec) records the provenance."""
    stage, cfg, inputs, outdir = _job(spec)
    run: RunShard[Any] = importlib.import_module(stage.module).run_shard
    run(cfg, inputs, outdir, shard)


def run_spec(spec: dict, rule: str | None = None) -> dict:
    stage, cfg, inputs, outdir = _job(spec)
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / PROVENANCE).unlink(missing_ok=True)  # the record is written last, on success only
    started = now()
    run: Run[Any] = importlib.import_module(stage.module).run
    stats = run(cfg, inputs, outdir)
    return write_record(spec, rule or stage.name, started, stats or {})
