"""Harbor integration: job config / command, and ingestion of job dirs the real harbor CLI
wrote with otbuild's environment (oracle; terminus-2 against `otbuild serve` + the tiny model).

The slow part needs .venv-harbor (scripts/harbor-env.sh, `make harbor-env`); without it those
tests are skipped, saying so.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from otbuild.harbor import ingest
from otbuild.harbor.job import (
    DEFAULT_HARBOR,
    OTBUILD_IMPORT_PATH,
    HarborNotInstalled,
    harbor_bin,
    harbor_command,
    job_config,
    run_harbor_job,
    write_job_config,
)
from otbuild.sandbox import backend_problem
from otbuild.sources.synthetic import generate
from otbuild.settings.stages import RolloutSettings
from otbuild.tasks.table import Quarantined, write_tasks
from otbuild.traces.table import TRACE_SCHEMA, count_turns
from tests.conftest import otbuild, snakemake, trace_import

HARBOR = Path(os.environ.get("OTBUILD_HARBOR") or DEFAULT_HARBOR)
needs_harbor = pytest.mark.skipif(
    not HARBOR.is_file(), reason=f"Harbor is not installed at {HARBOR}: run scripts/harbor-env.sh (make harbor-env)"
)
N_TASKS = 3


# -- config and command (no harbor, no docker needed) ---------------------------------------
def test_docker_job_config_and_command(tmp_path):
    cfg = job_config(
        tmp_path / "tasks",
        tmp_path / "jobs",
        "j1",
        agent="terminus-2",
        model="openai/glm",
        base_url="http://h:8000/v1",
        environment="docker",
        n_attempts=3,
        n_concurrent=8,
        agent_kwargs={"max_turns": 5},
    )
    assert cfg["environment"]["type"] == "docker" and "import_path" not in cfg["environment"]
    assert cfg["agents"] == [
        {
            "name": "terminus-2",
            "model_name": "openai/glm",
            "base_url": "http://h:8000/v1",
            "kwargs": {"max_turns": 5, "trajectory_config": {"raw_content": True, "linear_history": True}},
        }
    ]
    assert cfg["n_attempts"] == 3 and cfg["n_concurrent_trials"] == 8
    assert cfg["datasets"] == [{"path": str((tmp_path / "tasks").resolve())}]
    assert Path(cfg["jobs_dir"]).is_absolute() and cfg["job_name"] == "j1"
    path = write_job_config(tmp_path / "j1.json", cfg)
    assert json.loads(path.read_text()) == cfg
    cmd = harbor_command(path, harbor="/opt/h/bin/harbor", check_installed=False)
    assert cmd == ["/opt/h/bin/harbor", "run", "-c", str(path), "-y"]


def test_otbuild_environment_config(tmp_path):
    cfg = job_config(tmp_path, tmp_path, "j", agent="terminus-2", model="openai/tiny")
    assert cfg["environment"]["import_path"] == OTBUILD_IMPORT_PATH
    assert cfg["agents"][0]["kwargs"]["record_terminal_session"] is False  # no asciinema
    assert job_config(tmp_path, tmp_path, "j", environment="m.x:Env")["environment"]["import_path"] == "m.x:Env"
    with pytest.raises(ValueError, match="needs a model"):
        job_config(tmp_path, tmp_path, "j", agent="terminus-2")


def test_harbor_missing_names_the_setup_script(tmp_path):
    with pytest.raises(HarborNotInstalled, match="scripts/harbor-env.sh"):
        harbor_bin(tmp_path / "nope" / "harbor")
    with pytest.raises(HarborNotInstalled, match="scripts/harbor-env.sh"):
        run_harbor_job(tmp_path, tmp_path, harbor=tmp_path / "nope")


def test_ingest_handwritten_trial(tmp_path):
    """An empty first user turn gets the instruction; exceptions are kept apart."""
    task = tmp_path / "tasks" / "t1"
    (task / "solution").mkdir(parents=True)
    (task / "instruction.md").write_text("Do the thing.")
    trial = tmp_path / "jobs" / "j" / "t1__abc"
    (trial / "agent").mkdir(parents=True)
    (trial / "result.json").write_text(
        json.dumps(
            {
                "task_name": "t1",
                "trial_name": "t1__abc",
                "source": "bench",
                "config": {"task": {"path": str(task)}, "agent": {"name": "terminus-2", "model_name": "openai/m"}},
                "agent_info": {"name": "terminus-2", "model_info": {"name": "m", "provider": "openai"}},
                "agent_result": {"n_input_tokens": 10, "n_output_tokens": 3},
                "verifier_result": None,
                "exception_info": {"exception_type": "RuntimeError", "exception_message": "boom"},
                "started_at": "2026-01-01T00:00:00Z",
                "finished_at": "2026-01-01T00:00:02.5Z",
            }
        )
    )
    (trial / "config.json").write_text("{}")
    (trial / "agent" / "trajectory.json").write_text(
        json.dumps(
            {
                "steps": [
                    {"source": "user", "message": ""},
                    {"source": "agent", "message": "ls", "observation": {"results": [{"content": "a"}]}},
                    {"source": "agent", "message": "done", "observation": {"results": [{"content": "b"}]}},
                ]
            }
        )
    )
    row = ingest.read_trial(trial)
    assert row["conversations"] == [
        {"role": "user", "content": "Do the thing."},
        {"role": "assistant", "content": "ls"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "done"},
    ]
    assert row["n_turns"] == 2 and row["episode"] == "episode-1"
    assert row["exception"] == row["result"] == "RuntimeError" and not row["timed_out"]
    assert row["reward"] is None and row["duration_s"] == 2.5
    assert (row["model"], row["model_provider"], row["n_input_tokens"]) == ("m", "openai", 10)
    pa.Table.from_pylist([row], TRACE_SCHEMA)
    assert ingest.job_scores(trial.parent) == [
        {
            "model": "m",
            "benchmark": "bench",
            "repeat": 0,
            "task": "t1",
            "reward": None,
            "exception": "RuntimeError",
            "duration": 2.5,
        }
    ]


def _trial(job: Path, name: str, task: str, steps: list, **files) -> Path:
    trial = job / name
    (trial / "agent").mkdir(parents=True)
    (trial / "result.json").write_text(
        json.dumps(
            {
                "task_name": task,
                "trial_name": name,
                "config": {"task": {"path": f"/tasks/{task}"}},
                "agent_info": {"name": "terminus-2", "model_info": {"name": "m", "provider": "openai"}},
                "verifier_result": {"rewards": {"reward": 1.0}},
            }
        )
    )
    (trial / "agent" / "trajectory.json").write_text(json.dumps({"steps": steps}))
    for fname, data in files.items():
        (trial / "agent" / fname).write_text(json.dumps(data))
    return trial


def test_subagent_trajectories_are_rows_the_trace_filter_drops(tmp_path):
    """terminus-2's context summarization writes subagent trajectories beside the main one
    (harbor 0.26: agent/trajectory.summarization-N-{summary,questions,answers}.json, agent
    name terminus-2-summarization-*); Harbor rollouts keep them as is_subagent rows."""
    from otbuild.stages.trace_filter import TraceFilter
    from otbuild.stages import trace_filter
    from otbuild.stagekit.harbor_trials import shard_rows
    from otbuild.traces.table import write_traces

    steps = [{"source": "user", "message": "task"}] + [
        {"source": "agent", "message": f"step {i}", "observation": {"results": [{"content": "ok"}]}} for i in range(6)
    ]
    summary = {
        "session_id": "s-sum",
        "agent": {
            "name": "terminus-2-summarization-summary",
            "extra": {"parent_session_id": "s", "summarization_index": 1},
        },
        "steps": [{"source": "user", "message": "Summarize"}] + steps[1:],
    }
    job = tmp_path / "job"
    _trial(job, "t1__a", "t1", steps, **{"trajectory.summarization-1-summary.json": summary})
    _trial(job, "t1-2__b", "t1-2", steps[:3])  # an upsampled copy of t1, exported apart
    rows = list(ingest.read_job(job, subagents=True))
    ids = [
        {"task": "t1", "task_id": f"id{i}", "source": "s", "sample_idx": 0, "run_id": "r", "teacher": "vllm:m"}
        for i in range(2)
    ]
    out = shard_rows(["t1", "t1-2"], ids, rows)
    assert [(r["task"], r["task_id"], r["is_subagent"], r["n_turns"]) for r in out] == [
        ("t1", "id0", False, 6),
        ("t1", "id1", False, 2),
        ("t1", "id0", True, 6),
    ]
    assert {r["result"] for r in out} == {"1.0"}  # the reward as Harbor's export writes it: str(float)
    write_traces(tmp_path / "traces.parquet", out)
    for drop, kept_n in ((True, 1), (False, 2)):
        dest = tmp_path / f"filtered-{drop}"
        dest.mkdir()
        stats = trace_filter.run(TraceFilter(drop_subagent=drop), [tmp_path / "traces.parquet"], dest)
        assert stats["kept"] == kept_n
        assert stats["rejected_by_reason"] == ({"min_turns": 1, "subagent": 1} if drop else {"min_turns": 1})


def test_harbor_jobs_get_the_recipes_trial_settings(tmp_path):
    """Timeout cap, episodes, temperature and max_tokens reach Harbor's job config."""
    from otbuild.stagekit.harbor_trials import harbor_options

    teacher = RolloutSettings(
        engine="vllm",
        model="m",
        temperature=0.3,
        max_tokens=1234,
        max_episodes=7,
        timeout_multiplier=4,
        timeout_cap_sec=600,
        sandbox="harbor",
    )
    options = harbor_options(teacher)
    cfg = job_config(tmp_path, tmp_path / "jobs", "j", model="openai/m", **options)
    [agent] = cfg["agents"]
    assert agent["name"] == "terminus-2" and agent["max_timeout_sec"] == 150  # 150 x 4 = the cap
    assert cfg["verifier"] == {"max_timeout_sec": 150}  # the verifier is capped alike
    assert agent["kwargs"] == {
        "max_turns": 7,
        "temperature": 0.3,
        "llm_call_kwargs": {"max_tokens": 1234},
        "trajectory_config": {"raw_content": True, "linear_history": True},
    }
    assert cfg["timeout_multiplier"] == 4 and cfg["environment"]["type"] == "docker"
    mine = teacher.model_copy(
        update={"harbor": teacher.harbor.model_copy(update={"agent_kwargs": {"temperature": 1.0}})}
    )
    assert harbor_options(mine)["agent_kwargs"]["temperature"] == 1.0  # harbor.agent_kwargs win
    # no proxy records the calls: terminus-2 reports their token ids itself (Harbor's rollout details)
    uncaptured = teacher.model_copy(update={"capture": False})
    assert harbor_options(uncaptured)["agent_kwargs"]["collect_rollout_details"] is True
    hosted = uncaptured.model_copy(update={"engine": "openai"})
    assert "collect_rollout_details" not in harbor_options(hosted)["agent_kwargs"]
    oracle = harbor_options(RolloutSettings(engine="oracle", sandbox="harbor"))
    assert oracle["agent"] == "oracle" and oracle["agent_kwargs"] is None
    if HARBOR.is_file():  # Harbor itself reads the config and resolves the trial's timeout
        py = HARBOR.parent / "python"
        code = (
            "import json,sys; from harbor.models.job.config import JobConfig; "
            "c = JobConfig.model_validate(json.load(open(sys.argv[1]))); a = c.agents[0]; "
            "print(min(900, a.max_timeout_sec) * c.timeout_multiplier, a.kwargs['max_turns'], "
            "min(600, c.verifier.max_timeout_sec) * c.timeout_multiplier)"
        )
        path = write_job_config(tmp_path / "job.json", cfg)
        res = subprocess.run([str(py), "-c", code, str(path)], capture_output=True, text=True, check=False)
        assert res.returncode == 0, res.stderr
        assert res.stdout.split() == ["600.0", "7", "600.0"]  # a 900 s task: min(900 x 4, 600); its verifier too


# -- real harbor runs ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def harbor_jobs(tmp_path_factory):
    """Oracle and terminus-2 (+ tiny model behind `otbuild serve`) job dirs, written by the
    real harbor CLI with otbuild's environment, over synthetic tasks from a task parquet."""
    if not HARBOR.is_file():
        pytest.skip(f"Harbor is not installed at {HARBOR}: run scripts/harbor-env.sh")
    from otbuild.engines.local import start_local_server
    from otbuild.engines.tiny import make_tiny_model

    work = tmp_path_factory.mktemp("harbor")
    parquet = work / "tasks.parquet"
    write_tasks(parquet, generate(N_TASKS, seed=0), source="synthetic")
    jobs = {"oracle": run_harbor_job(parquet, work, agent="oracle", job_name="oracle", n_concurrent=2, timeout_sec=300)}
    # a task whose Dockerfile needs a container image build: refused, on that trial alone
    odd = work / "odd"
    first = min((work / "tasks").iterdir())
    shutil.copytree(first, odd / "needs-image")
    shutil.copytree(first, odd / "plain")
    (odd / "needs-image" / "environment" / "Dockerfile").write_text(
        "FROM python:3.12-slim\nRUN apt-get install -y jq\nWORKDIR /app\nCOPY app/ /app/\n"
    )
    jobs["odd"] = run_harbor_job(odd, work, agent="oracle", job_name="odd", timeout_sec=300)
    model_dir = make_tiny_model(work / "tiny")
    base_url, stop = start_local_server(model_dir, served_model_name="tiny", device="cpu")
    try:
        jobs["terminus-2"] = run_harbor_job(
            work / "tasks",
            work,
            agent="terminus-2",
            model="openai/tiny",
            base_url=base_url,
            job_name="t2",
            n_concurrent=N_TASKS,
            agent_timeout_sec=60,
            timeout_sec=300,
            agent_kwargs={"max_turns": 2, "temperature": 0.7},
        )
    finally:
        stop()
    return jobs


def _check_rows(rows):
    pa.Table.from_pylist(rows, TRACE_SCHEMA)  # every row fits the schema
    for r in rows:
        assert r["conversations"] and r["conversations"][0]["role"] == "user"
        assert r["conversations"][0]["content"].strip(), "empty first user turn"
        assert r["n_turns"] == count_turns(r["conversations"])


@needs_harbor
@pytest.mark.slow
def test_oracle_job_rows(harbor_jobs):
    job = harbor_jobs["oracle"]
    rows = list(ingest.read_job(job))
    assert len(rows) == N_TASKS
    _check_rows(rows)
    for r in rows:
        assert r["reward"] == 1.0 and r["result"] == "1.0", r  # as Harbor's export: str(float)
        assert r["exception"] is None and not r["timed_out"]
        assert r["agent"] == "oracle" and r["n_turns"] >= 1
        assert "Reference solution" in r["conversations"][1]["content"]
        assert r["conversations"][0]["content"].startswith("# ")  # the task's instruction
        meta = json.loads(r["metadata"])
        assert meta["environment"] == OTBUILD_IMPORT_PATH
    # the same row read from its trial dir alone
    one = ingest.read_trial(Path(json.loads(rows[0]["metadata"])["harbor_trial_dir"]))
    assert one["conversations"] == rows[0]["conversations"]
    scores = ingest.job_scores(job)
    assert [s["reward"] for s in scores] == [1.0] * N_TASKS
    assert {s["repeat"] for s in scores} == {0} and all(s["duration"] >= 0 for s in scores)


@needs_harbor
@pytest.mark.slow
def test_terminus2_tiny_model_rows(harbor_jobs):
    job = harbor_jobs["terminus-2"]
    trials = ingest.trial_dirs(job)
    rows = list(ingest.read_job(job))
    assert len(rows) == len(trials) == N_TASKS
    _check_rows(rows)
    for r, trial in zip(rows, trials):
        result = json.loads((trial / "result.json").read_text())
        exc = (result.get("exception_info") or {}).get("exception_type")
        # whatever happened is recorded faithfully
        assert r["agent"] == "terminus-2" and r["model"] == "tiny"
        assert r["model_provider"] == "openai"
        if exc == "AgentTimeoutError":
            assert r["timed_out"] and r["exception"] is None
        else:
            assert r["exception"] == exc and not r["timed_out"]
        assert r["result"] == (exc or str(float(r["reward"])))
        assert r["reward"] in (0.0, None)  # a random tiny model does not solve tasks
        assert r["n_input_tokens"] == result["agent_result"]["n_input_tokens"]
        assert r["n_output_tokens"] == result["agent_result"]["n_output_tokens"]
        # the first user turn is terminus-2's real prompt, with the task in it; after a context
        # overflow the row is the last window, which opens with the context handed over; a
        # trajectory that opens with an answer gets the task's instruction before it
        meta = json.loads(r["metadata"])
        instruction = (Path(meta["task_path"]) / "instruction.md").read_text()
        first = r["conversations"][0]["content"]
        assert "Task Description" in first or len(meta["trajectories"]) > 1 or first == instruction, meta
        if r["n_turns"]:
            assert r["conversations"][-1]["role"] == "assistant"
    assert any(r["n_turns"] >= 1 for r in rows) or any(r["exception"] for r in rows)


@needs_harbor
@pytest.mark.slow
def test_dockerfile_with_run_lines_is_refused_per_trial(harbor_jobs):
    rows = {r["task"]: r for r in ingest.read_job(harbor_jobs["odd"])}
    bad, ok = rows["needs-image"], rows["plain"]
    assert bad["exception"] == bad["result"] == "EnvironmentDefinitionError"
    assert "needs-image" in json.loads(bad["metadata"])["exception_message"]
    assert "RUN" in json.loads(bad["metadata"])["exception_message"]
    assert bad["n_turns"] == 0 and bad["conversations"][0]["content"].strip()
    assert ok["reward"] == 1.0 and ok["exception"] is None


@needs_harbor
@pytest.mark.slow
def test_allow_run_leaves_out_build_steps_but_refuses_add(tmp_path):
    """The one Dockerfile policy under `--ek allow_run=true`: RUN and CMD are left out (the task
    runs on the host's tools), an ADD is still refused (Docker would fetch or unpack it), on
    that trial alone."""
    src = tmp_path / "tasks"
    dockerfiles = {
        "with-run": 'FROM python:3.12-slim\nRUN apt-get install -y jq\nWORKDIR /app\nCOPY app/ /app/\nCMD ["bash"]\n',
        "with-add": "FROM python:3.12-slim\nWORKDIR /app\nADD app/ /app/\n",
    }
    for rec, (name, dockerfile) in zip(generate(2, seed=0), dockerfiles.items()):
        rec.task.write(src / name)
        (src / name / "environment" / "Dockerfile").write_text(dockerfile)
    job = run_harbor_job(
        src, tmp_path, agent="oracle", job_name="allow-run", timeout_sec=300, environment_kwargs={"allow_run": "true"}
    )
    rows = {r["task"]: r for r in ingest.read_job(job)}
    assert rows["with-run"]["reward"] == 1.0 and rows["with-run"]["exception"] is None
    refused = rows["with-add"]
    assert refused["exception"] == "EnvironmentDefinitionError"
    assert "ADD at line 3" in json.loads(refused["metadata"])["exception_message"]


@needs_harbor
@pytest.mark.slow
def test_ingest_cli_gives_the_eval_tables(harbor_jobs, tmp_path):
    res = otbuild(tmp_path, "ingest", "harbor-job", str(harbor_jobs["terminus-2"]), "--out", "t2")
    assert res.returncode == 0, res.stderr
    res = otbuild(
        tmp_path, "ingest", "harbor-job", str(harbor_jobs["oracle"]), "--out", "oracle", "--benchmark", "synthetic"
    )
    assert res.returncode == 0, res.stderr
    summary = pq.read_table(tmp_path / "oracle" / "summary.parquet").to_pylist()
    assert len(summary) == 1 and summary[0]["mean"] == 1.0 and summary[0]["n_tasks"] == N_TASKS
    scores = pq.read_table(tmp_path / "t2" / "scores.parquet").to_pylist()
    assert len(scores) == N_TASKS and all(s["reward"] == 0.0 for s in scores)
    assert otbuild(tmp_path, "ingest", "harbor-job", str(tmp_path)).returncode == 2


@needs_harbor
@pytest.mark.slow
def test_rollouts_through_harbor_in_a_real_build(project):
    (project / "recipes" / "hb.yaml").write_text(
        "sources:\n  synth: {kind: synthetic, count: 2, seed: 21}\n"
        "teacher: {engine: oracle, samples_per_task: 2, sandbox: harbor, harbor: {environment: otbuild}}\n"
        "trace_filter: {min_turns: 1}\n"
    )
    ran, _ = snakemake(project, "hb")
    assert ran["rollout"] == 1 and ran["rollout_merge"] == 1
    traces = pq.read_table(project / "results" / "hb" / "teacher" / "traces.parquet").to_pylist()
    assert [(t["sample_idx"], t["reward"], t["agent"]) for t in traces] == [(0, 1.0, "oracle"), (1, 1.0, "oracle")] * 2
    assert all(t["source"] == "synth" and t["task_id"] for t in traces)


# -- a trace is what the model said, on both paths -----------------------------------------
SERVED = [  # a terminus-2 session: a command, a parse error, done, confirmed
    json.dumps(
        {
            "analysis": "Look first.",
            "plan": "List the files.",
            "commands": [{"keystrokes": "ls -la\n", "duration": 0.1}],
            "task_complete": False,
        }
    ),
    "I think the answer is {not json",
    json.dumps({"analysis": "Done.", "plan": "", "commands": [], "task_complete": True}, indent=2),
    json.dumps({"analysis": "Sure.", "plan": "", "commands": [], "task_complete": True}),
]
KEY = "sk-lab-0123456789abcdef"  # the lab's key: it must reach the endpoint and no file


def terminus2_endpoint(reasoning: str | None = None):
    """An OpenAI-compatible stand-in speaking terminus-2's JSON protocol: the answer for the
    conversation's turn (so trials may interleave), with the reasoning parser's text beside it."""

    def reply(body):
        turn = sum(m["role"] == "assistant" for m in body["messages"])
        text = SERVED[min(turn, len(SERVED) - 1)]
        message = {"role": "assistant", "content": text, **({"reasoning_content": reasoning} if reasoning else {})}
        return 200, {
            "id": f"chatcmpl-{turn}",
            "object": "chat.completion",
            "created": 1,
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 20, "total_tokens": 70},
        }

    return reply


def _served_turns(requests, reasoning):
    """What the endpoint answered, per request, as a trace's assistant turn holds it."""
    texts = [
        SERVED[min(sum(m["role"] == "assistant" for m in r["body"]["messages"]), len(SERVED) - 1)] for r in requests
    ]
    return [f"<think>{reasoning}</think>\n{t}" if reasoning else t for t in texts]


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", ["bwrap", pytest.param("harbor", marks=needs_harbor)])
def test_every_assistant_turn_is_what_the_endpoint_served(tmp_path, scripted, monkeypatch, sandbox):
    """otbuild's harness and Harbor's terminus-2 (raw content, linear history) give the same
    assistant turns: the endpoint's answers byte for byte, reasoning before them, parse errors
    included. The lab's key (api_key_env) reaches the endpoint on both paths and is written
    into no job config, log or trace."""
    reasoning = "The task wants a listing."
    srv = scripted(terminus2_endpoint(reasoning), api_key=KEY)  # 401 without the lab's key
    monkeypatch.setenv("LAB_LLM_KEY", KEY)
    tasks = tmp_path / "tasks.parquet"
    write_tasks(tasks, generate(2, seed=5), source="synth")
    settings = RolloutSettings(
        engine="openai",
        base_url=srv.base_url,
        model="m",
        api_key_env="LAB_LLM_KEY",
        max_episodes=6,
        sandbox=sandbox,
        harbor={"environment": "otbuild"},
    )
    from otbuild.progress import LOG_ENV, Watcher, describe_log
    from otbuild.stages.rollout import run_shard

    out = tmp_path / "rollout"
    monkeypatch.chdir(tmp_path)  # the run's console: a Harbor shard's trials done (seconds of
    monkeypatch.setenv(LOG_ENV, log := f"logs/rollout/{'ab' * 8}/0-of-1.log")  # Harbor's start;
    console: list[str] = []  # otbuild's own shard can end before a first look: test_workflow's smoke build)
    watcher = Watcher(tmp_path, lambda p: describe_log(p, lambda s, i: "teacher"), console.append, every=0.05).start()
    run_shard(settings, [tasks], out, 0)
    watcher.stop()
    if sandbox == "harbor":
        assert console and console[0].startswith("otbuild: teacher, shard 1 of 1: trials 0/2 (0%)")
        assert console[0].endswith(f"follow it: tail -f {log}")
    assert not list((tmp_path / ".otbuild").rglob("*.json"))  # every status file removed at the end
    rows = pq.read_table(out / "shards" / "0-of-1.parquet").to_pylist()
    assert len(rows) == 2 and all(r["exception"] is None for r in rows), [r["result"] for r in rows]
    turns = [m["content"] for r in rows for m in r["conversations"] if m["role"] == "assistant"]
    expected = [f"<think>{reasoning}</think>\n{t}" for t in SERVED]
    served = [r for r in srv.requests if "Reply with the single word OK." not in json.dumps(r["body"])]
    assert sorted(turns) == sorted(_served_turns(served, reasoning)) == sorted(expected * 2)
    for r in rows:
        assert [m["content"] for m in r["conversations"] if m["role"] == "assistant"] == expected
        assert r["n_turns"] == 4 and r["episode"] == "episode-3"
    assert all(
        {k.lower(): v for k, v in r["headers"].items()}["authorization"] == f"Bearer {KEY}" for r in srv.requests
    )
    if sandbox == "harbor":
        assert "Reply with the single word OK." in json.dumps(srv.requests[0]["body"])  # the probe went first
    calls = pq.read_table(out / "shards" / "0-of-1.calls.parquet").to_pylist()  # the capture proxy's record
    assert len(calls) == len(served) == 8 and all(c["status"] == 200 for c in calls)
    assert sorted(f"<think>{c['reasoning']}</think>\n{c['content']}" for c in calls) == sorted(expected * 2)
    if sandbox == "harbor":  # Harbor's agents call the proxy themselves: its job names their calls
        assert {c["scope"] for c in calls} == {"attempts-1"} and {c["trial"] for c in calls} == {None}
    else:
        assert all(c["harness_agrees"] for c in calls) and {c["trial"] for c in calls} == {0, 1}
    leaks = [p for p in tmp_path.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]
    assert not leaks, leaks


def test_harbor_jobs_record_raw_content_and_name_the_key_variable(tmp_path):
    cfg = job_config(
        tmp_path,
        tmp_path,
        "j",
        agent="terminus-2",
        model="openai/m",
        api_key_env="LAB_LLM_KEY",
        agent_kwargs={"trajectory_config": {"linear_history": False}},
    )
    [agent] = cfg["agents"]
    assert agent["kwargs"]["trajectory_config"] == {"raw_content": True, "linear_history": False}
    assert agent["model_api_key_name"] == "LAB_LLM_KEY"
    assert job_config(tmp_path, tmp_path, "j", agent="terminus-2", model="openai/m")["agents"][0]["kwargs"][
        "trajectory_config"
    ] == {"raw_content": True, "linear_history": True}
    with pytest.raises(ValueError, match="raw_content"):
        job_config(
            tmp_path,
            tmp_path,
            "j",
            agent="terminus-2",
            model="openai/m",
            agent_kwargs={"trajectory_config": {"raw_content": False}},
        )
    from otbuild.harbor.job import harbor_env

    with pytest.raises(ValueError, match="LAB_LLM_KEY"):
        harbor_env({}, api_key_env="LAB_LLM_KEY")
    assert "OPENAI_API_KEY" not in harbor_env({"LAB_LLM_KEY": "k"}, api_key_env="LAB_LLM_KEY")


def test_harbor_gets_only_the_environment_the_recipe_names():
    """Issue 44 (2): Harbor fills a task's `${VAR}` from its own environment, so it gets none of
    otbuild's secrets: only paths and locale (HARBOR_BASE_ENV), the recipe's host_env and the key
    variable it names."""
    from otbuild.harbor.job import harbor_env

    host = {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "LC_ALL": "C",
        "HF_TOKEN": "hf_x",
        "AWS_SECRET_ACCESS_KEY": "a",
        "LAB_LLM_KEY": "k",
        "DAYTONA_API_KEY": "d",
        "OPENAI_API_KEY": "sk-host",
    }
    env = harbor_env(host, api_key_env="LAB_LLM_KEY", host_env=["DAYTONA_API_KEY"])
    assert set(env) == {"PATH", "HOME", "LC_ALL", "LAB_LLM_KEY", "DAYTONA_API_KEY", "LITELLM_LOCAL_MODEL_COST_MAP"}
    assert harbor_env(host)["OPENAI_API_KEY"] == "otbuild-local"  # never the host's own key unnamed


def test_a_linear_history_trial_is_its_last_context_window(tmp_path):
    """terminus-2 with linear_history writes one file per context window; the row is the last
    one (what the model saw when it answered last: the handed-over context, then its turns),
    as Harbor's `traces export --episodes last` gives it; episodes count every file's own."""
    job = tmp_path / "job"
    first = [
        {"source": "system", "message": "Task: count."},
        {"source": "agent", "message": "A1", "observation": {"results": [{"content": "o1"}]}},
        {"source": "agent", "message": "A2", "observation": {"results": [{"content": "o2"}]}},
    ]
    cont = [
        {"source": "user", "message": "Task: count.", "is_copied_context": True},
        {"source": "user", "message": "Summary: counted to 2.", "is_copied_context": True},
        {
            "source": "agent",
            "message": "A3",
            "reasoning_content": "r3",
            "observation": {"results": [{"content": "o3"}]},
        },
    ]
    trial = _trial(job, "t__1", "t", first)
    data = json.loads((trial / "agent" / "trajectory.json").read_text())
    data["continued_trajectory_ref"] = "trajectory.cont-0.json"  # as Harbor 0.26 writes it: one short
    (trial / "agent" / "trajectory.json").write_text(json.dumps(data))
    (trial / "agent" / "trajectory.cont-1.json").write_text(json.dumps({"steps": cont}))
    row = ingest.read_trial(trial)
    assert row["conversations"] == [
        {"role": "user", "content": "Task: count."},
        {"role": "user", "content": "Summary: counted to 2."},
        {"role": "assistant", "content": "<think>r3</think>\nA3"},
    ]
    assert row["episode"] == "episode-2" and row["n_turns"] == 1
    assert json.loads(row["metadata"])["trajectories"] == ["trajectory.json", "trajectory.cont-1.json"]


# -- Harbor's trace export, imported -------------------------------------------------------
def _export_rows(trial: str, episodes: int, result: str, **extra) -> list[dict]:
    conv = [{"role": "user", "content": "Solve it."}]
    rows = []
    for e in range(episodes):
        conv = conv + [{"role": "assistant", "content": f"answer {e}"}]
        rows.append(
            {
                "conversations": list(conv),
                "agent": "terminus-2",
                "model": "glm",
                "model_provider": "hosted_vllm",
                "date": "2026-01-01T00:00:00Z",
                "task": "t1",
                "episode": f"episode-{e}",
                "run_id": "job",
                "trial_name": trial,
                "result": result,
                **extra,
            }
        )
        conv = conv + [{"role": "user", "content": f"output {e}"}]
    return rows


def test_harbor_trace_export_rows_import_by_trial(tmp_path):
    """One row per trial (its last episode) across shard files, or every row; the result text
    to reward or exception; subagent rows marked; a ShareGPT-only export read too."""
    from otbuild.traces.imports import read_traces

    rows = (
        _export_rows("t1__a", 3, "1.0", trace_source="main")
        + _export_rows("t1__b", 2, "AgentTimeoutError")
        + _export_rows("t1__c", 1, "InternalServerError")
        + [{**_export_rows("t1__a", 1, "1.0")[0], "trace_source": "summarization-1-summary"}]
    )
    pq.write_table(pa.Table.from_pylist(rows[:2]), tmp_path / "train-00000-of-00002.parquet")
    pq.write_table(pa.Table.from_pylist(rows[2:]), tmp_path / "train-00001-of-00002.parquet")
    last = list(read_traces(trace_import("harbor-traces", tmp_path)))
    assert [(r["trial_name"], r["episode"], r["is_subagent"]) for r in last] == [
        ("t1__a", "episode-2", False),
        ("t1__b", "episode-1", False),
        ("t1__c", "episode-0", False),
        ("t1__a", "episode-0", True),
    ]
    a, b, c, _ = last
    assert a["conversations"] == rows[2]["conversations"] and a["n_turns"] == 3
    assert (a["reward"], a["result"], a["exception"], a["timed_out"]) == (1.0, "1.0", None, False)
    assert (b["reward"], b["exception"], b["timed_out"]) == (None, None, True)
    assert (c["exception"], c["result"]) == ("InternalServerError", "InternalServerError")
    assert a["source"] == "import:harbor-traces" and a["teacher"] == "terminus-2:glm"
    assert len(list(read_traces(trace_import("harbor-traces", tmp_path, episodes="all")))) == len(rows)
    sharegpt = tmp_path / "sg" / "data.jsonl"
    sharegpt.parent.mkdir()
    sharegpt.write_text(
        json.dumps(
            {
                "conversations_sharegpt": [{"from": "human", "value": "Do."}, {"from": "gpt", "value": "Done."}],
                "trial_name": "x",
                "episode": "episode-0",
                "result": "0.0",
            }
        )
        + "\n"
    )
    [row] = read_traces(trace_import("harbor-traces", sharegpt))
    assert row["conversations"] == [{"role": "user", "content": "Do."}, {"role": "assistant", "content": "Done."}]
    assert row["reward"] == 0.0


@needs_harbor
@pytest.mark.slow
def test_harbors_own_trace_export_imports_to_what_the_job_ingest_gives(tmp_path, scripted):
    """Round trip: a real terminus-2 job (against a terminus-2 speaking endpoint), exported by
    Harbor's own `export_traces` (what `harbor traces export` publishes, every episode), imports
    to the rows otbuild's job ingest gives: one per trial, the same conversation and outcome."""
    from otbuild.traces.imports import read_traces

    srv = scripted(terminus2_endpoint("Thinking."))
    tasks = tmp_path / "tasks.parquet"
    write_tasks(tasks, generate(2, seed=6), source="synth")
    job = run_harbor_job(
        tasks,
        tmp_path,
        agent="terminus-2",
        model="openai/m",
        base_url=srv.base_url,
        job_name="t2",
        n_attempts=2,
        timeout_sec=300,
        agent_kwargs={"max_turns": 6},
    )
    export = tmp_path / "export.parquet"
    code = (
        "import sys; from harbor.utils.traces_utils import export_traces; "
        "ds = export_traces(sys.argv[1], episodes='all', to_sharegpt=True, use_rich_progress=False); "
        "ds.to_parquet(sys.argv[2])"
    )
    res = subprocess.run(
        [str(HARBOR.parent / "python"), "-c", code, str(job), str(export)], capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stderr[-2000:]
    imported = {r["trial_name"]: r for r in read_traces(trace_import("harbor-traces", export))}
    ingested = {r["trial_name"]: r for r in ingest.read_job(job)}
    assert len(imported) == 4 and set(imported) == set(ingested)
    for name, row in imported.items():
        mine = ingested[name]
        assert row["conversations"] == mine["conversations"] and mine["n_turns"] == 4, name
        assert (row["result"], row["reward"], row["exception"], row["timed_out"], row["episode"]) == (
            mine["result"],
            mine["reward"],
            mine["exception"],
            mine["timed_out"],
            mine["episode"],
        )
    assert pq.read_table(export).num_rows == 4 * 4  # every episode exported; one per trial kept


def test_an_export_row_without_the_task_is_quarantined(tmp_path):
    """A trajectory that opens with an answer (Harbor's "Technical difficulties" placeholder
    step) has no task text in Harbor's export: the import quarantines it, naming the trial."""
    from otbuild.traces.imports import read_traces

    row = {**_export_rows("t1__a", 1, "0.0")[0]}
    row["conversations"] = [
        {"role": "assistant", "content": "Technical difficulties. Please continue with the task."},
        {"role": "user", "content": "output"},
        {"role": "assistant", "content": "ls"},
    ]
    pq.write_table(pa.Table.from_pylist([row]), tmp_path / "x.parquet")
    [q] = read_traces(trace_import("harbor-traces", tmp_path / "x.parquet"))
    assert isinstance(q, Quarantined) and q.name == "t1__a" and q.reason == "no user message before the first answer"
    pq.write_table(pa.Table.from_pylist([{**row, "instruction": "Fix it."}]), tmp_path / "y.parquet")
    [ok] = read_traces(trace_import("harbor-traces", tmp_path / "y.parquet"))
    assert ok["conversations"][0] == {"role": "user", "content": "Fix it."}


@pytest.mark.parametrize("recipe", ["otagent_v2_100k", "otagent_v2_10k"])
def test_the_paper_teachers_harbor_jobs_are_openthoughts_agents_trace_configs(tmp_path, recipe):
    """The paper recipes' teacher runs terminus-2 as OpenThoughts-Agent's trace-generation
    configs do (raw content, linear history, interleaved thinking, proactive summarization at
    8,192 free tokens, thinking on, a 1,800 s agent timeout, no verifier), with the served model's context
    for summarizing; Harbor's own models accept the job config and the agent's options."""
    from otbuild.plan import plan_recipe
    from otbuild.recipe.load import load_recipe
    from otbuild.stagekit.harbor_trials import harbor_options
    from tests.conftest import REPO

    [node] = [n for n in plan_recipe(load_recipe(recipe, REPO)).nodes if n.stage == "rollout"]
    cfg = job_config(tmp_path, tmp_path / "jobs", "j", model="openai/glm", **harbor_options(node.config))
    [agent] = cfg["agents"]
    kw = agent["kwargs"]
    assert kw["trajectory_config"] == {"raw_content": True, "linear_history": True}
    assert kw["interleaved_thinking"] is True and kw["proactive_summarization_threshold"] == 8192
    assert kw["llm_call_kwargs"]["extra_body"] == {"chat_template_kwargs": {"enable_thinking": True}}
    assert kw["model_info"]["max_input_tokens"] == node.config.launch.max_model_len
    assert agent["override_timeout_sec"] == 1800
    assert cfg["verifier"]["disable"] is True  # trace generation without the verifier (teacher.verify)
    if HARBOR.is_file():
        code = (
            "import json,sys; from harbor.models.job.config import JobConfig; "
            "from harbor.agents.terminus_2.terminus_2 import Terminus2; "
            "c = JobConfig.model_validate(json.load(open(sys.argv[1]))); "
            "o = Terminus2.parse_options(c.agents[0].kwargs, {}); "
            "print(o.interleaved_thinking, o.proactive_summarization_threshold, c.verifier.disable, "
            "o.trajectory_config)"
        )
        path = write_job_config(tmp_path / "job.json", cfg)
        res = subprocess.run(
            [str(HARBOR.parent / "python"), "-c", code, str(path)], capture_output=True, text=True, check=False
        )
        assert res.returncode == 0, res.stderr[-2000:]
        assert res.stdout.split()[:3] == ["True", "8192", "True"] and "raw_content" in res.stdout


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", ["bwrap", pytest.param("harbor", marks=needs_harbor)])
def test_a_wrong_key_fails_the_rollout_naming_the_401(tmp_path, scripted, monkeypatch, sandbox):
    """With a key the endpoint refuses, the shard's first request goes alone and fails it with
    the API's message, on both paths: one request, no trial recorded, no Harbor job run."""
    from otbuild.engines.endpoint import EndpointError
    from otbuild.stages.rollout import run_shard

    srv = scripted(terminus2_endpoint(), api_key=KEY)
    monkeypatch.setenv("LAB_LLM_KEY", "sk-wrong")
    tasks = tmp_path / "tasks.parquet"
    write_tasks(tasks, generate(3, seed=5), source="synth")
    settings = RolloutSettings(
        engine="openai",
        base_url=srv.base_url,
        model="m",
        api_key_env="LAB_LLM_KEY",
        sandbox=sandbox,
        harbor={"environment": "otbuild"},
    )
    with pytest.raises(EndpointError, match="401.*Incorrect API key"):
        run_shard(settings, [tasks], tmp_path / "rollout", 0)
    assert len(srv.requests) == 1
    assert not (tmp_path / "rollout" / "harbor" / "shard-0-of-1" / "jobs").exists()


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", ["bwrap", pytest.param("harbor", marks=needs_harbor)])
def test_a_teacher_without_the_verifier_leaves_each_reward_unknown(tmp_path, sandbox):
    """teacher.verify: false (OpenThoughts-Agent's trace generation: `verifier.disable`) on both
    paths: the agent runs, no verifier does, and each trace's reward is unknown (outcome
    `unverified`, the reason in its metadata), never a 0 or a 1; the same tasks verified pass."""
    import duckdb

    from otbuild.stagekit.failures import outcome_stats
    from otbuild.stages.rollout import run_shard
    from otbuild.traces.outcome import UNVERIFIED, UNVERIFIED_REASON

    tasks = tmp_path / "tasks.parquet"
    write_tasks(tasks, generate(2, seed=3), source="synth")
    outcomes = {}
    for verify in (False, True):
        settings = RolloutSettings(engine="oracle", sandbox=sandbox, verify=verify, harbor={"environment": "otbuild"})
        out = tmp_path / f"verify-{verify}"
        run_shard(settings, [tasks], out, 0)
        shard = out / "shards" / "0-of-1.parquet"
        rows = pq.read_table(shard).to_pylist()
        assert len(rows) == 2 and all(r["n_turns"] >= 1 and r["exception"] is None for r in rows)
        outcomes[verify] = outcome_stats(duckdb.connect(), shard)["outcomes"]
        metas = [json.loads(r["metadata"]) for r in rows]
        if verify:
            assert [r["reward"] for r in rows] == [1.0, 1.0]
            assert not any("unverified_reason" in m for m in metas)
            continue
        assert [(r["reward"], r["result"]) for r in rows] == [(None, "")] * 2
        assert [m["unverified_reason"] for m in metas] == [UNVERIFIED_REASON] * 2
        if sandbox == "harbor":  # Harbor's own record: no verifier ran
            results = [json.loads(p.read_text()) for p in out.rglob("attempts-*/*/result.json")]
            assert len(results) == 2 and all(r.get("verifier_result") is None for r in results)
        else:
            assert all(m["verifier_timeout_sec"] == 0 for m in metas)
    assert outcomes == {False: {UNVERIFIED: 2}, True: {"passed": 2}}


def two_step_task(strategy: str, min_reward: float | None = None):
    """A Harbor multi-step task: step `write` makes notes.txt (its own tests and solution);
    step `append` stages data.txt and setup.sh into the working dir, runs setup.sh, and is
    judged by the task's shared tests/test.sh, which fails it (`reward` 0) while saying in
    `kept` whether step one's file, the staged file and setup.sh's output are all there."""
    from otbuild.tasks.harbor_meta import harbor_record
    from otbuild.tasks.taskdir import TaskDir

    t = TaskDir(f"two-step-{strategy}")
    gate = f"min_reward = {min_reward}\n" if min_reward is not None else ""
    t.add(
        "task.toml",
        f'multi_step_reward_strategy = "{strategy}"\n[agent]\ntimeout_sec = 60.0\n'
        f'[[steps]]\nname = "write"\n{gate}[[steps]]\nname = "append"\n',
    )
    t.add("environment/Dockerfile", "FROM python:3.12-slim\nWORKDIR /app\n")
    t.add("steps/write/instruction.md", "Write the line `one` to notes.txt in the working directory.\n")
    t.add("steps/write/solution/solve.sh", "#!/bin/bash\necho one > notes.txt\n", executable=True)
    t.add(
        "steps/write/tests/test.sh",
        "#!/bin/bash\ngrep -qx one notes.txt && echo 1 > /logs/verifier/reward.txt"
        " || echo 0 > /logs/verifier/reward.txt\n",
        executable=True,
    )
    t.add("steps/append/instruction.md", "Append the lines of data.txt to notes.txt.\n")
    t.add("steps/append/workdir/data.txt", "two\n")
    t.add("steps/append/workdir/setup.sh", "#!/bin/bash\necho ready > setup.txt\n", executable=True)
    t.add("steps/append/solution/solve.sh", "#!/bin/bash\ncat data.txt >> notes.txt\n", executable=True)
    t.add(
        "tests/test.sh",
        '#!/bin/bash\nkept=0\n[ "$(cat notes.txt)" = "$(printf \'one\\ntwo\')" ] && '
        '[ -f setup.txt ] && kept=1\necho "{\\"reward\\": 0, \\"kept\\": $kept}" > /logs/verifier/reward.json\n',
        executable=True,
    )
    rec = harbor_record(t)
    assert rec.runnable_locally, rec
    return rec


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["mean", "final"])
@pytest.mark.parametrize(
    "sandbox",
    [
        "bwrap",
        pytest.param("harbor", marks=needs_harbor),
        pytest.param(
            "podman", marks=pytest.mark.skipif(backend_problem("podman") is not None, reason="podman unusable here")
        ),
    ],
)
def test_a_two_step_task_runs_its_steps_in_one_environment(tmp_path, sandbox, strategy):
    """A `[[steps]]` task on both paths: the steps run in order in one environment (step two
    sees step one's file, its staged workdir/ files and what its setup.sh made), each on its
    own instruction, tests and solution; the trial's reward follows multi_step_reward_strategy
    (mean of each key over the steps: (1 + 0) / 2; final: the last step's 0), and each step's
    reward and turns are kept in the trace's metadata, its conversation a slice of the trace's."""
    from otbuild.stages.rollout import run_shard

    tasks = tmp_path / "tasks.parquet"
    write_tasks(tasks, [two_step_task(strategy)], source="steps")
    run_shard(
        RolloutSettings(engine="oracle", sandbox=sandbox, harbor={"environment": "otbuild"}),
        [tasks],
        tmp_path / "rollout",
        0,
    )
    [row] = pq.read_table(tmp_path / "rollout" / "shards" / "0-of-1.parquet").to_pylist()
    assert row["exception"] is None, json.loads(row["metadata"]).get("exception_message")
    steps = json.loads(row["metadata"])["steps"]
    assert [(s["name"], s["reward"]) for s in steps] == [("write", 1.0), ("append", 0.0)]
    assert steps[1]["rewards"] == {"reward": 0, "kept": 1}  # one environment: step one's file, staged files, setup.sh
    assert row["reward"] == {"mean": 0.5, "final": 0.0}[strategy]
    conv = row["conversations"]
    assert [s["first_message"] for s in steps] == [0, steps[1]["first_message"]] and 0 < steps[1]["first_message"]
    first, second = conv[: steps[1]["first_message"]], conv[steps[1]["first_message"] :]
    assert "notes.txt in the working directory" in first[0]["content"] and "data.txt" not in first[0]["content"]
    assert "Append the lines of data.txt" in second[0]["content"]
    assert [s["n_turns"] for s in steps] == [count_turns(first), count_turns(second)]
    assert row["n_turns"] == count_turns(conv) == sum(s["n_turns"] for s in steps)
    assert "echo one > notes.txt" in json.dumps(first) and "cat data.txt >> notes.txt" in json.dumps(second)


@pytest.mark.slow
def test_a_step_below_its_min_reward_ends_the_trial(tmp_path):
    """`min_reward` on a step: a reward under it ends the trial after that step (Harbor's
    rule); the steps not run are not in the trace."""
    import asyncio

    from otbuild.harness.oracle import OracleEngine
    from otbuild.harness.config import TrialConfig
    from otbuild.harness.trial import run_trial
    from otbuild.settings.trials import Trials

    task = two_step_task("final", min_reward=2.0).task
    row = asyncio.run(run_trial(task, task.task_id(), OracleEngine(), TrialConfig(Trials(), "terminus2"), tmp_path))
    steps = json.loads(row["metadata"])["steps"]
    assert [(s["name"], s["reward"]) for s in steps] == [("write", 1.0)] and row["reward"] == 1.0
    assert "data.txt" not in json.dumps(row["conversations"])


@needs_harbor
@pytest.mark.slow
def test_nothing_the_agent_left_running_reaches_harbors_verifier(tmp_path):
    """Harbor's otbuild environment: the oracle's solve.sh leaves two daemons (`nohup ... &`,
    `setsid`) that keep writing 1 to /logs/verifier/reward.txt, and plants a file there; the
    verifier writes 0 and waits. Every agent process is gone before the verifier runs and its
    log folder is fresh: the reward is 0, the planted file is not in the trial's verifier logs,
    and no process of the trial survives the job."""
    import uuid

    from otbuild.sandbox.procs import scan

    mark = f"otb-daemon-{uuid.uuid4().hex[:12]}"
    task = tmp_path / "tasks" / "daemon"
    for d in ("environment", "solution", "tests"):
        (task / d).mkdir(parents=True)
    (task / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\n")
    (task / "instruction.md").write_text("Make the reward 1.\n")
    (task / "task.toml").write_text("[agent]\ntimeout_sec = 60.0\n[verifier]\ntimeout_sec = 60.0\n")
    (task / "solution" / "solve.sh").write_text(
        "#!/bin/bash\n"
        f"printf 'while true; do echo 1 > /logs/verifier/reward.txt; sleep 0.05; done\\n' > /tmp/{mark}.sh\n"
        f"nohup bash /tmp/{mark}.sh >/dev/null 2>&1 </dev/null &\n"
        f"setsid bash /tmp/{mark}.sh >/dev/null 2>&1 </dev/null &\n"
        "echo planted > /logs/verifier/planted.txt\n"
        "sleep 0.3\n"
    )
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\nls /logs/verifier\necho 0 > /logs/verifier/reward.txt\nsleep 1\n"
    )
    for f in (task / "solution" / "solve.sh", task / "tests" / "test.sh"):
        f.chmod(0o755)
    try:
        job = run_harbor_job(tmp_path / "tasks", tmp_path, agent="oracle", job_name="daemon", timeout_sec=300)
        [row] = ingest.read_job(job)
        assert row["exception"] is None, json.loads(row["metadata"]).get("exception_message")
        assert row["reward"] == 0.0, row["result"]
        [trial] = ingest.trial_dirs(job)
        assert not (trial / "verifier" / "planted.txt").exists()
        assert (trial / "verifier" / "reward.txt").read_text().strip() == "0"
    finally:
        left = {pid for pid, (_, args) in scan().items() if any(mark in a for a in args)}
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
    assert not left, f"processes of the trial survived: {left}"


def _asks_for(name: str, table: str, value: str):
    """A synthetic task whose task.toml `[table].env` asks for `value` (a `${VAR}` template)."""
    from otbuild.tasks.harbor_meta import harbor_record

    [rec] = list(generate(1, seed=5))
    task = rec.task
    task.name = name
    task.add("task.toml", f'[{table}.env]\nT = "{value}"\n')
    return harbor_record(task)


@pytest.mark.parametrize("table", ["environment", "verifier", "solution"])
def test_under_harbor_a_task_asking_for_a_host_secret_the_recipe_does_not_allow_is_not_run(
    tmp_path, monkeypatch, table
):
    """sandbox: harbor: a task.toml `${HF_TOKEN}` the recipe's host_env does not name is never
    handed to Harbor (which would fill it from its own environment, or fail the trial with its
    own error): its row is `HostEnvNotAllowed`, outcome not_run, as under otbuild's harness; no
    Harbor job runs for a shard of such tasks alone."""
    from otbuild.stages.rollout import run_shard
    from otbuild.traces.outcome import NOT_RUN, outcome

    monkeypatch.setenv("HF_TOKEN", "hf_" + "s3cr3t" * 6)
    tasks = tmp_path / "tasks.parquet"
    write_tasks(tasks, [_asks_for("wants-a-secret", table, "${HF_TOKEN:-none}")], source="synth")
    run_shard(
        RolloutSettings(engine="oracle", sandbox="harbor", samples_per_task=2, host_env=("OTHER",)),
        [tasks],
        tmp_path / "rollout",
        0,
    )
    rows = pq.read_table(tmp_path / "rollout" / "shards" / "0-of-1.parquet").to_pylist()
    assert len(rows) == 2 and [r["sample_idx"] for r in rows] == [0, 1]
    for r in rows:
        assert r["exception"] == r["result"] == "HostEnvNotAllowed" and outcome(r) == NOT_RUN, r
        assert r["conversations"] == [] and r["reward"] is None and r["task"] == "wants-a-secret"
        assert f"[{table}].env T: HF_TOKEN" in json.loads(r["metadata"])["exception_message"]
        assert "s3cr3t" not in json.dumps(r)
    assert not list((tmp_path / "rollout").rglob("jobs"))  # nothing was handed to Harbor


@needs_harbor
@pytest.mark.slow
def test_under_harbor_only_the_tasks_asking_for_no_disallowed_variable_run(tmp_path):
    """A shard of a task without a default (`${OTB_NOT_SET}`: Harbor would fail its trial), one the
    recipe allows (`${OTB_ALLOWED:-x}`) and a plain one: the first is not run, the others run
    in Harbor's job, each row in the shard's trial order."""
    from otbuild.stages.rollout import run_shard

    tasks = tmp_path / "tasks.parquet"
    write_tasks(
        tasks,
        [
            _asks_for("refused", "verifier", "${OTB_NOT_SET}"),
            _asks_for("allowed", "verifier", "${OTB_ALLOWED:-x}"),
            *generate(1, seed=6),
        ],
        source="synth",
    )
    run_shard(
        RolloutSettings(
            engine="oracle", sandbox="harbor", host_env=("OTB_ALLOWED",), harbor={"environment": "otbuild"}
        ),
        [tasks],
        tmp_path / "rollout",
        0,
    )
    rows = pq.read_table(tmp_path / "rollout" / "shards" / "0-of-1.parquet").to_pylist()
    assert [r["exception"] for r in rows] == ["HostEnvNotAllowed", None, None]
    assert [r["reward"] for r in rows] == [None, 1.0, 1.0]
    assert rows[0]["task"] == "refused" and rows[1]["task"] == "allowed"
    assert "OTB_NOT_SET" in json.loads(rows[0]["metadata"])["exception_message"]
    trials = [p.parent.name for p in (tmp_path / "rollout").rglob("jobs/*/*/result.json")]
    assert len(trials) == 2 and not any(t.startswith("refused") for t in trials)
