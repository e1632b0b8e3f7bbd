"""A shard's model calls through the capture proxy: calls.parquet beside the traces, each
answer as otbuild's harness logged it, nothing lost or doubled when a stopped shard reruns;
and through a real snakemake build."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pyarrow.parquet as pq
import pytest

from otbuild.artifact import PROVENANCE
from otbuild.engines.endpoint import EndpointError
from otbuild.sandbox import backend_problem
from otbuild.settings.stages import RolloutSettings
from otbuild.sources.synthetic import generate
from otbuild.stagekit.calls import CALL_SCHEMA, merge_call_files, trial_calls, write_calls
from otbuild.stages import rollout
from otbuild.tasks.table import write_tasks
from tests.conftest import chat_answer, invalid_api_key, snakemake
from tests.harness.test_harness import THREE_TURNS, strict_endpoint

needs_sandbox = pytest.mark.skipif(backend_problem("bwrap") is not None, reason="bubblewrap unusable here")


def tasks_of(tmp_path, n: int):
    path = tmp_path / "tasks.parquet"
    write_tasks(path, generate(n, 3), source="synth")
    return path


def calls_of(path) -> list[dict]:
    return pq.read_table(path).to_pylist()


@needs_sandbox
@pytest.mark.parametrize("keep_reasoning", [True, False])
def test_every_call_of_a_shard_is_in_calls_parquet_as_the_harness_logged_it(tmp_path, scripted, keep_reasoning):
    srv = scripted(strict_endpoint(THREE_TURNS, reasoning="first, the plan"))
    cfg = RolloutSettings(
        engine="openai", base_url=srv.base_url, model="m", concurrency=2, shards=2, keep_reasoning=keep_reasoning
    )
    tasks, out = tasks_of(tmp_path, 3), tmp_path / "out"
    for shard in (0, 1):
        rollout.run_shard(cfg, [tasks], out, shard)
    stats = rollout.run(cfg, [tasks], out)
    assert stats["capture"] == {"calls": 9, "errors": 0, "harness_disagrees": 0, "with_token_ids": 0}
    calls = calls_of(out / "calls.parquet")
    traces = pq.read_table(out / "traces.parquet").to_pylist()
    assert "_calls" not in pq.read_schema(out / "traces.parquet").names
    assert [(c["trial"], c["call_idx"]) for c in calls] == [(t, k) for t in range(3) for k in range(3)]
    assert all(c["harness_agrees"] for c in calls)
    for trial, trace in enumerate(traces):
        mine = [c for c in calls if c["trial"] == trial]
        assert {c["trial_name"] for c in mine} == {trace["trial_name"]}
        turns = [m["content"] for m in trace["conversations"] if m["role"] == "assistant"]
        assert [c["content"] for c in mine] == THREE_TURNS
        assert turns == [f"<think>first, the plan</think>\n{a}" if keep_reasoning else a for a in THREE_TURNS]
        sent = [json.loads(c["request"])["messages"] for c in mine]  # the request as the server got it
        assert sent == [r["body"]["messages"] for r in srv.requests if r["body"]["messages"][0] == sent[0][0]]
        assert all(c["reasoning"] == "first, the plan" for c in mine)


@needs_sandbox
def test_without_capture_no_calls_are_kept(tmp_path, scripted):
    srv = scripted(strict_endpoint(THREE_TURNS))
    cfg = RolloutSettings(engine="openai", base_url=srv.base_url, model="m", capture=False)
    tasks, out = tasks_of(tmp_path, 1), tmp_path / "out"
    rollout.run_shard(cfg, [tasks], out, 0)
    assert "capture" not in rollout.run(cfg, [tasks], out)
    assert not list(out.rglob("*calls*")) and len(srv.requests) == 3


@needs_sandbox
def test_a_stopped_shard_reruns_keeping_each_finished_trials_calls_once(tmp_path, scripted):
    """The key is revoked after the first trial: the shard stops (its partial file keeps that
    trial, with its calls); the rerun runs the other two, and calls.parquet has each call once."""
    revoked = {"on": False}

    def reply(body):
        if revoked["on"]:
            return 401, invalid_api_key("Bearer sk-revoked-0000")
        turn = sum(m["role"] == "assistant" for m in body["messages"])
        revoked["on"] = turn == 2
        return 200, chat_answer(THREE_TURNS[turn])

    srv = scripted(reply)
    cfg = RolloutSettings(engine="openai", base_url=srv.base_url, model="m", concurrency=1)
    tasks, out = tasks_of(tmp_path, 3), tmp_path / "out"
    with pytest.raises(EndpointError, match="HTTP 401"):
        rollout.run_shard(cfg, [tasks], out, 0)
    revoked["on"] = False
    srv.script = lambda body: (200, chat_answer(THREE_TURNS[sum(m["role"] == "assistant" for m in body["messages"])]))
    rollout.run_shard(cfg, [tasks], out, 0)
    assert len(srv.requests) == 4 + 2 * 3  # the first trial was not run again
    assert rollout.run(cfg, [tasks], out)["capture"]["calls"] == 9
    calls = calls_of(out / "calls.parquet")
    assert [(c["trial"], c["call_idx"]) for c in calls] == [(t, k) for t in range(3) for k in range(3)]
    assert all(c["status"] == 200 and c["harness_agrees"] for c in calls)


@needs_sandbox
@pytest.mark.slow
def test_a_shard_killed_mid_trial_loses_no_recorded_call_and_doubles_none(tmp_path, scripted):
    """kill -9 of the shard's process group while its second trial waits on the model: the rerun
    keeps the first trial's calls from the partial file (not asked again) and records the
    second trial's once, from its new run."""
    release = threading.Event()

    def reply(body):
        turn = sum(m["role"] == "assistant" for m in body["messages"])
        if len(srv.requests) > 3 and not release.is_set():  # the second trial's first call hangs
            release.wait(60)
        return 200, chat_answer(THREE_TURNS[turn])

    srv = scripted(reply)
    tasks, out = tasks_of(tmp_path, 2), tmp_path / "out"
    cfg = RolloutSettings(engine="openai", base_url=srv.base_url, model="m", concurrency=1)
    code = (
        "import sys; from pathlib import Path; from otbuild.stages import rollout;"
        "from otbuild.settings.stages import RolloutSettings as R;"
        "rollout.run_shard(R.model_validate_json(sys.argv[1]), [Path(sys.argv[2])], Path(sys.argv[3]), 0)"
    )
    shard = subprocess.Popen(
        [sys.executable, "-c", code, cfg.model_dump_json(), str(tasks), str(out)], start_new_session=True
    )
    partial, deadline = out / "shards" / "0-of-1.partial.jsonl", time.monotonic() + 120
    # the second trial's first call hangs; the first trial's verifier runs beside it (trials
    # pipelined: otbuild/harness/slots.py) and its record lands
    while len(srv.requests) < 4 or not partial.exists() or partial.read_text().count("\n") < 1:
        assert shard.poll() is None and time.monotonic() < deadline, "the shard never reached its second trial"
        time.sleep(0.05)
    os.killpg(shard.pid, signal.SIGKILL)
    shard.wait()
    assert len(partial.read_text().splitlines()) == 1  # the first trial, with its calls
    release.set()
    rollout.run_shard(cfg, [tasks], out, 0)
    assert len(srv.requests) == 3 + 1 + 3  # the first trial was not asked again; the second ran anew
    assert rollout.run(cfg, [tasks], out)["capture"]["calls"] == 6
    calls = calls_of(out / "calls.parquet")
    assert [(c["trial"], c["call_idx"]) for c in calls] == [(t, k) for t in range(2) for k in range(3)]
    assert all(c["status"] == 200 and c["harness_agrees"] for c in calls)


def test_an_answer_the_harness_logged_otherwise_is_counted(tmp_path):
    """The comparison can fail: a turn that is not the captured answer, a turn missing."""
    call = {c: None for c in CALL_SCHEMA.names} | {"status": 200, "delivered": True, "call_idx": 0, "scope": "0-0"}
    trace = {
        "trial_name": "t",
        "conversations": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
    }
    rows = trial_calls(0, trace, [{**call, "content": "a"}, {**call, "call_idx": 1, "content": "b"}], True)
    assert [r["harness_agrees"] for r in rows] == [True, False]
    rows += trial_calls(1, trace, [{**call, "content": "a", "reasoning": "r"}], True)  # logged without it
    rows += trial_calls(2, trace, [{**call, "status": 400}], True)  # an error is no turn
    write_calls(tmp_path / "0-of-1.calls.parquet", rows)
    stats = merge_call_files([tmp_path / "0-of-1.calls.parquet"], tmp_path / "calls.parquet")
    assert stats == {"calls": 4, "errors": 1, "harness_disagrees": 2, "with_token_ids": 0}
    merged = calls_of(tmp_path / "calls.parquet")
    assert [(r["trial"], r["call_idx"], r["harness_agrees"]) for r in merged] == [
        (0, 0, True),
        (0, 1, False),
        (1, 0, False),
        (2, 0, None),
    ]


@needs_sandbox
@pytest.mark.slow
def test_a_build_keeps_its_teachers_calls_beside_the_traces(project, scripted):
    srv = scripted(strict_endpoint(THREE_TURNS))
    (project / "recipes" / "c.yaml").write_text(f"""
sources:
  a: {{kind: synthetic, count: 3, seed: 1}}
teacher: {{engine: openai, base_url: '{srv.base_url}', model: m, concurrency: 2, shards: 2}}
trace_filter: {{min_turns: 1}}
""")
    snakemake(project, "c")
    (calls,) = list((project / "artifacts").glob("rollout/*/calls.parquet"))
    rows = calls_of(calls)
    traces = pq.read_table(calls.with_name("traces.parquet")).to_pylist()
    assert len(rows) == len(srv.requests) == 3 * len(traces) and all(r["harness_agrees"] for r in rows)
    assert {r["trial_name"] for r in rows} == {t["trial_name"] for t in traces}
    assert json.loads(calls.with_name(PROVENANCE).read_text())["stats"]["capture"]["calls"] == len(rows)
