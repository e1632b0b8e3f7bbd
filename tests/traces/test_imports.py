"""Trace importers (mini-swe-agent, SWE-agent, messages JSONL) on the dev trajectories."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from otbuild.records import SourceFormatError
from otbuild.tasks.table import Quarantined
from otbuild.settings.recipe import MessagesOptions, MiniSweAgentOptions
from otbuild.traces.imports import IMPORTERS, format_options, importer, read_traces
from otbuild.traces.table import TRACE_SCHEMA, count_turns, write_traces
from tests.conftest import trace_import

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "dev"
if not DATA.is_dir():
    pytest.skip(f"dev data not found at {DATA} (shared/data/dev)", allow_module_level=True)

TRAJ = DATA / "trajectories"
MINI = TRAJ / "mini_swe_agent_swebench_verified"
SWEA = TRAJ / "swe_agent_demonstrations"
SFT = TRAJ / "swesmith_sft_xml" / "ft_xml_example.jsonl"
INSTANCES = DATA / "swebench_verified" / "instances.jsonl"


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def rows_of(kind, path, **options) -> list[dict]:
    items = list(read_traces(trace_import(kind, path, **options)))
    assert not [i for i in items if isinstance(i, Quarantined)]
    return items


def check_common(rows: list[dict], kind: str, tmp_path: Path) -> None:
    for r in rows:
        assert set(r) == set(TRACE_SCHEMA.names)
        assert r["source"] == f"import:{kind}" and r["episode"] == "episode-0"
        assert r["n_turns"] == count_turns(r["conversations"]) > 0
        for m in r["conversations"]:
            assert set(m) == {"role", "content"} and isinstance(m["content"], str)
            if m["role"] in ("user", "assistant"):
                assert m["content"].strip(), (r["trial_name"], m)
        assert next(m for m in r["conversations"] if m["role"] == "user")["content"].strip()
        json.loads(r["metadata"])
    write_traces(tmp_path / "t.parquet", rows)
    assert pq.read_table(tmp_path / "t.parquet").num_rows == len(rows)


def test_registry():
    assert set(IMPORTERS) == {"mini-swe-agent", "swe-agent", "messages-jsonl", "harbor-traces"}
    with pytest.raises(ValueError, match="unknown trace import kind"):
        importer("nope")


def test_mini_swe_agent(tmp_path):
    rows = rows_of("mini-swe-agent", MINI)
    labels = {r["instance_id"]: r for r in jsonl(MINI / "labels.jsonl")}
    problems = {r["instance_id"]: r["problem_statement"] for r in jsonl(INSTANCES)}
    assert sorted(r["task"] for r in rows) == sorted(labels) and len(rows) == 5
    check_common(rows, "mini-swe-agent", tmp_path)
    for r in rows:
        src = json.loads((MINI / f"{r['task']}.traj.json").read_text())
        assert [m["content"] for m in r["conversations"]] == [m["content"] for m in src["messages"]]
        assert (
            r["n_turns"]
            == sum(m["role"] == "assistant" for m in src["messages"])
            == src["info"]["model_stats"]["api_calls"]
        )
        first_user = next(m["content"] for m in r["conversations"] if m["role"] == "user")
        assert problems[r["task"]].strip() in first_user
        assert r["reward"] == (1.0 if labels[r["task"]]["resolved"] else 0.0) and r["result"] == str(r["reward"])
        assert r["agent"] == "mini-swe-agent" and r["model"] == "google/gemini-3-pro-preview"
        assert r["model_provider"] == "openrouter" and r["date"].startswith("2025-11-")
        assert r["n_input_tokens"] > r["n_output_tokens"] > 0 and r["exception"] is None and not r["timed_out"]
        meta = json.loads(r["metadata"])
        assert meta["exit_status"] == "Submitted" and meta["submission"] == src["info"]["submission"]
    assert {r["task"]: r["n_turns"] for r in rows}["django__django-10999"] == 18


def test_mini_swe_agent_options_and_quarantine(tmp_path):
    src = json.loads((MINI / "astropy__astropy-7166.traj.json").read_text())
    src["messages"][1]["content"] = "   "  # an empty task message: filled from the instances
    src["info"]["exit_status"] = "TimeoutError"
    (tmp_path / "astropy__astropy-7166.traj.json").write_text(json.dumps(src))
    (tmp_path / "broken.traj.json").write_text('{"messages": [')
    with pytest.raises(SourceFormatError, match=r"broken\.traj\.json: line 1 column 15"):
        list(read_traces(trace_import("mini-swe-agent", tmp_path)))
    (tmp_path / "broken.traj.json").unlink()
    items = list(read_traces(trace_import("mini-swe-agent", tmp_path)))
    assert [(q.name, q.reason) for q in items] == [("astropy__astropy-7166", "empty first user message")]
    (row,) = read_traces(
        trace_import("mini-swe-agent", tmp_path, instances=INSTANCES, run_id="r1", labels=MINI / "labels.jsonl")
    )
    assert row["conversations"][1]["content"].startswith("InheritDocstrings metaclass doesn't work")
    assert row["timed_out"] and row["exception"] == "TimeoutError" and row["result"] == "TimeoutError"
    assert row["reward"] == 1.0 and row["run_id"] == "r1"


def test_swe_agent(tmp_path):
    rows = rows_of("swe-agent", SWEA)
    assert len(rows) == 4
    check_common(rows, "swe-agent", tmp_path)
    turns = {}
    for r in rows:
        src = json.loads((SWEA / f"{r['task']}.traj").read_text())
        assert [m["content"] for m in r["conversations"]] == [m["content"] for m in src["history"]]
        turns[r["task"]] = r["n_turns"]
        assert not r["is_subagent"] and r["reward"] is None and r["n_input_tokens"] is None
    assert turns["ctf__misc__networking_1"] == 4  # below the paper's min_turns
    assert turns["ctf__pwn__warmup"] == 7
    first = next(m for m in rows[0]["conversations"] if m["role"] == "user")["content"]
    assert "Networking 1" in first
    fc = next(r for r in rows if r["task"] == "function_calling_simple")
    assert [m["role"] for m in fc["conversations"]][:4] == ["system", "user", "assistant", "tool"]


def test_swe_agent_subagents_and_content_parts(tmp_path):
    hist = [
        {"role": "system", "content": "sys", "agent": "main"},
        {"role": "user", "content": [{"type": "text", "text": "Fix the bug in foo.py"}], "agent": "main"},
        {"role": "assistant", "content": "", "agent": "main",
         "tool_calls": [{"function": {"name": "bash", "arguments": "{\"command\": \"ls\"}"}}]},
        {"role": "tool", "content": "foo.py", "agent": "main"},
        {"role": "user", "content": "Review this patch", "agent": "reviewer"},
        {"role": "assistant", "content": "Looks fine", "agent": "reviewer"},
    ]  # fmt: skip
    (tmp_path / "x.traj").write_text(json.dumps({"history": hist, "info": {"exit_status": "exit_environment_error"}}))
    main, sub = read_traces(trace_import("swe-agent", tmp_path))
    assert main["conversations"][1]["content"] == "Fix the bug in foo.py"
    assert (
        main["conversations"][2]["content"]
        == '<tool_call>{"name": "bash", "arguments": "{\\"command\\": \\"ls\\"}"}</tool_call>'
    )
    assert not main["is_subagent"] and sub["is_subagent"] and sub["n_turns"] == 1
    assert main["exception"] == "exit_environment_error" and main["result"] == "exit_environment_error"


def test_messages_jsonl(tmp_path):
    src = jsonl(SFT)
    rows = rows_of("messages-jsonl", SFT, agent="swe-agent")
    assert len(rows) == 2
    check_common(rows, "messages-jsonl", tmp_path)
    for r, s in zip(rows, src):
        assert r["task"] == r["task_id"] == s["instance_id"] and r["agent"] == "swe-agent"
        assert [m["content"] for m in r["conversations"]] == [m["content"] for m in s["messages"]]
        assert r["n_turns"] == sum(m["role"] == "assistant" for m in s["messages"])
        assert "<pr_description>" in r["conversations"][1]["content"]
    assert [r["n_turns"] for r in rows] == [37, 44]


def test_messages_jsonl_quarantine_and_errors(tmp_path):
    f = tmp_path / "m.jsonl"
    lines = [
        {"messages": [{"role": "user", "content": "List files"}, {"role": "assistant", "content": "ls"}],
         "id": "a", "reward": 1, "model": "org/m", "extra": 5},
        {"id": "b"},
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": ""},
                      {"role": "assistant", "content": "x"}], "id": "c"},
        {"messages": [{"role": "user", "content": " "}, {"role": "assistant", "content": "x"}],
         "id": "d", "problem_statement": "Count the lines of a.txt"},
        {"messages": [{"content": "no role"}], "id": "e"},
        [1],
        {"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": "x"}],
         "instance_id": " ", "id": "f", "problem_statement": " ", "prompt": "Say hi"},  # blank: the next key
    ]  # fmt: skip
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    items = list(read_traces(trace_import("messages-jsonl", f)))
    bad = [(i.name, i.reason) for i in items if isinstance(i, Quarantined)]
    good = [i for i in items if not isinstance(i, Quarantined)]
    assert bad == [("b", "missing field"), ("c", "empty first user message"), ("e", "bad messages"),
                   ("m.jsonl:6", "not an object")]  # fmt: skip
    a, d, f_ = good
    assert f_["task"] == "f" and f_["conversations"][0]["content"] == "Say hi"
    assert a["reward"] == 1.0 and a["model_provider"] == "org" and json.loads(a["metadata"])["extra"] == 5
    assert d["conversations"][0]["content"] == "Count the lines of a.txt"
    f.write_text(json.dumps(lines[0]) + "\n{not json\n")
    with pytest.raises(SourceFormatError, match=r"m\.jsonl: line 2 "):
        list(read_traces(trace_import("messages-jsonl", f)))


def test_an_import_with_no_usable_trace_fails_its_stage(tmp_path):
    from otbuild.errors import StageError
    from otbuild.stages import trace_import
    from otbuild.stages import STAGES

    f = tmp_path / "m.jsonl"
    f.write_text('{"id": "b"}\n[1]\n')
    settings = {"name": "t", "kind": "messages-jsonl", "path": str(f)}
    with pytest.raises(
        StageError,
        match=r"trace_imports\.t: no usable item in .*m\.jsonl: 2 quarantined "
        r"\(1 missing field, e\.g\. b.*; 1 not an object, e\.g\. m\.jsonl:2",
    ):
        trace_import.run(STAGES["trace_import"].config(settings), [], tmp_path / "out")
    assert (
        trace_import.run(STAGES["trace_import"].config({**settings, "allow_empty": True}), [], tmp_path / "out")[
            "traces"
        ]
        == 0
    )


def test_an_hf_dataset_import_reads_its_files_as_its_format_with_that_formats_defaults():
    """What an hf-dataset section leaves unset is its format's default (the format's section
    holds it); what it sets is passed on."""
    hf = trace_import("hf-dataset", repo="org/trajs", format="mini-swe-agent")
    assert format_options(hf) == MiniSweAgentOptions() and format_options(hf).agent == "mini-swe-agent"
    assert list(read_traces(hf, [MINI])) == list(read_traces(trace_import("mini-swe-agent", MINI)))
    named = trace_import("hf-dataset", repo="org/trajs", format="messages-jsonl", agent="swe-agent", run_id="r")
    assert format_options(named) == MessagesOptions(agent="swe-agent", run_id="r")
    assert format_options(trace_import("hf-dataset", repo="org/t", format="harbor-traces")).episodes == "last"
