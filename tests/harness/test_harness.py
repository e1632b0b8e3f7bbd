"""The terminus-2 harness: protocol, terminal, oracle replay, trials, resumable rollout shards."""

import asyncio
import json
import re
import subprocess
import time

import pyarrow.parquet as pq
import pytest

from otbuild.engines import ENGINES, LLM, Completion, EngineError, make_engine
from otbuild.harness.oracle import OracleEngine
from otbuild.harness import protocol
from otbuild.harness.oracle_steps import split_commands
from otbuild.harness.terminal import SHELL_ENV, Terminal
from otbuild.harness.config import TrialConfig
from otbuild.harness.trial import run_trial
from otbuild.settings.trials import Trials
from otbuild.sandbox import backend_problem
from otbuild.sources.synthetic import generate
from otbuild.stages.rollout import run_shard
from otbuild.stagekit.trials import plan_trials
from otbuild.settings.stages import RolloutSettings
from otbuild.tasks.table import write_tasks
from otbuild.tasks.taskdir import TaskDir
from tests.conftest import DATA, REPO, chat_answer, source
from tests.support.killed_shard import kill_after, shard_command

needs_sandbox = pytest.mark.skipif(backend_problem("bwrap") is not None, reason="bubblewrap unusable here")


def answer(*commands, complete=False, duration=5.0):
    return json.dumps(
        {
            "analysis": "a",
            "plan": "p",
            "task_complete": complete,
            "commands": [{"keystrokes": c, "duration": duration} for c in commands],
        }
    )


class ScriptedEngine:
    """A stand-in model with fixed answers, to drive the protocol deterministically."""

    name, provider, model = "scripted", "test", "scripted"

    def __init__(self, answers):
        self.answers = list(answers)
        self.seen = []

    async def complete(self, messages, **_):
        self.seen.append([dict(m) for m in messages])
        item = self.answers.pop(0) if self.answers else answer(complete=True)
        if isinstance(item, Exception):
            raise item
        return Completion(item, 100, 10, "stop")

    async def aclose(self):
        pass


# -- protocol -------------------------------------------------------------------------------
def test_parse_answer_tolerates_fences_and_caps_duration():
    a = protocol.parse_answer(
        'Sure!\n```json\n{"analysis": "x", "plan": "y", "commands": '
        '[{"keystrokes": "ls\\n", "duration": 500}], "task_complete": "true"}\n```'
    )
    assert a.commands[0].keystrokes == "ls\n" and a.commands[0].duration == 60.0 and a.task_complete
    with pytest.raises(protocol.ParseError, match="no JSON object"):
        protocol.parse_answer("I will now run ls")
    with pytest.raises(protocol.ParseError, match="keystrokes"):
        protocol.parse_answer('{"commands": [{"duration": 1}]}')


def test_observation_cap_keeps_head_and_tail():
    text = "HEAD" + "x" * 50_000 + "TAIL"
    capped = protocol.cap_output(text)
    assert len(capped.encode()) < 10_200 and capped.startswith("HEAD") and capped.endswith("TAIL")
    assert "interior bytes omitted" in capped
    assert protocol.cap_output("short") == "short"


def test_oracle_steps_keep_multiline_commands_whole():
    script = (
        "#!/bin/bash\nset -euo pipefail\n# c\ncd /app\ncat > a.py <<'EOF'\nprint(1)\n\nEOF\n"
        "for i in 1 2; do\n  echo $i\ndone\necho a \\\n  b\nexit 0\n"
    )
    assert split_commands(script) == [
        "cd /app",
        "cat > a.py <<'EOF'\nprint(1)\n\nEOF",
        "for i in 1 2; do\n  echo $i\ndone",
        "echo a \\\n  b",
    ]


# -- terminal -------------------------------------------------------------------------------
def test_terminal_keys_and_early_return(tmp_path):
    """C-c interrupts the agent's command even when otbuild itself ignores SIGINT (started
    under nohup, or in the background of a script): the terminal starts with it at its default."""
    import signal

    env = [f"{k}={v}" for k, v in SHELL_ENV.items()]
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited by every child from here
    try:
        term = Terminal(["env", "-i", "PATH=/usr/bin:/bin", *env, "bash", "--noprofile", "--norc", "-i"])
    finally:
        signal.signal(signal.SIGINT, before)
    try:
        term.read(2)
        t = time.monotonic()
        term.send("echo $((6*7))\n")
        assert "42" in term.read(30)
        assert time.monotonic() - t < 5  # returned when the prompt came back, not after 30 s
        term.send("sleep 100\n")
        assert "42" not in term.read(0.3)
        term.send("C-c")  # a lone key name sends the key: sleep is interrupted at once
        assert term.read(20).endswith("# ")  # the prompt is back (read returns as soon as it is)
        term.send("echo $((1+2))after\n")
        assert "3after" in term.read(5)
    finally:
        term.close()


def _terminus2_trace() -> list[dict]:
    t2 = protocol.Terminus2
    ans = [
        t2.format_answer(
            {
                "analysis": "The dir is there. Nothing moved yet.",
                "plan": "Move the files. Then stop.",
                "commands": [{"keystrokes": "mv a/*.txt b/\n", "duration": 1.0}],
                "task_complete": False,
            }
        ),
        t2.format_answer({"analysis": "Done.", "plan": "Finish.", "commands": [], "task_complete": True}),
    ]
    return [
        {"role": "user", "content": t2.first_prompt("Move the .txt files from a to b.", "root@box:/app# ")},
        {"role": "assistant", "content": ans[0]},
        {"role": "user", "content": t2.observation_reply("mv a/*.txt b/\nroot@box:/app# ")},
        {"role": "assistant", "content": "not json"},
        {"role": "user", "content": t2.parse_error_reply(protocol.ParseError("no JSON object found"))},
        {"role": "assistant", "content": ans[1]},
        {"role": "user", "content": t2.confirm_reply("root@box:/app# ")},
        {"role": "assistant", "content": ans[1]},
    ]


def test_compact_style_is_short_and_keeps_the_task():
    full = protocol.Terminus2.first_prompt("Move the .txt files from a to b.", "root@box:/app# ")
    short = protocol.Compact.first_prompt("Move the .txt files from a to b.", "root@box:/app# ")
    assert len(short) * 4 < len(full)
    assert "Move the .txt files from a to b." in short and short.rstrip().endswith("root@box:/app#")
    text = protocol.Compact.format_answer({"analysis": "", "plan": "p", "commands": [], "task_complete": True})
    assert "\n" not in text and protocol.parse_answer(text).task_complete
    with pytest.raises(ValueError, match="unknown prompt style 'short'"):
        protocol.prompt_style("short")


HARBOR_TEMPLATES = sorted(REPO.glob(".venv-harbor/lib/python3*/site-packages/harbor/agents/terminus_2/templates"))


@pytest.mark.skipif(not HARBOR_TEMPLATES, reason="Harbor is not installed in .venv-harbor: run scripts/harbor-env.sh")
def test_terminus2_texts_are_otbuilds_own_words_not_harbors():
    """The protocol (keys, their meaning) is a format; the prose is not ours to copy: no
    sentence of Harbor's terminus-2 prompt appears in what otbuild's harness sends."""
    t2 = protocol.Terminus2
    ours = "\n".join(
        [
            t2.first_prompt("Do X.", "$ "),
            t2.parse_error_reply(ValueError("e")),
            t2.confirm_reply("$ "),
            t2.observation_reply("$ "),
        ]
    )
    ours = " ".join(ours.split())
    harbor = (HARBOR_TEMPLATES[-1] / "terminus-json-plain.txt").read_text()
    sentences = [" ".join(s.split()) for s in re.split(r"(?<=[.?!:])\s|\n", harbor)]
    prose = [s for s in sentences if len(s.split()) >= 5 and not s.startswith(('"', "{"))]
    assert len(prose) > 20  # the template was read
    assert [s for s in prose if s in ours] == []


def test_compact_conversation_reads_harbor_worded_terminus2_traces():
    """Traces Harbor ran (or exported) carry Harbor's terminus-2 texts; compacting them works
    as for otbuild's own."""
    harbor_worded = [
        {
            "role": "user",
            "content": "(Harbor's instructions)\n\nTask Description:\nDo X.\n\nCurrent terminal state:\n$ \n",
        },
        {"role": "user", "content": "Previous response had parsing errors:\nERROR: bad\n\nPlease fix."},
        {"role": "user", "content": "Current terminal state:\n$ \n\nAre you sure you want to stop?"},
    ]
    got = protocol.compact_conversation(harbor_worded)
    assert [m["content"] for m in got] == [
        protocol.Compact.first_prompt("Do X.", "$ "),
        protocol.Compact.parse_error_reply("bad"),
        protocol.Compact.confirm_reply("$ "),
    ]


def test_compact_conversation_rewrites_a_terminus2_trace():
    conv = _terminus2_trace()
    got = protocol.compact_conversation(conv)
    assert [m["role"] for m in got] == [m["role"] for m in conv]
    assert got[0]["content"] == protocol.Compact.first_prompt("Move the .txt files from a to b.", "root@box:/app# ")
    first = protocol.parse_answer(got[1]["content"])
    assert got[1]["content"].startswith('{"analysis":"The dir is there."') and "\n  " not in got[1]["content"]
    assert (first.plan, first.commands[0].keystrokes) == ("Move the files.", "mv a/*.txt b/\n")
    assert got[2]["content"] == protocol.Compact.observation_reply("mv a/*.txt b/\nroot@box:/app# ")
    assert got[3]["content"] == "not json"  # what the model said is kept when it does not parse
    assert got[4]["content"] == protocol.Compact.parse_error_reply("no JSON object found")
    assert got[6]["content"] == protocol.Compact.confirm_reply("root@box:/app# ")
    assert sum(len(m["content"]) for m in got) * 2.5 < sum(len(m["content"]) for m in conv)
    assert protocol.compact_conversation(got) == got  # a compact trace stays as it is


@needs_sandbox
def test_compact_oracle_trial_and_partial_credit(tmp_path):
    rec = next(generate(1, 11, ["files"], [1]))
    trace = _trial(rec.task, OracleEngine(), tmp_path, prompt="compact")
    conv = trace["conversations"]
    assert trace["reward"] == 1.0 and conv[0]["content"].startswith("Solve the task in a Linux shell.")
    assert all("\n  " not in m["content"] for m in conv if m["role"] == "assistant")
    assert conv[2]["content"].startswith("Output:\n")
    assert protocol.compact_conversation(conv) == conv
    assert json.loads(trace["metadata"])["reward_json"] == {"reward": 1.0, "partial_credit": 1.0}


# -- trials ---------------------------------------------------------------------------------
def _trial(task, engine, tmp_path, prompt="terminus2", **trials):
    return asyncio.run(
        run_trial(task, task.task_id(), engine, TrialConfig(Trials(**trials), prompt), tmp_path / "w", run_id="r" * 16)
    )


@needs_sandbox
def test_oracle_trials_are_real_multi_turn_sessions(tmp_path):
    for rec in generate(5, 11):
        trace = _trial(rec.task, OracleEngine(), tmp_path)
        steps = split_commands(rec.task.text("solution/solve.sh"))
        assert trace["reward"] == 1.0 and trace["exception"] is None and not trace["timed_out"]
        assert trace["n_turns"] == len(steps) + 2  # each command, then task_complete twice
        conv = trace["conversations"]
        assert conv[0]["role"] == "user" and rec.task.instruction.strip()[:60] in conv[0]["content"]
        assert [m["role"] for m in conv] == ["user", "assistant"] * (len(conv) // 2)
        assert "New Terminal Output" in conv[2]["content"] and conv[-1]["role"] == "assistant"


@needs_sandbox
def test_parse_errors_are_fed_back_and_completion_is_confirmed_twice(tmp_path):
    task = next(generate(1, 3)).task
    engine = ScriptedEngine(["not json at all", answer("echo hi\n", complete=True), answer(complete=True)])
    trace = _trial(task, engine, tmp_path)
    assert "could not be read:\nERROR: no JSON object found" in engine.seen[1][-1]["content"]
    assert 'To confirm, answer again with "task_complete": true' in engine.seen[2][-1]["content"]
    assert trace["n_turns"] == 3 and trace["reward"] == 0.0  # did nothing useful
    assert trace["n_input_tokens"] == 300 and trace["n_output_tokens"] == 30


@needs_sandbox
def test_agent_timeout_ends_the_trial_and_the_verifier_still_runs(tmp_path):
    task = next(generate(1, 3)).task
    t = time.monotonic()
    trace = _trial(task, ScriptedEngine([answer("sleep 1000\n", duration=60)]), tmp_path, agent_timeout_sec=2)
    assert time.monotonic() - t < 20
    assert trace["timed_out"] and trace["exception"] is None and trace["reward"] == 0.0


@needs_sandbox
@pytest.mark.parametrize(
    "sandbox",
    [
        "bwrap",
        pytest.param(
            "podman", marks=pytest.mark.skipif(backend_problem("podman") is not None, reason="podman unusable here")
        ),
    ],
)
def test_nothing_the_agent_started_reaches_the_verifier_and_the_agent_never_sees_tests(tmp_path, sandbox):
    """The verifier's sandbox is started with the trial (parked; under podman, a command in the
    same container) and runs after the agent's processes are gone: a detached writer the agent
    leaves behind does not survive into it, and the tests are not there while the agent works."""
    task = _task_with_test(
        "a=$(wc -c < /app/beat); sleep 0.5; b=$(wc -c < /app/beat)\n"
        '[ "$a" = "$b" ] && echo 1 > /logs/verifier/reward.txt\n'
    )
    writer = (
        "(setsid nohup bash -c 'while :; do echo x >> /app/beat; echo 0.5 > /logs/verifier/reward.txt;"
        " sleep 0.02; done' >/dev/null 2>&1 &)\n"
    )
    engine = ScriptedEngine(
        [
            answer(writer, "sleep 0.2; ls /tests; echo listed=$?\n", duration=3),
            answer(complete=True),
            answer(complete=True),
        ]
    )
    trace = _trial(task, engine, tmp_path, sandbox=sandbox)
    assert "listed=2" in engine.seen[1][-1]["content"]  # no /tests while the agent works
    assert trace["exception"] is None and trace["reward"] == 1.0, trace["metadata"]


def _task_with_test(test_sh: str) -> TaskDir:
    task = TaskDir("t")
    task.add("instruction.md", "x")
    task.add("task.toml", 'version = "1.0"\n')
    task.add("environment/Dockerfile", "FROM ubuntu:24.04\nWORKDIR /app\n")
    task.add("tests/test.sh", "#!/bin/bash\n" + test_sh, executable=True)
    return task


@needs_sandbox
def test_engine_failure_is_an_infrastructure_exception(tmp_path):
    task = next(generate(1, 3)).task
    trace = _trial(task, ScriptedEngine([EngineError("503 after 5 retries")]), tmp_path)
    assert trace["exception"] == "EngineError" and trace["result"] == "EngineError"
    assert trace["reward"] is None


@needs_sandbox
def test_a_bug_raises_and_only_infrastructure_errors_are_recorded(tmp_path):
    task = next(generate(1, 3)).task
    with pytest.raises(TypeError, match="a bug"):  # not an "infrastructure error" dropped unseen
        _trial(task, ScriptedEngine([TypeError("a bug in an engine")]), tmp_path / "bug")
    garbled = TaskDir("garbled-reward")
    garbled.add("instruction.md", "Do nothing.")
    garbled.add("tests/test.sh", "#!/bin/sh\necho passed > /logs/verifier/reward.txt\n", executable=True)
    trace = _trial(garbled, ScriptedEngine([]), tmp_path / "garbled")
    assert trace["exception"] == "VerifierOutputParseError" and trace["reward"] is None
    assert "not a number: 'passed" in json.loads(trace["metadata"])["exception_message"]


@needs_sandbox
def test_a_trial_that_fills_its_disk_ends_as_a_task_failure(tmp_path):
    task = TaskDir("disk-hog")
    task.add("instruction.md", "Fill the disk.")
    task.add("task.toml", "[environment]\nstorage_mb = 16\n")  # Harbor's field
    task.add("tests/test.sh", "#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n", executable=True)
    hog = "for i in $(seq 1 64); do head -c 1048576 /dev/zero > /app/f$i || break; sleep 0.02; done; sleep 30\n"
    t = time.monotonic()
    trace = _trial(
        task, ScriptedEngine([answer(hog, duration=60), answer(complete=True), answer(complete=True)]), tmp_path
    )
    assert time.monotonic() - t < 30  # ended by the cap, not by the command's own end
    meta = json.loads(trace["metadata"])
    assert trace["result"] == "DiskLimitExceededError" and trace["exception"] is None and trace["reward"] == 0.0
    assert meta["stop_reason"] == "disk_limit_exceeded" and "disk limit of 16 MB" in meta["stop_message"]


@needs_sandbox
def test_a_verifier_that_dies_before_writing_a_reward_is_an_infrastructure_exception(tmp_path):
    task = TaskDir("offline-verifier")
    task.add("instruction.md", "Do nothing.")
    task.add(
        "tests/test.sh",
        "#!/bin/bash\nset -e\npip download --no-cache-dir -q pytest -d /tmp/w\n"
        "pytest /tests\necho 1 > /logs/verifier/reward.txt\n",
        executable=True,
    )
    trace = _trial(task, ScriptedEngine([]), tmp_path)
    assert trace["exception"] == "RewardFileNotFoundError" and trace["result"] == "RewardFileNotFoundError"
    assert trace["reward"] is None  # no verdict: not a failed task (reward 0)
    assert "wrote no /logs/verifier/reward.txt" in json.loads(trace["metadata"])["exception_message"]


JUDGE_VARS = ("OTB_TEST_JUDGE_KEY", "OTB_TEST_JUDGE_URL")


@needs_sandbox
def test_the_verifier_gets_its_task_toml_env(tmp_path, monkeypatch):
    """[verifier].env reaches the verifier's process (host ${VAR}s resolved, as Harbor does), never
    the agent's; the verifier's limit (Harbor's 600 s, scaled) is recorded; the result is Harbor's
    text of the reward ("1.0")."""
    task = TaskDir("judge-env")
    task.add("instruction.md", "Do nothing.")
    task.add(
        "task.toml",
        '[verifier.env]\nJUDGE_MODE = "strict"\nJUDGE_KEY = "${OTB_TEST_JUDGE_KEY}"\n'
        'JUDGE_URL = "${OTB_TEST_JUDGE_URL:-http://judge}"\n',
    )
    task.add(
        "tests/test.sh",
        '#!/bin/bash\n[ "$JUDGE_MODE/$JUDGE_KEY/$JUDGE_URL" = "strict/k-123/http://judge" ] '
        "&& echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n",
        executable=True,
    )
    monkeypatch.setenv("OTB_TEST_JUDGE_KEY", "k-123")
    monkeypatch.delenv("OTB_TEST_JUDGE_URL", raising=False)
    engine = ScriptedEngine([answer('echo "agent sees [$JUDGE_MODE]"\n'), answer(complete=True), answer(complete=True)])
    trace = _trial(task, engine, tmp_path / "a", timeout_multiplier=2, host_env=JUDGE_VARS)
    assert trace["reward"] == 1.0 and trace["result"] == "1.0"
    assert "agent sees []" in engine.seen[1][-1]["content"]
    meta = json.loads(trace["metadata"])
    assert meta["verifier_timeout_sec"] == 1200 and meta["agent_timeout_sec"] == 7200  # no agent limit: the cap

    monkeypatch.delenv("OTB_TEST_JUDGE_KEY")  # the host lacks what the verifier needs: no verdict
    trace = _trial(task, ScriptedEngine([]), tmp_path / "b", host_env=JUDGE_VARS)
    assert trace["exception"] == trace["result"] == "VerifierEnvError" and trace["reward"] is None
    assert "OTB_TEST_JUDGE_KEY" in json.loads(trace["metadata"])["exception_message"]


REGION_VARS = ("OTB_TEST_REGION", "OTB_TEST_MODE")


@needs_sandbox
def test_environment_env_reaches_every_phase_and_solution_env_the_oracle(tmp_path, monkeypatch):
    """As Harbor: [environment].env is in the agent's shell and the verifier's process (host
    ${VAR}s resolved); [solution].env only in the oracle's replay of solve.sh, never a model's
    shell or the verifier. A host variable missing without a default: TaskEnvError, not run."""
    from otbuild.harness.oracle import OracleEngine
    from otbuild.traces.outcome import NOT_RUN, outcome

    task = TaskDir("task-env")
    task.add("instruction.md", "Write the seed.")
    task.add(
        "task.toml",
        '[environment.env]\nREGION = "${OTB_TEST_REGION}"\nMODE = "${OTB_TEST_MODE:-fast}"\n'
        '[solution.env]\nSEED = "42"\n',
    )
    task.add("solution/solve.sh", '#!/bin/bash\necho "$SEED/$REGION" > /tmp/seed.txt\n', executable=True)
    task.add(
        "tests/test.sh",
        '#!/bin/bash\n[ "$(cat /tmp/seed.txt)/$MODE/$SEED" = "42/eu/fast/" ] '
        "&& echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n",
        executable=True,
    )
    monkeypatch.setenv("OTB_TEST_REGION", "eu")
    monkeypatch.delenv("OTB_TEST_MODE", raising=False)
    trace = _trial(task, OracleEngine(), tmp_path / "oracle", host_env=REGION_VARS)
    assert trace["reward"] == 1.0, trace["metadata"]
    engine = ScriptedEngine(
        [answer('echo "agent sees [$REGION/$MODE/$SEED]"\n'), answer(complete=True), answer(complete=True)]
    )
    trace = _trial(task, engine, tmp_path / "model", host_env=REGION_VARS)
    assert "agent sees [eu/fast/]" in engine.seen[1][-1]["content"] and trace["reward"] == 0.0

    monkeypatch.delenv("OTB_TEST_REGION")
    trace = _trial(task, OracleEngine(), tmp_path / "missing", host_env=REGION_VARS)
    assert trace["exception"] == "TaskEnvError" and outcome(trace) == NOT_RUN
    assert (
        "[environment].env REGION: the host has no OTB_TEST_REGION"
        in json.loads(trace["metadata"])["exception_message"]
    )


@pytest.mark.parametrize("table", ["environment", "verifier", "solution"])
def test_a_task_asking_for_a_host_secret_the_recipe_does_not_allow_is_not_run(tmp_path, monkeypatch, table):
    """Issue 44 (2): `${HF_TOKEN}` in any env table of task.toml reads nothing of the host unless the
    recipe's host_env names it; the trial is not run (before any sandbox), naming the table and
    the variable, even when the template has a default."""
    from otbuild.harness.oracle import OracleEngine
    from otbuild.traces.outcome import NOT_RUN, outcome

    monkeypatch.setenv("HF_TOKEN", "hf_" + "s3cr3t" * 6)
    task = TaskDir("wants-a-secret")
    task.add("instruction.md", "Print $T.")
    task.add("task.toml", f'[{table}.env]\nT = "${{HF_TOKEN:-none}}"\n')
    task.add("solution/solve.sh", "#!/bin/bash\necho $T\n", executable=True)
    trace = _trial(task, OracleEngine(), tmp_path)
    assert trace["exception"] == "HostEnvNotAllowed" and outcome(trace) == NOT_RUN and trace["conversations"] == []
    assert f"[{table}].env T: HF_TOKEN" in json.loads(trace["metadata"])["exception_message"]
    assert "s3cr3t" not in json.dumps(trace)


def test_a_task_toml_harbor_would_refuse_is_the_trials_exception(tmp_path):
    task = TaskDir("bad-network")
    task.add("instruction.md", "Do nothing.")
    task.add("task.toml", '[environment]\nnetwork_mode = "vpn"\n')
    task.add("tests/test.sh", "#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n", executable=True)
    trace = _trial(task, ScriptedEngine([]), tmp_path)  # never run with a guessed (public) network
    assert trace["exception"] == trace["result"] == "TaskFormatError" and trace["reward"] is None
    assert "network_mode" in json.loads(trace["metadata"])["exception_message"]


class BuggyEngine(ScriptedEngine):
    def __init__(self, settings):
        super().__init__([TypeError("a bug in an engine")])


@needs_sandbox
def test_a_bug_stops_the_rollout_shard(tmp_path, monkeypatch):
    """The shard job fails with the bug (after the other trials are cancelled and their
    sandboxes closed), instead of writing it down as an infrastructure error."""
    monkeypatch.setitem(ENGINES, "buggy", BuggyEngine)
    tasks = tmp_path / "tasks.parquet"
    write_tasks(tasks, generate(3, 3), source="synth")
    settings = RolloutSettings(engine="oracle", concurrency=3).model_copy(update={"engine": "buggy"})
    with pytest.raises(ExceptionGroup) as e:
        run_shard(settings, [tasks], tmp_path / "out", 0)
    assert e.group_contains(TypeError, match="a bug in an engine")
    assert not (tmp_path / "out" / "shards" / "0-of-1.parquet").exists()


def strict_endpoint(answers: list[str], reasoning: str | None = None):
    """An OpenAI-compatible stand-in that, as strict hosted APIs do, refuses a message with
    any key but role and content; it answers `answers` in turn (with `reasoning_content`)."""

    def reply(body):
        bad = [sorted(set(m) - {"role", "content"}) for m in body["messages"] if set(m) - {"role", "content"}]
        if bad:
            return 400, {"error": {"message": f"messages: unknown keys {bad}", "type": "invalid_request_error"}}
        turn = sum(m["role"] == "assistant" for m in body["messages"])
        out = chat_answer(answers[min(turn, len(answers) - 1)])
        out["choices"][0]["message"]["reasoning_content"] = reasoning
        return 200, out

    return reply


THREE_TURNS = [answer("echo hi\n"), answer(complete=True), answer(complete=True)]


@needs_sandbox
def test_the_model_is_sent_role_and_content_only(tmp_path, scripted):
    srv = scripted(strict_endpoint(THREE_TURNS))
    task = next(generate(1, 3)).task

    async def trial():
        async with make_engine(LLM(engine="openai", base_url=srv.base_url, model="m")) as engine:
            return await run_trial(task, task.task_id(), engine, TrialConfig(Trials(), "terminus2"), tmp_path / "w")

    trace = asyncio.run(trial())
    assert trace["exception"] is None and trace["reward"] == 0.0 and trace["n_turns"] == 3
    assert len(srv.requests) == 3 and trace["n_output_tokens"] > 0


@needs_sandbox
def test_reasoning_is_kept_in_traces_unless_switched_off(tmp_path, scripted):
    """A reasoning parser's text (`reasoning_content`) goes into the trace before the answer,
    as Harbor exports it; the model is never sent it back. `keep_reasoning: false` (recipe)
    leaves it out."""
    srv = scripted(strict_endpoint(THREE_TURNS, reasoning="I should say hi."))
    tasks = tmp_path / "tasks.parquet"
    write_tasks(tasks, generate(1, 3), source="synth")
    convs = {}
    for keep in (True, False):
        settings = RolloutSettings(engine="openai", base_url=srv.base_url, model="m", keep_reasoning=keep)
        outdir = tmp_path / f"keep-{keep}"
        run_shard(settings, [tasks], outdir, 0)
        [row] = pq.read_table(outdir / "shards" / "0-of-1.parquet").to_pylist()
        assert row["exception"] is None and row["n_turns"] == 3
        convs[keep] = [m["content"] for m in row["conversations"] if m["role"] == "assistant"]
    assert convs[True] == [f"<think>I should say hi.</think>\n{a}" for a in THREE_TURNS]
    assert convs[False] == THREE_TURNS
    sent = [m["content"] for r in srv.requests for m in r["body"]["messages"] if m["role"] == "assistant"]
    assert sent and not any("I should say hi" in c for c in sent)


@needs_sandbox
def test_a_context_overflow_ends_the_trial_as_a_task_failure(tmp_path, tiny_model, local_server):
    """A small model served by `otbuild serve` with a 1600-token context (as vLLM's
    --max-model-len) has room for the first prompt and an answer or two, not for a whole trial:
    the server's 400 ends the trial as a failed task with its reason, not as an infrastructure
    error; the turns before it are kept."""
    task = next(generate(1, 3)).task

    async def trial():
        async with make_engine(
            LLM(engine="openai", base_url=local_server, model=str(tiny_model), temperature=0.0, max_tokens=64)
        ) as engine:
            return await run_trial(task, task.task_id(), engine, TrialConfig(Trials(), "terminus2"), tmp_path / "w")

    trace = asyncio.run(trial())
    meta = json.loads(trace["metadata"])
    assert trace["exception"] is None and not trace["timed_out"] and trace["reward"] == 0.0
    assert trace["result"] == "ContextLengthExceededError" and meta["stop_reason"] == "context_length_exceeded"
    assert "maximum context length is 1600 tokens" in meta["stop_message"]
    assert 1 <= trace["n_turns"] <= 3 and trace["conversations"][-1]["role"] == "assistant"


# -- rollout shards: resume after a kill ----------------------------------------------------
@needs_sandbox
@pytest.mark.slow
def test_killed_shard_resumes_without_redoing_or_duplicating(tmp_path):
    tasks = tmp_path / "tasks.parquet"
    write_tasks(tasks, generate(30, 5, difficulties=[3]), source="synth")
    settings = RolloutSettings(engine="oracle", shards=2, concurrency=1).model_dump()
    outdir = tmp_path / "artifacts" / "rollout" / ("a" * 16)
    cmd = shard_command("rollout", settings, tasks, outdir, 1)
    partial = outdir / "shards" / "1-of-2.partial.jsonl"
    done_before = kill_after(cmd, partial, 4)
    assert 4 <= done_before < 15 and not (outdir / "shards" / "1-of-2.parquet").exists()

    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{done_before} already done, {15 - done_before} to run" in res.stdout
    rows = pq.read_table(outdir / "shards" / "1-of-2.parquet").to_pylist()
    expected = [t for t in plan_trials([tasks], 1) if t.index % 2 == 1]
    names = pq.read_table(tasks, columns=["path"]).column("path").to_pylist()
    assert [r["task"] for r in rows] == [names[t.row] for t in expected]  # each trial once, in order
    assert all(r["reward"] == 1.0 for r in rows) and not partial.exists()


@needs_sandbox
def test_a_torn_last_line_is_dropped_and_the_shard_goes_on(tmp_path, capsys):
    """A crash or a full disk mid-write leaves half a record at the end of the partial file:
    the next attempt cuts it off, keeps the whole records and reruns only that trial."""
    tasks = tmp_path / "tasks.parquet"
    write_tasks(tasks, generate(3, 11, difficulties=[1]), source="synth")
    settings = RolloutSettings(engine="oracle", concurrency=3)
    outdir = tmp_path / "rollout"
    run_shard(settings, [tasks], outdir, 0)
    shard = outdir / "shards" / "0-of-1.parquet"
    rows = pq.read_table(shard).to_pylist()
    shard.unlink()
    lines = [json.dumps({"_trial": i, **r}) for i, r in enumerate(rows)]
    partial = shard.with_suffix(".partial.jsonl")
    partial.write_text(lines[0] + "\n" + lines[1] + "\n" + lines[2][: len(lines[2]) // 2])
    capsys.readouterr()
    run_shard(settings, [tasks], outdir, 0)
    assert "2 already done, 1 to run" in capsys.readouterr().out
    assert [r["task"] for r in pq.read_table(shard).to_pylist()] == [r["task"] for r in rows]
    assert not partial.exists()


@needs_sandbox
def test_shards_finishing_together_do_not_trip_over_each_others_files(tmp_path):
    """Shard 1 removes its partial file as it finishes, possibly between shard 0 listing the
    partial files and reading them (seen in a real build: FileNotFoundError, job failed)."""
    tasks = tmp_path / "tasks.parquet"
    write_tasks(tasks, generate(4, 12, difficulties=[1]), source="synth")
    settings = RolloutSettings(engine="oracle", shards=2, concurrency=2)
    outdir = tmp_path / "rollout"
    (outdir / "shards").mkdir(parents=True)
    # listed by the glob, gone when read: what a just-finished shard's file looks like
    (outdir / "shards" / "1-of-2.partial.jsonl").symlink_to(tmp_path / "removed")
    run_shard(settings, [tasks], outdir, 0)
    assert len(pq.read_table(outdir / "shards" / "0-of-2.parquet")) == 2


@needs_sandbox
@pytest.mark.slow
@pytest.mark.skipif(not (DATA / "terminal_bench_tasks").is_dir(), reason="../shared/data/dev is not present")
@pytest.mark.skipif(
    subprocess.run(["/usr/bin/python3", "-c", "import pytest"], check=False).returncode != 0,
    reason="the sandbox's python3 has no pytest (make setup installs python3-pytest)",
)
def test_oracle_passes_the_offline_terminal_bench_tasks(tmp_path):
    """Terminal-Bench 1 tasks converted to Harbor, run by the oracle in the local sandbox:
    every task that needs no container image is solved, as its own verifier says."""
    from otbuild.sources import tb1_dir

    base = DATA / "terminal_bench_tasks" / "tb1_format"
    records = [
        r
        for d in ("evoeval", "tb_core_original")
        for r in tb1_dir.read(source("tb1-dir", base / d))
        if getattr(r, "runnable_locally", False)
    ]
    assert len(records) >= 40

    async def all_trials():
        sem = asyncio.Semaphore(4)

        async def one(i, rec):
            async with sem:
                return await run_trial(
                    rec.task,
                    rec.task.task_id(),
                    OracleEngine(),
                    TrialConfig(Trials(), "terminus2"),
                    tmp_path / str(i),
                )

        return await asyncio.gather(*(one(i, r) for i, r in enumerate(records)))

    traces = asyncio.run(all_trials())
    failed = [(r.task.name, t["reward"], t["exception"]) for r, t in zip(records, traces) if t["reward"] != 1.0]
    assert not failed


def test_timeout_aware_evaluation():
    from otbuild.harness.config import effective_timeout

    assert effective_timeout(900, 2, 7200) == 1800  # an 8B model: twice the task's timeout
    assert effective_timeout(900, 16, 7200) == 7200  # a 32B model: 4 h, capped at 2 h
    assert effective_timeout(300, 1, 7200) == 300


@needs_sandbox
def test_the_multiplier_reaches_the_trial(tmp_path):
    task = next(generate(1, 3)).task  # its task.toml says 300 s
    trace = _trial(
        task,
        ScriptedEngine([answer(complete=True), answer(complete=True)]),
        tmp_path,
        timeout_multiplier=16,
        timeout_cap_sec=1000,
    )
    assert json.loads(trace["metadata"])["agent_timeout_sec"] == 1000
