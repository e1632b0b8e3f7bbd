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


def tool_trace(name, ids, answers=None):
    """A native tool-calling conversation: two calls in one turn, each answered; `answers`: the
    ids the tool messages name, in order (default: the calls', in call order)."""
    a, b = ids
    first, second = answers or ids
    conv = [{"role": "user", "content": "list the files"}]
    for i in range(5):
        calls = [
            {"id": f"{a}{i}", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls\\n"}'}},
            {"id": f"{b}{i}", "type": "function", "function": {"name": "bash", "arguments": '{"command": "pwd\\n"}'}},
        ]
        conv += [
            {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "content": "a.txt", "tool_call_id": f"{first}{i}"},
            {"role": "tool", "content": "/app", "tool_call_id": f"{second}{i}"},
        ]
    return trace(name, 5) | {"conversations": conv}


def test_dedup_sees_through_tool_call_ids(tmp_path):
    """A server draws its tool-call ids at random (vLLM's `chatcmpl-tool-...`): two conversations
    that differ in those ids alone are one; which call each tool message answers still counts."""
    rows = [
        tool_trace("first", ("call_a", "call_b")),
        tool_trace("renamed", ("chatcmpl-tool-x", "chatcmpl-tool-y")),
        tool_trace("crossed", ("call_c", "call_d"), answers=("call_d", "call_c")),
        trace("plain", 6),
        trace("plain", 6) | {"trial_name": "plain again"},
    ]
    kept, reasons, _ = _run(tmp_path, rows)
    assert list(kept["trial_name"]) == ["first", "crossed", "plain"]
    assert reasons == {
        "renamed": "duplicate: same conversation as first",
        "plain again": "duplicate: same conversation as plain",
    }


def test_dedup_reads_traces_written_before_tool_calls(tmp_path):
    """Traces from before the schema had tool calls ({role, content} messages) dedup as before."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    write_traces(tmp_path / "new.parquet", [trace("a", 1), trace("a", 1) | {"trial_name": "b"}])
    table = pq.read_table(tmp_path / "new.parquet")
    old_message = pa.struct([("role", pa.string()), ("content", pa.string())])
    convs = [[{"role": m["role"], "content": m["content"]} for m in c] for c in table["conversations"].to_pylist()]
    table = table.set_column(0, "conversations", pa.array(convs, pa.list_(old_message)))
    pq.write_table(table, tmp_path / "old.parquet")
    out = tmp_path / "out"
    out.mkdir()
    stats = trace_filter.run(TraceFilter(min_turns=1), [tmp_path / "old.parquet"], out)
    assert stats["kept"] == 1 and stats["rejected_by_reason"] == {"duplicate": 1}
