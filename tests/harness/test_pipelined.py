"""Trials pipelined around the model (otbuild/harness/slots.py): the next trial gets ready and
this one verifies while other agents use the model; the model never has more than `concurrency`
agents at once; the traces are the same either way. And the terminal's reads against output
that comes late, runs long, or looks like the prompt."""

from __future__ import annotations

import asyncio
import json
import time

import pyarrow.parquet as pq
import pytest

from otbuild.engines import Completion
from otbuild.harness import protocol
from otbuild.harness.config import TrialConfig
from otbuild.harness.slots import TrialSlots
from otbuild.harness.terminal import SHELL_ENV, Terminal
from otbuild.harness.trial import run_trial
from otbuild.sandbox import backend_problem
from otbuild.settings.stages import RolloutSettings
from otbuild.settings.trials import Trials
from otbuild.sources.synthetic import generate
from otbuild.stagekit.trials import run_trials_shard
from otbuild.tasks.table import write_tasks
from otbuild.traces.table import VOLATILE_COLUMNS

needs_sandbox = pytest.mark.skipif(backend_problem("bwrap") is not None, reason="bubblewrap unusable here")

SLOW_VERIFIER = "#!/bin/sh\nsleep 1\necho 1 > /logs/verifier/reward.txt\n"


class CountingEngine:
    """Declares the task complete twice, each answer after a short wait, counting the requests
    in flight at once."""

    name, provider, model = "counting", "test", "counting"

    def __init__(self):
        self.in_flight = self.most = 0
        self.starts: list[float] = []

    async def complete(self, messages, **_):
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        self.starts.append(time.monotonic())
        try:
            await asyncio.sleep(0.05)
        finally:
            self.in_flight -= 1
        done = {"analysis": "", "plan": "", "commands": [], "task_complete": True}
        return Completion(protocol.format_answer(done), 10, 10, "stop")

    async def aclose(self):
        pass


def _run_pipelined(tmp_path, pipelined: bool, n: int = 3, concurrency: int = 1):
    tasks = [rec.task for rec in generate(n, 21, families=["files"], difficulties=[1])]
    for task in tasks:
        task.add("tests/test.sh", SLOW_VERIFIER, executable=True)
    engine, slots = CountingEngine(), None
    verifiers: list[tuple[float, float]] = []

    async def all_trials():
        nonlocal slots
        slots = TrialSlots(concurrency, pipelined=pipelined)

        async def one(i, task):
            async with slots.trial() as slot:
                trace = await run_trial(
                    task, task.task_id(), engine, TrialConfig(Trials(), "compact"), tmp_path / str(i), slot=slot
                )
                end = time.monotonic()
                verifiers.append((end - json.loads(trace["metadata"])["verifier_s"], end))
                return trace

        return await asyncio.gather(*(one(i, t) for i, t in enumerate(tasks)))

    start = time.monotonic()
    traces = asyncio.run(all_trials())
    return traces, engine, verifiers, time.monotonic() - start


@needs_sandbox
def test_the_next_trial_talks_to_the_model_while_this_one_verifies(tmp_path):
    traces, engine, verifiers, wall = _run_pipelined(tmp_path, pipelined=True)
    assert all(t["reward"] == 1.0 and t["exception"] is None for t in traces)
    assert engine.most == 1  # concurrency 1: one agent at the model at a time, as before
    first_verifier_start, _ = min(verifiers)
    assert any(first_verifier_start < s < min(e for _, e in verifiers) for s in engine.starts)
    assert wall < 3 * 1.0  # three 1 s verifiers, side by side with the next trials


@needs_sandbox
def test_not_pipelined_each_trial_waits_for_the_last_ones_verifier(tmp_path):
    """What bench/vllm.py measures as `before`: the slot held to the trial's end."""
    traces, engine, verifiers, wall = _run_pipelined(tmp_path, pipelined=False)
    assert all(t["reward"] == 1.0 for t in traces) and engine.most == 1
    _, first_end = min(verifiers, key=lambda v: v[1])
    assert sum(s > first_end for s in engine.starts) == 4  # two trials' requests, all after it
    assert wall >= 3 * 1.0


@needs_sandbox
def test_agents_at_once_stay_within_the_concurrency(tmp_path):
    traces, engine, _, _ = _run_pipelined(tmp_path, pipelined=True, n=6, concurrency=2)
    assert len(traces) == 6 and engine.most <= 2 and all(t["reward"] == 1.0 for t in traces)


def test_at_most_concurrency_trials_get_ready_at_once_first_come_first():
    """2 x concurrency trials may be alive, but only `concurrency` get ready (or wait ready) at
    once, in the order they came: at a shard's start the trials whose agents go first are not
    slowed by as many starts again beside them."""
    concurrency, n = 3, 12
    now = {"ready": 0, "agents": 0, "alive": 0}
    most = dict.fromkeys(now, 0)
    agent_order: list[int] = []

    def count(key: str, by: int) -> None:
        now[key] += by
        most[key] = max(most[key], now[key])

    async def trial(slots: TrialSlots, i: int) -> None:
        async with slots.trial() as slot:
            count("alive", 1)
            count("ready", 1)
            await asyncio.sleep(0.01)  # its sandbox and terminal
            await slot.agent()
            count("ready", -1)
            count("agents", 1)
            agent_order.append(i)
            await asyncio.sleep(0.02)  # its agent at the model
            count("agents", -1)
            slot.agents_done()
            await asyncio.sleep(0.03)  # its verifier
            count("alive", -1)

    async def shard() -> None:
        slots = TrialSlots(concurrency)
        await asyncio.gather(*(trial(slots, i) for i in range(n)))

    asyncio.run(shard())
    assert most == {"ready": concurrency, "agents": concurrency, "alive": 2 * concurrency}
    assert agent_order == list(range(n))


def _volatile_free(row: dict) -> dict:
    """A trace row without what measures the run (VOLATILE_COLUMNS: its date, durations)."""
    row = {k: v for k, v in row.items() if k not in VOLATILE_COLUMNS}
    meta = json.loads(row["metadata"])
    for key in VOLATILE_COLUMNS:
        if key.startswith("metadata."):
            meta.pop(key.removeprefix("metadata."), None)
    return {**row, "metadata": meta}


def _smoke_tasks(tmp_path, count_1: int, count_2: int):
    """The smoke recipe's tasks (recipes/smoke.yaml: synthetic files tasks of difficulty 1, seeds
    1 and 2), or their first ones."""
    path = tmp_path / "tasks.parquet"
    records = [
        *generate(count_1, 1, families=["files"], difficulties=[1]),
        *generate(count_2, 2, families=["files"], difficulties=[1]),
    ]
    write_tasks(path, iter(records), source="synth")
    return path


@needs_sandbox
@pytest.mark.parametrize(
    "counts",
    [pytest.param((4, 3), id="some"), pytest.param((60, 50), id="all", marks=pytest.mark.slow)],
)
def test_oracle_traces_are_the_same_pipelined_or_not(tmp_path, counts):
    """The oracle on the smoke tasks (the smoke teacher's prompt and concurrency): every trace is
    the same, field by field but the run's measurements, whether trials are pipelined or not."""
    tasks = _smoke_tasks(tmp_path, *counts)
    cfg = RolloutSettings(engine="oracle", concurrency=2, prompt="compact", sandbox="bwrap")
    rows = {}
    for pipelined in (False, True):
        out = tmp_path / str(pipelined) / "rollout"  # the same run id: the dir's name
        run_trials_shard(cfg, [tasks], out, 0, pipelined=pipelined)
        rows[pipelined] = pq.read_table(out / "shards" / "0-of-1.parquet").to_pylist()
    assert len(rows[True]) == sum(counts) and all(r["reward"] == 1.0 for r in rows[True])
    before, now = ([_volatile_free(r) for r in rows[k]] for k in (False, True))
    assert [json.dumps(r, sort_keys=True, default=str) for r in before] == [
        json.dumps(r, sort_keys=True, default=str) for r in now
    ]


# -- the terminal's reads -------------------------------------------------------------------
@pytest.fixture
def term():
    env = [f"{k}={v}" for k, v in SHELL_ENV.items()]
    t = Terminal(["env", "-i", "PATH=/usr/bin:/bin", *env, "bash", "--noprofile", "--norc", "-i"])
    t.read(5)  # the first prompt
    yield t
    t.close()


def _timed_read(term: Terminal, keys: str, seconds: float) -> tuple[str, float]:
    term.send(keys)
    start = time.monotonic()
    return term.read(seconds), time.monotonic() - start


def test_a_command_that_ends_early_returns_early(term):
    out, took = _timed_read(term, "echo $((40+2))\n", 20)
    assert "42" in out and out.endswith("# ") and took < 2


def test_a_command_past_its_duration_is_cut_there_and_its_output_comes_next(term):
    out, took = _timed_read(term, "sleep 1.5; echo $((1+1))later\n", 0.4)
    assert 0.35 < took < 1.2 and "2later" not in out
    rest = term.read(10)
    assert "2later" in rest and rest.endswith("# ")  # nothing lost: the next read has it


def test_output_arriving_late_in_a_read_is_kept(term):
    out, _ = _timed_read(term, "echo $((2+3))early; sleep 0.5; echo $((3+4))late\n", 10)
    assert "5early" in out and "7late" in out and out.endswith("# ")


def test_a_prompt_lookalike_in_the_output_loses_nothing(term):
    """A command (or a task's file) that prints the prompt's marker can end a read early, as a
    short duration would: what it prints after comes with the next read, and the shell goes on."""
    marker = "\\033]777;otbuild-ready\\007"
    out, _ = _timed_read(term, f"printf 'x%.0sfake# {marker}'; sleep 0.5; echo $((5+6))after\n", 10)
    rest = "" if "11after" in out else term.read(10)
    assert "11after" in out + rest and (out + rest).endswith("# ")
    again, _ = _timed_read(term, "echo $((6+7))next\n", 10)
    assert "13next" in again and "11after" not in again


def test_a_shell_that_exited_is_gone_before_its_process_has_ended():
    """`exit` hangs up the terminal at once, while the process around the shell (a sandbox
    tearing down, here a wrapper that lets go of the terminal and lingers) may take a moment to
    end: the shell counts as gone from the hang-up (a trial ends `shell_exited`, not with one
    more turn), and closing still ends what lingers."""
    env = [f"{k}={v}" for k, v in SHELL_ENV.items()]
    shell = "bash --noprofile --norc -i; exec </dev/null >/dev/null 2>&1; sleep 30"
    t = Terminal(["env", "-i", "PATH=/usr/bin:/bin", *env, "sh", "-c", shell])
    try:
        t.read(5)
        assert t.alive
        out, _ = _timed_read(t, "exit\n", 10)
        assert t.proc.poll() is None and not t.alive  # the wrapper lingers; the shell is gone
    finally:
        start = time.monotonic()
        t.close()
    assert t.proc.returncode is not None and time.monotonic() - start < 5


@needs_sandbox
def test_a_trial_whose_output_fakes_the_prompt_ends_normally(tmp_path):
    """A task file ending in the prompt's marker, shown by the agent's command: the observations
    still hold all of the command's output (what came after an early return, in the next one)
    and the trial is verified."""
    rec = next(iter(generate(1, 5, families=["files"], difficulties=[1])))
    rec.task.add("environment/app/evil.txt", "in-the-file# \x1b]777;otbuild-ready\x07")  # a chunk can end there
    cmd = "cat /app/evil.txt; sleep 0.3; echo tail-$((2*21))\n"
    later = {"keystrokes": "sleep 1\n", "duration": 5}

    class Scripted(CountingEngine):
        def __init__(self):
            super().__init__()
            self.answers = [
                {"analysis": "", "plan": "", "commands": [{"keystrokes": cmd, "duration": 5}], "task_complete": False},
                {"analysis": "", "plan": "", "commands": [later], "task_complete": False},
            ]

        async def complete(self, messages, **kw):
            if self.answers:
                return Completion(protocol.format_answer(self.answers.pop(0)), 10, 10, "stop")
            return await super().complete(messages, **kw)

    trace = asyncio.run(
        run_trial(rec.task, rec.task.task_id(), Scripted(), TrialConfig(Trials(), "compact"), tmp_path / "w")
    )
    seen = "".join(m["content"] for m in trace["conversations"] if m["role"] == "user")
    assert "in-the-file# " in seen and "tail-42" in seen
    assert trace["exception"] is None and trace["reward"] is not None
