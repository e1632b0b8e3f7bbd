"""Harbor's RolloutDetail in and out: a job dir whose result.json files Harbor's own models
wrote (tests/support/harbor_rollout_details.py, in .venv-harbor) is read into calls rows, and
calls.parquet exported back validates as Harbor's AgentContext with the same token ids. The
calls table loads with Hugging Face `datasets` as it is."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from otbuild.harbor import ingest
from otbuild.harbor.rollout_detail import write_rollout_details
from otbuild.stagekit.calls import CALL_SCHEMA, write_calls
from tests.conftest import REPO, otbuild, snakemake, tool_answer

HARBOR_PYTHON = REPO / ".venv-harbor" / "bin" / "python"
needs_harbor = pytest.mark.skipif(
    not HARBOR_PYTHON.is_file(), reason="Harbor is not in .venv-harbor: run scripts/harbor-env.sh (make harbor-env)"
)

MAIN = {  # terminus-2's linear chat: each prompt extends the last prompt and answer
    "prompt_token_ids": [[1, 2, 3], [1, 2, 3, 7, 8, 4, 5]],
    "completion_token_ids": [[7, 8], [9, 10, 11]],
    "logprobs": [[-0.5, -0.25], [-1.0, -0.125, -2.0]],
}
SUMMARY = {"prompt_token_ids": [[20, 21]], "completion_token_ids": [[22]], "logprobs": [[-0.75]]}
TRIALS = [
    {"name": "b-task__x1", "task": "b-task", "details": [MAIN, SUMMARY]},  # a subagent's segment after the main one
    {"name": "a-task__x2", "task": "a-task", "details": [SUMMARY]},
    {"name": "c-task__x3", "task": "c-task", "details": None},  # an agent that reports none (the oracle)
    {"name": "d-task__x4", "task": "d-task", "details": None, "steps": {"one": [SUMMARY], "two": [MAIN]}},
]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rd")
    tool_answer(HARBOR_PYTHON, "harbor_rollout_details.py", {"job": str(tmp / "job"), "trials": TRIALS}, tmp / "w.json")
    return tmp / "job"


@needs_harbor
def test_a_jobs_rollout_details_are_call_rows_per_trial(job):
    rows = list(ingest.read_job_calls(job))
    by_trial: dict = {}
    for r in rows:
        assert set(r) == set(CALL_SCHEMA.names)
        by_trial.setdefault(r["trial_name"], []).append(r)
    assert list(by_trial) == ["a-task__x2", "b-task__x1", "d-task__x4"]  # c reports none
    b = by_trial["b-task__x1"]
    assert [(r["scope"], r["call_idx"]) for r in b] == [
        ("rollout_details/0", 0),
        ("rollout_details/0", 1),
        ("rollout_details/1", 2),
    ]
    assert [r["prompt_token_ids"] for r in b] == [*MAIN["prompt_token_ids"], *SUMMARY["prompt_token_ids"]]
    assert [r["completion_token_ids"] for r in b] == [*MAIN["completion_token_ids"], [22]]
    assert [r["logprobs"] for r in b] == [*MAIN["logprobs"], [-0.75]]
    assert [(r["prompt_tokens"], r["completion_tokens"], r["model"]) for r in b] == [
        (3, 2, "policy"),
        (7, 3, "policy"),
        (2, 1, "policy"),
    ]
    assert [r["scope"] for r in by_trial["d-task__x4"]] == [
        "steps/one/rollout_details/0",
        "steps/two/rollout_details/0",
        "steps/two/rollout_details/0",
    ]


@needs_harbor
def test_calls_export_as_harbors_rollout_details(job, tmp_path):
    """Import then export gives each trial's rollout details back, as Harbor's AgentContext
    reads them; calls of no trial (a Harbor job's proxy capture) and failed calls are left out,
    counted; the CLI refuses to write over a file and names a table that is not a calls table."""
    rows = list(ingest.read_job_calls(job))
    proxy = {**rows[0], "trial_name": None, "scope": "attempts-1"}
    failed = {**rows[0], "call_idx": 9, "status": 500, "completion_token_ids": None}
    calls = tmp_path / "calls.parquet"
    write_calls(calls, [*rows, proxy, failed])
    res = otbuild(tmp_path, "export", "rollout-details", str(calls), "rd.jsonl")
    assert res.returncode == 0, res.stderr
    assert "3 trial(s), 7 call(s) in 5 segment(s)" in res.stdout
    assert "1 call(s) of no trial, 1 call(s) without token ids" in res.stdout
    got = tool_answer(
        HARBOR_PYTHON, "harbor_rollout_details.py", {"export": str(tmp_path / "rd.jsonl")}, tmp_path / "a.json"
    )
    exported = {e["trial_name"]: e for e in got["exported"]}
    assert list(exported) == ["a-task__x2", "b-task__x1", "d-task__x4"]
    assert exported["b-task__x1"]["rollout_details"] == [MAIN, SUMMARY]
    assert exported["a-task__x2"]["rollout_details"] == [SUMMARY]
    assert exported["d-task__x4"]["rollout_details"] == [SUMMARY, MAIN]  # its steps' segments in order
    assert (exported["b-task__x1"]["n_input_tokens"], exported["b-task__x1"]["n_output_tokens"]) == (12, 6)
    again = otbuild(tmp_path, "export", "rollout-details", str(calls), "rd.jsonl")
    assert again.returncode == 2 and "exists" in again.stderr
    pq.write_table(pq.read_table(calls).drop_columns(["scope"]), tmp_path / "other.parquet")
    wrong = otbuild(tmp_path, "export", "rollout-details", str(tmp_path / "other.parquet"), "o.jsonl")
    assert wrong.returncode == 2 and "not a calls table" in wrong.stderr


def test_the_export_streams_a_trial_at_a_time(tmp_path):
    """More trials than one fetched batch, sorted in ranges of about 1,000 token ids (72 of
    them), segments kept apart by scope, otbuild's own attempts (each scope numbering its calls
    from 0) in scope order."""
    rows = []
    for t in range(4500):
        for scope in ("0-1", "0-0"):
            for i in range(2):
                rows.append(
                    {
                        **dict.fromkeys(CALL_SCHEMA.names),
                        "trial": t,
                        "trial_name": f"t{t:05d}",
                        "scope": scope,
                        "call_idx": i,
                        "status": 200,
                        "prompt_token_ids": [t, i],
                        "completion_token_ids": [i],
                        "logprobs": [-1.0],
                    }
                )
    calls = tmp_path / "calls.parquet"
    write_calls(calls, rows)
    counts = write_rollout_details(calls, tmp_path / "rd.jsonl", range_ids=1000)
    assert counts == {"trials": 4500, "calls": 18000, "segments": 9000, "no_trial": 0, "without_token_ids": 0}
    lines = [json.loads(x) for x in (tmp_path / "rd.jsonl").read_text().splitlines()]
    assert [x["trial_name"] for x in lines] == [f"t{t:05d}" for t in range(4500)]
    assert (
        lines[7]["agent_result"]["rollout_details"]
        == [{"prompt_token_ids": [[7, 0], [7, 1]], "completion_token_ids": [[0], [1]], "logprobs": [[-1.0], [-1.0]]}]
        * 2
    )


def test_hf_datasets_loads_calls_parquet(tmp_path):
    """`datasets` reads calls.parquet as written: its columns, types and values (token ids as
    int32 sequences, log-probs as float32, the null trial of a Harbor job's call)."""
    datasets = pytest.importorskip("datasets")
    rows = [
        {
            **dict.fromkeys(CALL_SCHEMA.names),
            "trial": 0,
            "trial_name": "t0",
            "scope": "0-0",
            "call_idx": 0,
            "status": 200,
            "delivered": True,
            "request": json.dumps({"messages": [{"role": "user", "content": "hi"}], "tools": []}),
            "tool_calls": json.dumps([{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": ""}}]),
            "prompt_token_ids": [1, 2, 3],
            "completion_token_ids": [4, 5],
            "logprobs": [-0.5, -0.25],
            "harness_agrees": True,
        },
        {**dict.fromkeys(CALL_SCHEMA.names), "scope": "attempts-1", "call_idx": 0, "status": 502},
    ]
    write_calls(tmp_path / "calls.parquet", rows)
    ds = datasets.load_dataset(
        "parquet", data_files=str(tmp_path / "calls.parquet"), split="train", cache_dir=str(tmp_path / "cache")
    )
    assert ds.column_names == CALL_SCHEMA.names and len(ds) == 2
    assert ds.features["prompt_token_ids"].feature.dtype == "int32"
    assert ds.features["logprobs"].feature.dtype == "float32"
    assert ds[0]["completion_token_ids"] == [4, 5] and ds[0]["logprobs"] == [-0.5, -0.25]
    assert json.loads(ds[0]["tool_calls"])[0]["function"]["name"] == "bash"
    assert ds[1]["trial"] is None and ds[1]["prompt_token_ids"] is None


@needs_harbor
@pytest.mark.slow
def test_a_harbor_teachers_calls_come_from_its_rollout_details_in_a_real_build(project, scripted):
    """`sandbox: harbor` without the capture proxy, in a real build: terminus-2 asks for token ids
    (`collect_rollout_details`) and the teacher's calls.parquet holds each trial's calls as
    Harbor reported them: per assistant turn of the trace, the prompt's ids the server gave for
    the conversation before it and the answer's ids and log-probs (the stand-in model's ids
    say what they were for); the export of it is Harbor's AgentContext again."""
    from tests.harbor.test_harbor import terminus2_endpoint
    from tests.support.standin import token_ids

    srv = scripted(terminus2_endpoint())  # vLLM's token ids and log-probs where asked (standin.as_vllm)
    (project / "recipes" / "rd.yaml").write_text(
        "sources:\n  synth: {kind: synthetic, count: 2, seed: 4}\n"
        f"teacher: {{engine: openai, base_url: '{srv.base_url}', model: m, max_episodes: 6, capture: false,\n"
        "  sandbox: harbor, harbor: {environment: otbuild, agent_kwargs: {collect_rollout_details: true}}}\n"
    )
    ran, _ = snakemake(project, "rd")
    assert ran["rollout"] == 1
    out = project / "results" / "rd" / "teacher"
    traces = {t["trial_name"]: t for t in pq.read_table(out / "traces.parquet").to_pylist()}
    calls = pq.read_table(out / "calls.parquet").to_pylist()
    assert len(traces) == 2 and {c["trial_name"] for c in calls} == set(traces)
    assert {c["trial"] for c in calls} == {0, 1}  # each call keyed by its trial's number
    for name, trace in traces.items():
        mine = [c for c in calls if c["trial_name"] == name]
        conversation = trace["conversations"]
        answers = [i for i, m in enumerate(conversation) if m["role"] == "assistant"]
        assert [c["call_idx"] for c in mine] == list(range(len(answers))) == list(range(4)), trace["result"]
        for call, i in zip(mine, answers, strict=True):
            assert call["prompt_token_ids"] == token_ids(" ".join(m["content"] for m in conversation[:i]))
            assert call["completion_token_ids"] == (ids := token_ids(conversation[i]["content"]))
            assert call["logprobs"] == pytest.approx([-t / 1000 for t in ids]) and call["scope"] == "rollout_details/0"
    res = otbuild(project, "export", "rollout-details", str(out / "calls.parquet"), "rd.jsonl")
    assert res.returncode == 0, res.stderr
    got = tool_answer(
        HARBOR_PYTHON, "harbor_rollout_details.py", {"export": str(project / "rd.jsonl")}, project / "a.json"
    )
    assert [e["trial_name"] for e in got["exported"]] == sorted(traces)
    assert all(len(e["rollout_details"][0]["completion_token_ids"]) == 4 for e in got["exported"])
