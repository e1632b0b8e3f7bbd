"""The terminus-2 harness: protocol, terminal, oracle replay, trials, resumable rollout shards."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from otbuild.engines import Completion, EngineError
from otbuild.engines.oracle import OracleEngine
from otbuild.harness import protocol
from otbuild.harness.oracle_steps import split_commands
from otbuild.harness.terminal import SHELL_ENV, Terminal
from otbuild.harness.trial import TrialSettings, run_trial
from otbuild.recipe.schema import Teacher
from otbuild.sandbox import backend_problem
from otbuild.sources.synthetic import generate
from otbuild.stages.rollout import plan_trials
from otbuild.tasks.table import write_tasks
from tests.conftest import DATA

needs_sandbox = pytest.mark.skipif(backend_problem("bwrap") is not None, reason="bubblewrap unusable here")


def answer(*commands, complete=False, duration=5.0):
    return json.dumps({"analysis": "a", "plan": "p", "task_complete": complete,
                       "commands": [{"keystrokes": c, "duration": duration} for c in commands]})


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
    a = protocol.parse_answer('Sure!\n```json\n{"analysis": "x", "plan": "y", "commands": '
                              '[{"keystrokes": "ls\\n", "duration": 500}], "task_complete": "true"}\n```')
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
    script = ("#!/bin/bash\nset -euo pipefail\n# c\ncd /app\ncat > a.py <<'EOF'\nprint(1)\n\nEOF\n"
              "for i in 1 2; do\n  echo $i\ndone\necho a \\\n  b\nexit 0\n")
    assert split_commands(script) == ["cd /app", "cat > a.py <<'EOF'\nprint(1)\n\nEOF",
                                      "for i in 1 2; do\n  echo $i\ndone", "echo a \\\n  b"]


# -- terminal -------------------------------------------------------------------------------
def test_terminal_keys_and_early_return(tmp_path):
    env = [f"{k}={v}" for k, v in SHELL_ENV.items()]
    term = Terminal(["env", "-i", "PATH=/usr/bin:/bin", *env, "bash", "--noprofile", "--norc", "-i"])
    try:
        term.read(2)
        t = time.monotonic()
        term.send("echo $((6*7))\n")
        assert "42" in term.read(30)
        assert time.monotonic() - t < 5  # returned when the prompt came back, not after 30 s
        term.send("sleep 100\n")
        assert "42" not in term.read(0.3)
        term.send("C-c")  # a lone key name sends the key: sleep is interrupted at once
        assert term.read(5).endswith("# ")  # the prompt is back
        term.send("echo $((1+2))after\n")
        assert "3after" in term.read(5)
    finally:
        term.close()


def _terminus2_trace() -> list[dict]:
    t2 = protocol.Terminus2
    ans = [t2.format_answer({"analysis": "The dir is there. Nothing moved yet.", "plan": "Move the files. Then stop.",
                             "commands": [{"keystrokes": "mv a/*.txt b/\n", "duration": 1.0}],
                             "task_complete": False}),
           t2.format_answer({"analysis": "Done.", "plan": "Finish.", "commands": [], "task_complete": True})]
    return [{"role": "user", "content": t2.first_prompt("Move the .txt files from a to b.", "root@box:/app# ")},
            {"role": "assistant", "content": ans[0]},
            {"role": "user", "content": t2.observation_reply("mv a/*.txt b/\nroot@box:/app# ")},
            {"role": "assistant", "content": "not json"},
            {"role": "user", "content": t2.parse_error_reply(protocol.ParseError("no JSON object found"))},
            {"role": "assistant", "content": ans[1]},
            {"role": "user", "content": t2.confirm_reply("root@box:/app# ")},
            {"role": "assistant", "content": ans[1]}]


def test_compact_style_is_short_and_keeps_the_task():
    full = protocol.Terminus2.first_prompt("Move the .txt files from a to b.", "root@box:/app# ")
    short = protocol.Compact.first_prompt("Move the .txt files from a to b.", "root@box:/app# ")
    assert len(short) * 4 < len(full)
    assert "Move the .txt files from a to b." in short and short.rstrip().endswith("root@box:/app#")
    text = protocol.Compact.format_answer({"analysis": "", "plan": "p", "commands": [], "task_complete": True})
    assert "\n" not in text and protocol.parse_answer(text).task_complete
    with pytest.raises(ValueError, match="unknown prompt style 'short'"):
        protocol.prompt_style("short")


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
    assert sum(len(m["content"]) for m in got) * 3 < sum(len(m["content"]) for m in conv)
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
def _trial(task, engine, tmp_path, **settings):
    return asyncio.run(run_trial(task, task.task_id(), engine, TrialSettings(**settings), tmp_path / "w",
                                 run_id="r" * 16))


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
    assert "parsing errors" in engine.seen[1][-1]["content"]
    assert "Are you sure you want to mark the task as complete" in engine.seen[2][-1]["content"]
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
def test_engine_failure_is_an_infrastructure_exception(tmp_path):
    task = next(generate(1, 3)).task
    trace = _trial(task, ScriptedEngine([EngineError("503 after 5 retries")]), tmp_path)
    assert trace["exception"] == "EngineError" and trace["result"] == "EngineError"
    assert trace["reward"] is None


# -- rollout shards: resume after a kill ----------------------------------------------------
@needs_sandbox
@pytest.mark.slow
def test_killed_shard_resumes_without_redoing_or_duplicating(tmp_path):
    tasks = tmp_path / "tasks.parquet"
    write_tasks(tasks, generate(30, 5, difficulties=[3]), source="synth")
    settings = Teacher(engine="oracle", shards=2, concurrency=1).model_dump()
    outdir = tmp_path / "artifacts" / "rollout" / ("a" * 16)
    spec = json.dumps({"stage": "rollout", "id": "a" * 16, "settings": settings,
                       "inputs": [{"id": "t", "stage": "task_filter", "path": str(tasks)}], "outdir": str(outdir)})
    cmd = [sys.executable, "-m", "otbuild", "stage", "rollout", "--spec", spec, "--shard", "1"]
    partial = outdir / "shards" / "1.partial.jsonl"
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not partial.exists() or len(partial.read_text().splitlines()) < 4):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = len(partial.read_text().splitlines())
    assert 4 <= done_before < 15 and not (outdir / "shards" / "1.parquet").exists()

    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{done_before} already done, {15 - done_before} to run" in res.stdout
    rows = pq.read_table(outdir / "shards" / "1.parquet").to_pylist()
    expected = [t for t in plan_trials([tasks], 1) if t.index % 2 == 1]
    names = pq.read_table(tasks, columns=["path"]).column("path").to_pylist()
    assert [r["task"] for r in rows] == [names[t.row] for t in expected]  # each trial once, in order
    assert all(r["reward"] == 1.0 for r in rows) and not partial.exists()


@needs_sandbox
@pytest.mark.slow
@pytest.mark.skipif(not (DATA / "terminal_bench_tasks").is_dir(), reason="../shared/data/dev is not present")
@pytest.mark.skipif(subprocess.run(["/usr/bin/python3", "-c", "import pytest"], check=False).returncode != 0,
                    reason="the sandbox's python3 has no pytest (make setup installs python3-pytest)")
def test_oracle_passes_the_offline_terminal_bench_tasks(tmp_path):
    """Terminal-Bench 1 tasks converted to Harbor, run by the oracle in the local sandbox:
    every task that needs no container image is solved, as its own verifier says."""
    from otbuild.sources import tb1_dir

    base = DATA / "terminal_bench_tasks" / "tb1_format"
    records = [r for d in ("evoeval", "tb_core_original") for r in tb1_dir.read(base / d)
               if getattr(r, "runnable_locally", False)]
    assert len(records) >= 40

    async def all_trials():
        sem = asyncio.Semaphore(4)

        async def one(i, rec):
            async with sem:
                return await run_trial(rec.task, rec.task.task_id(), OracleEngine(), TrialSettings(),
                                       tmp_path / str(i))
        return await asyncio.gather(*(one(i, r) for i, r in enumerate(records)))

    traces = asyncio.run(all_trials())
    failed = [(r.task.name, t["reward"], t["exception"]) for r, t in zip(records, traces) if t["reward"] != 1.0]
    assert not failed


def test_timeout_aware_evaluation():
    from otbuild.harness.trial import effective_timeout

    assert effective_timeout(900, 2, 7200) == 1800  # an 8B model: twice the task's timeout
    assert effective_timeout(900, 16, 7200) == 7200  # a 32B model: 4 h, capped at 2 h
    assert effective_timeout(300, 1, 7200) == 300


@needs_sandbox
def test_the_multiplier_reaches_the_trial(tmp_path):
    task = next(generate(1, 3)).task  # its task.toml says 300 s
    trace = _trial(task, ScriptedEngine([answer(complete=True), answer(complete=True)]), tmp_path,
                   timeout_multiplier=16, timeout_cap_sec=1000)
    assert json.loads(trace["metadata"])["agent_timeout_sec"] == 1000
