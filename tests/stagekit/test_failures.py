"""How trials end and how failures are counted (docs/failures.md): one classification for the
trace filter, eval scores and a shard's counts; a wrong key fails at once; infrastructure
failures are retried, then counted against max_infra_failures; eval never scores them 0."""

import json

import pyarrow.parquet as pq
import pytest

from otbuild import duck
from otbuild.engines import ENGINES, Completion, EngineError
from otbuild.engines.endpoint import EndpointError
from otbuild.sandbox import backend_problem
from otbuild.sources.synthetic import generate
from otbuild.stages import eval as eval_stage
from otbuild.stages import rollout
from otbuild.stagekit.failures import InfraFailuresExceeded
from otbuild.settings.stages import RolloutSettings
from otbuild.stages.eval import EvalSettings
from otbuild.tasks.table import write_tasks
from otbuild.traces import outcome as oc
from otbuild.traces.table import write_traces
from tests.conftest import chat_answer, invalid_api_key, snakemake
from tests.harness.test_harness import THREE_TURNS, answer

needs_sandbox = pytest.mark.skipif(backend_problem("bwrap") is not None, reason="bubblewrap unusable here")


def row(result="1", exception=None, timed_out=False, reward=1.0, **kw) -> dict:
    base = {
        c: None
        for c in (
            "conversations",
            "agent",
            "model",
            "model_provider",
            "date",
            "task",
            "episode",
            "run_id",
            "trial_name",
            "task_id",
            "teacher",
            "n_input_tokens",
            "n_output_tokens",
            "duration_s",
        )
    }
    return {
        **base,
        "conversations": [{"role": "user", "content": "x"}] + [{"role": "assistant", "content": "a"}] * 5,
        "result": result,
        "exception": exception,
        "timed_out": timed_out,
        "reward": reward,
        "is_subagent": False,
        "n_turns": 5,
        "source": "bench",
        "sample_idx": 0,
        "metadata": "{}",
        **kw,
    }


# (row, outcome): otbuild's harness and Harbor's rows, as each writes them
ROWS = [
    (row("1", reward=1.0), oc.PASSED),
    (row("0.5", reward=0.5), oc.FAILED),
    (row("", reward=None), oc.UNVERIFIED),
    (row("0", timed_out=True, reward=0.0), oc.TIMED_OUT),
    (row("AgentTimeoutError", timed_out=True, reward=0.0), oc.TIMED_OUT),  # Harbor
    # otbuild's harness: a task failure names itself in `result` only
    (row("DiskLimitExceededError", reward=0.0), oc.TASK_FAILURE),
    (row("TaskSetupError", reward=0.0), oc.TASK_FAILURE),  # an earlier step left a file in the way
    (row("ContextLengthExceededError", reward=0.0), oc.TASK_FAILURE),
    (row("ContextLengthExceededError", "ContextLengthExceededError", reward=None), oc.TASK_FAILURE),  # Harbor
    (row("RewardFileNotFoundError", "RewardFileNotFoundError", reward=None), oc.VERIFIER_ERROR),
    (row("VerifierTimeoutError", "VerifierTimeoutError", timed_out=True, reward=None), oc.VERIFIER_ERROR),
    (row("EngineError", "EngineError", reward=None), oc.INFRASTRUCTURE),
    (row("SandboxError", "SandboxError", reward=None), oc.INFRASTRUCTURE),
    (row("AuthenticationError", "AuthenticationError", reward=None), oc.INFRASTRUCTURE),  # Harbor (litellm)
    (row("InternalServerError", "InternalServerError", reward=None), oc.INFRASTRUCTURE),
    (row("EnvironmentStartTimeoutError", "EnvironmentStartTimeoutError", reward=None), oc.INFRASTRUCTURE),
    (row("TaskNotRunnableLocally", "TaskNotRunnableLocally", reward=None), oc.NOT_RUN),
    (row("EnvironmentDefinitionError", "EnvironmentDefinitionError", reward=None), oc.NOT_RUN),  # Harbor
]


def test_every_way_a_trial_ends_classifies_alike_in_python_and_sql(tmp_path):
    assert [oc.outcome(r) for r, _ in ROWS] == [o for _, o in ROWS]
    write_traces(tmp_path / "t.parquet", [r for r, _ in ROWS])
    con = duck.connect()
    con.execute(oc.sql_macros())
    got = [
        o
        for (o,) in con.execute(
            "SELECT otb_outcome(result, exception, timed_out, reward) FROM "
            f"read_parquet({duck.sql_literal(tmp_path / 't.parquet')})"
        ).fetchall()
    ]
    assert got == [o for _, o in ROWS]


def test_the_trace_filter_drops_by_outcome_whichever_harness_wrote_the_row(tmp_path):
    """A disk-limit or context-overflow trial is a failed task (kept, reward 0) from either
    harness; infrastructure and verifier errors are dropped naming the error."""
    from otbuild.stages.trace_filter import TraceFilter
    from otbuild.stages import trace_filter

    write_traces(
        tmp_path / "t.parquet",
        [
            {**r, "trial_name": f"t{i}", "conversations": r["conversations"] + [{"role": "user", "content": str(i)}]}
            for i, (r, _) in enumerate(ROWS)
        ],
    )
    trace_filter.run(TraceFilter(dedup=False), [tmp_path / "t.parquet"], tmp_path / "out")
    reasons = {r["trial_name"]: r["reason"] for r in pq.read_table(tmp_path / "out" / "rejected.parquet").to_pylist()}
    kept = {r["trial_name"] for r in pq.read_table(tmp_path / "out" / "kept.parquet").to_pylist()}
    for i, (r, outcome) in enumerate(ROWS):
        if outcome in oc.DROPPED_AS_EXCEPTIONS:
            assert reasons[f"t{i}"] == f"exception: {r['result']}"
        elif outcome == oc.TIMED_OUT:
            assert reasons[f"t{i}"] == "timed_out"
        else:
            assert f"t{i}" in kept


def test_eval_leaves_infrastructure_failures_out_of_the_mean_and_says_so(tmp_path):
    """On main an EngineError scored 0: a crashed endpoint ranked the model last, silently."""
    rows = [
        row("1", reward=1.0, task="a"),
        row("0", reward=0.0, task="b"),
        row("DiskLimitExceededError", reward=0.0, task="c"),
        row("RewardFileNotFoundError", "RewardFileNotFoundError", reward=None, task="d"),
        row("EngineError", "EngineError", reward=None, task="e"),
        row("TaskNotRunnableLocally", "TaskNotRunnableLocally", reward=None, task="f"),
    ]
    write_traces(tmp_path / "shards" / "0-of-1.parquet", rows)
    stats = eval_stage.run(EvalSettings(engine="oracle", model_label="oracle:oracle"), [], tmp_path)
    [summary] = pq.read_table(tmp_path / "summary.parquet").to_pylist()
    assert summary["mean"] == pytest.approx(1 / 4)  # a, b, c, d scored; e, f excluded
    assert (summary["n_tasks"], summary["n_exceptions"], summary["n_task_failures"], summary["n_excluded"]) == (
        6,
        1,
        1,
        2,
    )
    scores = {r["task"]: r for r in pq.read_table(tmp_path / "scores.parquet").to_pylist()}
    assert scores["e"]["reward"] is None and scores["e"]["excluded"] and scores["e"]["outcome"] == "infrastructure"
    assert scores["c"]["reward"] == 0.0 and scores["c"]["outcome"] == "task_failure"
    assert stats["benchmarks"]["bench"]["excluded"] == 2
    assert stats["outcomes"]["infrastructure"] == 1 and stats["infra_failures_by_type"] == {"EngineError": 1}


# -- rollout shards against a model --------------------------------------------------------
def _tasks(tmp_path, n=4):
    tasks = tmp_path / "tasks.parquet"
    write_tasks(tasks, generate(n, 3), source="synth")
    return tasks


@needs_sandbox
def test_a_wrong_key_fails_the_shard_at_once_naming_the_401(tmp_path, scripted, monkeypatch):
    """On main every trial recorded an EngineError, the shard wrote its rows and the build
    'succeeded'. Now the first request goes alone, and its 401 stops the shard: one request."""
    srv = scripted(lambda body: (200, chat_answer(THREE_TURNS[0])), api_key="sk-right-key-1234")
    monkeypatch.setenv("OTB_TEST_KEY", "sk-wrong-key-9876")
    cfg = RolloutSettings(engine="openai", base_url=srv.base_url, model="m", api_key_env="OTB_TEST_KEY", concurrency=4)
    with pytest.raises(
        EndpointError, match=r"check the API key.*HTTP 401.*Incorrect API key provided: sk-\*\*\*\*\*9876"
    ):
        rollout.run_shard(cfg, [_tasks(tmp_path)], tmp_path / "out", 0)
    assert len(srv.requests) == 1
    assert not (tmp_path / "out" / "shards" / "0-of-1.parquet").exists()


@needs_sandbox
def test_a_key_revoked_mid_run_stops_the_shard_and_the_rerun_resumes(tmp_path, scripted, monkeypatch):
    revoked = {"on": False}

    def reply(body):
        if revoked["on"]:
            return 401, invalid_api_key("Bearer sk-revoked-0000")
        turn = sum(m["role"] == "assistant" for m in body["messages"])
        revoked["on"] = turn == 2  # the first trial finishes, then the key is revoked
        return 200, chat_answer(THREE_TURNS[turn])

    srv = scripted(reply)
    cfg = RolloutSettings(engine="openai", base_url=srv.base_url, model="m", concurrency=1)
    tasks = _tasks(tmp_path, 3)
    with pytest.raises(EndpointError, match="HTTP 401"):
        rollout.run_shard(cfg, [tasks], tmp_path / "out", 0)
    assert len(srv.requests) == 4  # three for the first trial, one refused
    revoked["on"], srv.script = (
        False,
        lambda body: (200, chat_answer(THREE_TURNS[sum(m["role"] == "assistant" for m in body["messages"])])),
    )
    rollout.run_shard(cfg, [tasks], tmp_path / "out", 0)
    rows = pq.read_table(tmp_path / "out" / "shards" / "0-of-1.parquet").to_pylist()
    assert len(rows) == 3 and all(r["exception"] is None for r in rows)
    assert len(srv.requests) == 4 + 2 * 3  # the first trial was not run again


class FlakyEngine:
    """Answers like the oracle would end (task_complete twice), failing with a 503 (after the
    client's retries) while `FlakyEngine.failing` says so for the trial's task."""

    name, provider, model = "flaky", "test", "flaky"
    failing: dict = {}  # task marker -> how many more requests fail (-1: all)
    requests = 0

    def __init__(self, settings):
        pass

    async def complete(self, messages, **_):
        FlakyEngine.requests += 1
        for marker, left in self.failing.items():
            if marker in messages[0]["content"] and left:
                self.failing[marker] = left - 1
                raise EngineError(
                    "engine flaky: no answer after 6 attempt(s); last error: HTTP 503: overloaded", status=503
                )
        return Completion(answer(complete=True), 10, 5, "stop")

    async def aclose(self):
        pass


def _flaky_settings(monkeypatch, **kw):
    monkeypatch.setitem(ENGINES, "flaky", FlakyEngine)
    FlakyEngine.requests = 0
    return RolloutSettings(engine="oracle", backoff_sec=0.01, backoff_max_sec=0.02, **kw).model_copy(
        update={"engine": "flaky"}
    )


@needs_sandbox
def test_an_infrastructure_failure_is_retried_and_the_attempts_recorded(tmp_path, monkeypatch):
    tasks = _tasks(tmp_path, 3)
    instructions = [t.task.instruction for t in generate(3, 3)]
    cfg = _flaky_settings(monkeypatch, concurrency=2, infra_retries=2, max_infra_failures=0.4)
    FlakyEngine.failing = {instructions[0]: 2, instructions[1]: -1}  # recovers / never does
    rollout.run_shard(cfg, [tasks], tmp_path / "out", 0)
    rows = pq.read_table(tmp_path / "out" / "shards" / "0-of-1.parquet").to_pylist()
    assert len(rows) == 3  # one row per trial, whatever its attempts
    meta = [json.loads(r["metadata"]) for r in rows]
    assert rows[0]["exception"] is None and meta[0]["attempts"] == 3
    assert meta[0]["retried_exceptions"] == ["EngineError", "EngineError"]
    assert rows[1]["exception"] == "EngineError" and meta[1]["attempts"] == 3  # 1 of 3 <= 0.4: kept, counted
    assert "attempts" not in meta[2]  # a first attempt's row is as before
    stats = rollout.run(cfg, [tasks], tmp_path / "out")
    assert stats["infra_failures"] == 1 and stats["infra_failures_by_type"] == {"EngineError": 1}


@needs_sandbox
def test_past_max_infra_failures_the_shard_fails_and_a_rerun_retries_only_those(tmp_path, monkeypatch, capsys):
    tasks = _tasks(tmp_path, 4)
    cfg = _flaky_settings(monkeypatch, concurrency=1, infra_retries=1, max_infra_failures=0.25)
    FlakyEngine.failing = {"": -1}  # every request fails: the sandbox is fine, the endpoint is not
    with pytest.raises(
        InfraFailuresExceeded,
        match=r"2 of 4 trials failed .*allows \(1\): EngineError x2; "
        r"e\.g\. EngineError: engine flaky: .*HTTP 503: overloaded",
    ):
        rollout.run_shard(cfg, [tasks], tmp_path / "out", 0)
    assert FlakyEngine.requests < 4 * 2  # it stopped at the second: not every trial's attempts
    partial = tmp_path / "out" / "shards" / "0-of-1.partial.jsonl"
    assert len(partial.read_text().splitlines()) == 2  # the failed trials' last attempts
    FlakyEngine.failing = {}  # the endpoint is back
    capsys.readouterr()
    rollout.run_shard(cfg, [tasks], tmp_path / "out", 0)
    assert "0 already done, 4 to run (2 of them failed for infrastructure reasons before)" in capsys.readouterr().out
    rows = pq.read_table(tmp_path / "out" / "shards" / "0-of-1.parquet").to_pylist()
    assert len(rows) == 4 and all(r["exception"] is None for r in rows) and not partial.exists()


@needs_sandbox
@pytest.mark.slow
def test_a_build_with_a_wrong_key_fails_naming_the_401(project, scripted, monkeypatch):
    """The issue's case through the real snakemake CLI: exit non-zero, the API's message in the
    log, one request per attempt of the shard job (profiles/default: `retries: 1`)."""
    srv = scripted(lambda body: (200, chat_answer(THREE_TURNS[0])), api_key="sk-right-key-1234")
    monkeypatch.setenv("OTB_TEST_KEY", "sk-wrong-key-9876")
    (project / "recipes" / "k.yaml").write_text(f"""
sources:
  a: {{kind: synthetic, count: 4, seed: 1}}
teacher: {{engine: openai, base_url: '{srv.base_url}', model: m, api_key_env: OTB_TEST_KEY, concurrency: 4}}
trace_filter: {{min_turns: 1}}
""")
    _, log = snakemake(project, "k", check=False)
    assert "Incorrect API key provided" in log and "HTTP 401" in log, log[-3000:]
    assert "Nothing to be done" not in log and "(100%) done" not in log
    assert len(srv.requests) == 2
    assert not list((project / "artifacts").glob("rollout/*/traces.parquet"))


def test_a_harbor_job_dir_is_scored_as_the_eval_stage_scores(tmp_path):
    """`otbuild ingest harbor-job`: Harbor's InternalServerError (a 5xx of the model's API) is
    left out of the mean, not scored 0; its verifier errors score 0."""
    from otbuild.ingest import harbor_job

    for name, exc, reward in (
        ("a__1", None, 1.0),
        ("b__1", "InternalServerError", None),
        ("c__1", "RewardFileNotFoundError", None),
        ("d__1", None, 0.0),
    ):
        (tmp_path / "job" / name).mkdir(parents=True)
        (tmp_path / "job" / name / "result.json").write_text(
            json.dumps(
                {
                    "task_name": name[0],
                    "trial_name": name,
                    "source": "tb",
                    "exception_info": {"exception_type": exc} if exc else None,
                    "verifier_result": {"rewards": {"reward": reward}} if reward is not None else None,
                }
            )
        )
    harbor_job(tmp_path / "job", tmp_path / "out")
    [summary] = pq.read_table(tmp_path / "out" / "summary.parquet").to_pylist()
    assert summary["mean"] == pytest.approx(1 / 3) and summary["n_excluded"] == 1 and summary["n_exceptions"] == 1


def test_harbor_shards_are_counted_the_same_way(tmp_path, monkeypatch):
    """Rows from Harbor's job dirs (after Harbor's own retries): its InternalServerError past
    max_infra_failures fails the shard; EnvironmentDefinitionError (a task refused) is not run,
    not an infrastructure failure."""
    from otbuild.stagekit import harbor_trials

    tasks = _tasks(tmp_path, 4)
    rows = [row("1", reward=1.0, task=f"t{i}") for i in range(4)]
    monkeypatch.setattr(harbor_trials, "run_harbor_shard", lambda *a: (rows, []))
    cfg = RolloutSettings(engine="oracle", sandbox="harbor", max_infra_failures=0.25)
    rows[0] = row("EnvironmentDefinitionError", "EnvironmentDefinitionError", reward=None)
    rows[1] = row(
        "InternalServerError",
        "InternalServerError",
        reward=None,
        metadata=json.dumps({"exception_message": "litellm.InternalServerError: OpenAIException - 500"}),
    )
    rollout.run_shard(cfg, [tasks], tmp_path / "out", 0)  # 1 of 4 <= 0.25
    rows[2] = rows[1]
    with pytest.raises(
        InfraFailuresExceeded,
        match=r"2 of 4 trials .*InternalServerError x2; e\.g\. "
        r"InternalServerError: litellm\.InternalServerError: OpenAIException - 500",
    ):
        rollout.run_shard(cfg, [tasks], tmp_path / "out2", 0)


@needs_sandbox
def test_an_unreachable_endpoint_fails_the_shard_at_once(tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = RolloutSettings(
        engine="openai",
        base_url=f"http://127.0.0.1:{port}/v1",
        model="m",
        concurrency=4,
        max_retries=1,
        backoff_sec=0.01,
    )
    with pytest.raises(
        EndpointError,
        match=r"the first request failed.*no answer after 2 attempt\(s\); "
        r"last error: ConnectError",
    ):
        rollout.run_shard(cfg, [_tasks(tmp_path)], tmp_path / "out", 0)
    assert not (tmp_path / "out" / "shards" / "0-of-1.parquet").exists()
