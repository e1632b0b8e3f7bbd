"""Trace filter: min turns (paper: 5), timeouts, subagents, infrastructure exceptions,
optional success-only, dedup, then an exact cap (`sample`). Writes kept.parquet and
rejected.parquet (with reasons); `keep_rate` in its stats is the measured share it kept before
the cap, what task_filter.score.keep_rate wants."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
from pydantic import Field

from otbuild import duck
from otbuild.settings.base import Strict
from otbuild.settings.recipe import Sample
from otbuild.span import ZERO, Span
from otbuild.stagekit import DefaultRate, Inputs, StageDef, stage_run
from otbuild.traces import outcome
from otbuild.traces.table import VOLATILE_COLUMNS


class TraceFilter(Strict):
    """Keep traces worth training on. Paper: keep >= 5 turns (+3.5pp at equal tokens)."""

    min_turns: int = Field(default=5, ge=0)
    drop_timed_out: bool = True
    drop_subagent: bool = True
    drop_exceptions: bool = True  # outcomes not_run, infrastructure, verifier_error (docs/failures.md)
    min_reward: float | None = None  # success-only: keep traces whose reward >= this
    dedup: bool = True  # identical conversations
    sample: Sample | None = Field(
        default=None,
        description="keep exactly n of what is left (a seeded choice): "
        "the kept-traces target of a budget planned with task_filter.score.keep_rate",
    )


@stage_run
def run(cfg: TraceFilter, inputs: Inputs, outdir: Path) -> dict:
    con = duck.connect()
    duck.run_template(
        con,
        "trace_filter.sql",
        inputs=[str(p) for p in inputs],
        offsets=duck.input_offsets(inputs),
        outcome=outcome.sql_context(),
        tool_calls=all(has_tool_calls(p) for p in inputs),
        **cfg.model_dump(),
    )
    stats = duck.stream_split(con, "trace_decided", inputs, outdir, rejected_by="trace_filter")
    total = stats["kept"] + stats["rejected"]
    capped = stats["rejected_by_reason"].get("not_sampled", 0)
    return {**stats, "keep_rate": round((stats["kept"] + capped) / total, 4) if total else None}


def has_tool_calls(path: Path) -> bool:
    """Whether the file's messages have `tool_calls` (traces written before issue 48 have not)."""
    conversations = pq.read_schema(path).field("conversations").type
    return "tool_calls" in [f.name for f in conversations.value_type]


def estimate(m, n, e) -> None:
    """Traces in (one per task where an oracle's samples are one conversation and dedup is on)
    x the keep rate (a pilot's, else the one the recipe plans its rollouts with, else the
    default), at most `sample.n`."""
    traces = m.rows_in(n)
    keep = m.plan.recipe.recipe.task_filter
    planned = keep.score.keep_rate if keep and keep.score and keep.score.budget else None
    fallback = (
        None
        if planned is None
        else m.assumed_rate(
            "keep_rate",
            Span(planned, planned * 0.6, planned),
            "kept / in",
            "the keep rate the recipe plans its rollouts with (task_filter.score.keep_rate); x0.6 at the low end",
        )
    )
    if n.config.dedup and any(i.id in m.distinct for i in n.inputs):
        distinct = sum((m.distinct.get(i.id, m.rows.get(i.id, ZERO)) for i in n.inputs), ZERO)
        e.notes.append("dedup: the oracle's samples of a task are one conversation, so one of them is kept")
    else:
        distinct = traces
    kept = (distinct * m.rate(e, n, "keep_rate", fallback=fallback)).ceil()
    kept = kept.cap(n.config.sample.n if n.config.sample else None)
    m.table(n, e)
    m.rows[n.id] = kept
    e.counts["traces_in"] = traces
    if distinct is not traces:
        e.counts["distinct_traces"] = distinct
    e.counts["traces_kept"] = kept


STAGE = StageDef(
    "trace_filter",
    2,
    ("kept.parquet", "rejected.parquet"),
    __name__,
    TraceFilter,
    recipe_field=(TraceFilter | None, None),
    consumes=("traces",),
    produces="traces",
    traces=True,
    filter=True,
    # the sample cap counts as kept; the duplicates of an oracle's samples follow from the teacher
    keep_rate_reasons={"not_sampled": "kept", "duplicate": "apart"},
    volatile={"*.parquet": tuple(VOLATILE_COLUMNS)},
    counts={"traces_kept": "rows"},
    estimate=estimate,
    rates={"keep_rate": DefaultRate(Span(0.7, 0.4, 1.0), "kept / in", "min_turns drops short traces")},
)
