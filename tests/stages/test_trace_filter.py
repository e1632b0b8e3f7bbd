"""Trace filter (DuckDB): the paper's min-turns rule and the drops, each with its reason."""

import duckdb

from otbuild.stages.trace_filter import TraceFilter
from otbuild.stages import trace_filter
from otbuild.traces.table import write_traces


def trace(name, turns, **kw):
    conv = [{"role": "user", "content": f"task {name}"}]
    for i in range(turns):
        conv += [{"role": "assistant", "content": f"step {i} of {name}"}, {"role": "user", "content": "ok"}]
    row = {
        "conversations": conv[:-1] if turns else conv,
        "trial_name": name,
        "n_turns": turns,
        "reward": 1.0,
        "timed_out": False,
        "exception": None,
        "is_subagent": False,
    }
    return row | kw


def _run(tmp_path, rows, **settings):
    src = tmp_path / "in.parquet"
    write_traces(src, rows)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    stats = trace_filter.run(TraceFilter(**settings), [src], out)
    kept = duckdb.sql(f"SELECT * FROM '{out / 'kept.parquet'}'").fetchdf()
    rejected = duckdb.sql(f"SELECT * FROM '{out / 'rejected.parquet'}'").fetchdf()
    assert len(kept) + len(rejected) == len(rows)
    return kept, dict(zip(rejected["trial_name"], rejected["reason"])), stats


def test_paper_defaults(tmp_path):
    rows = [
        trace("good", 6),
        trace("short", 4),
        trace("exact", 5),
        trace("infra", 7, exception="EngineError", result="EngineError"),
        trace("slow", 9, timed_out=True),
        trace("sub", 8, is_subagent=True),
        trace("good", 6) | {"trial_name": "again"},  # same conversation as "good"
    ]
    kept, reasons, stats = _run(tmp_path, rows)
    assert list(kept["trial_name"]) == ["good", "exact"]
    assert reasons == {
        "short": "min_turns: 4 < 5",
        "infra": "exception: EngineError",
        "slow": "timed_out",
        "sub": "subagent",
        "again": "duplicate: same conversation as good",
    }
    assert stats["rejected_by_reason"] == {
        "duplicate": 1,
        "exception": 1,
        "min_turns": 1,
        "subagent": 1,
        "timed_out": 1,
    }
    assert stats["kept"] == 2


def test_success_only_and_switches(tmp_path):
    rows = [
        trace("pass", 6),
        trace("fail", 6, reward=0.0),
        trace("none", 6, reward=None),
        trace("slow", 6, timed_out=True),
    ]
    kept, reasons, _ = _run(tmp_path, rows, min_reward=1.0, drop_timed_out=False, min_turns=3)
    assert list(kept["trial_name"]) == ["pass", "slow"]
    assert reasons == {"fail": "min_reward: 0.0 < 1.0", "none": "no_reward"}


def test_sample_caps_the_kept_traces_exactly(tmp_path):
    """A kept-traces target: exactly n of what the rules keep, a seeded choice, the rest rejected
    with their reason; keep_rate measures the rules alone (what a budget's oversampling wants)."""
    rows = [trace(f"t{i}", 6 if i % 4 else 2) for i in range(40)]  # 30 pass min_turns
    kept, reasons, stats = _run(tmp_path, rows, sample={"n": 25, "seed": 1})
    assert len(kept) == 25 and stats["keep_rate"] == 0.75
    assert sum(r.startswith("not_sampled: seeded subsample of 25") for r in reasons.values()) == 5
    again, _, _ = _run(tmp_path, rows, sample={"n": 25, "seed": 1})
    other, _, _ = _run(tmp_path, rows, sample={"n": 25, "seed": 2})
    assert list(again["trial_name"]) == list(kept["trial_name"]) != list(other["trial_name"])
    few, _, _ = _run(tmp_path, rows, sample={"n": 100})
    assert len(few) == 30  # fewer than the target: all of them
