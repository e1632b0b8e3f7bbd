"""Trace filter: min turns (paper: 5), timeouts, subagents, infrastructure exceptions,
optional success-only, dedup, then an exact cap (`sample`). Writes kept.parquet and
rejected.parquet (with reasons); `keep_rate` in its stats is the measured share it kept before
the cap, what task_filter.score.keep_rate wants."""

from __future__ import annotations

from pathlib import Path

from otbuild import duck
from otbuild.settings.stages import TraceFilterSettings
from otbuild.stagekit import Inputs, stage_run
from otbuild.traces import outcome


@stage_run
def run(cfg: TraceFilterSettings, inputs: Inputs, outdir: Path) -> dict:
    con = duck.connect()
    duck.run_template(
        con,
        "trace_filter.sql",
        inputs=[str(p) for p in inputs],
        offsets=duck.input_offsets(inputs),
        outcome=outcome.sql_context(),
        **cfg.model_dump(),
    )
    stats = duck.stream_split(con, "trace_decided", inputs, outdir, rejected_by="trace_filter")
    total = stats["kept"] + stats["rejected"]
    capped = stats["rejected_by_reason"].get("not_sampled", 0)
    return {**stats, "keep_rate": round((stats["kept"] + capped) / total, 4) if total else None}
