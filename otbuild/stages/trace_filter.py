"""Trace filter: min turns (paper: 5), timeouts, subagents, infrastructure exceptions,
optional success-only, dedup. Writes kept.parquet and rejected.parquet (with reasons)."""

from __future__ import annotations

from pathlib import Path

from otbuild import duck


def run(settings: dict, inputs: list[Path], outdir: Path) -> dict:
    con = duck.connect()
    duck.run_template(con, "trace_filter.sql", inputs=[str(p) for p in inputs],
                      offsets=duck.input_offsets(inputs), **settings)
    return duck.stream_split(con, "trf_decided", inputs, outdir, rejected_by="trace_filter")
