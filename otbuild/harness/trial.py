"""One trial: a task, an engine, a sandbox; terminus-2 turns until the agent is done, then the
task's verifier. Returns a trace row (otbuild/traces/table.py).

Task failures (wrong answer, agent timeout, a conversation the model's context window no
longer holds, the trial's disk limit, task files that cannot be put in place because of what
an earlier step left: TaskSetupError) and errors (the sandbox would not start or cannot give
the task the network it asks for, the task's task.toml is not one Harbor accepts, the engine
failed after its retries, the verifier timed out or wrote a malformed reward) are kept apart:
the latter set `exception` to the error's class name, which is also the row's `result`; a task
failure that is not a wrong answer names itself in `result` only. How each way of ending is
then classified, retried and counted is otbuild/traces/outcome.py (docs/failures.md). An
EndpointError (the model's endpoint refused the run: otbuild/engines/endpoint.py) stops the
rollout; any other exception is a bug and propagates.

The model is sent `{role, content}` messages only; what a trace keeps beside them (token
counts, a reasoning parser's text) comes from the completions.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from otbuild.engines.base import Completion, ContextLengthExceededError, EngineError
from otbuild.harness import protocol
from otbuild.harness.terminal import SHELL_ENV, Terminal
from otbuild.sandbox import Limits, SandboxError, TaskSetupError, open_sandbox, read_reward
from otbuild.settings.trials import Trials
from otbuild.tasks.task_toml import (
    FINAL,
    StepConfig,
    TaskConfig,
    harness_unsupported,
    host_env_refusal,
    resolve_env,
    task_config,
    unsupported_reason,
)
from otbuild.tasks.taskdir import WORKDIR, TaskDir, TaskFormatError
from otbuild.traces.outcome import UNVERIFIED_REASON
from otbuild.traces.table import assistant_turn, reward_text

SETTLE_SECONDS = 2.0  # wait for the first prompt


@dataclass(frozen=True)
class TrialSettings:
    """What a trial runs under: a recipe's trial section (teacher, eval or rl.sandbox: one
    declaration, otbuild/settings/trials.py) and the harness prompt style (harness.prompt)."""

    trials: Trials
    prompt: str
    verifier_timeout_sec: float | None = None  # None: the task's [verifier] timeout_sec (scaled and capped alike)
    verify: bool = True  # False: the verifier is not run (teacher.verify), the reward stays unknown

    @property
    def limits(self) -> Limits:
        return Limits(**self.trials.limits.model_dump(), build_network=self.trials.build_network)

    @property
    def host_environ(self) -> dict[str, str]:
        """What a task's `${VAR}` may read of this process's environment: the recipe's `host_env`."""
        return {name: os.environ[name] for name in self.trials.host_env if name in os.environ}


class VerifierTimeoutError(Exception):
    pass


class VerifierOutputParseError(Exception):
    """reward.txt / reward.json is malformed (Harbor's name for it)."""


class VerifierEnvError(Exception):
    """The task's `[verifier].env` names a host variable (`${VAR}`) this host does not set."""


class TaskEnvError(Exception):
    """The task's `[environment].env` or `[solution].env` names a host variable (`${VAR}`) this
    host does not set (no default): the same every time, so the trial is not run."""


class HostEnvNotAllowed(Exception):
    """The task's task.toml asks for a host variable (`${VAR}`) the recipe's `host_env` does not
    name: a task never reads a host secret the recipe did not hand it, so the trial is not run."""


class TaskKeyNotSupported(Exception):
    """The task's task.toml sets a key Harbor runs and this harness does not (HARNESS_UNSUPPORTED)."""


class StepSetupError(Exception):
    """A step's workdir/setup.sh failed (Harbor runs it before the step's agent)."""


class RewardFileNotFoundError(Exception):
    """The verifier ended without writing a reward: it died before judging (e.g. it could not
    install its test runner offline), so the trial has no verdict (Harbor's name for it)."""


# what a trial records as its exception (outcome infrastructure or verifier_error:
# otbuild/traces/outcome.py); anything else raised is a bug
INFRASTRUCTURE_ERRORS = (
    EngineError,
    SandboxError,
    VerifierTimeoutError,
    VerifierOutputParseError,
    RewardFileNotFoundError,
    VerifierEnvError,
    TaskFormatError,
    TaskKeyNotSupported,
    TaskEnvError,
    HostEnvNotAllowed,
    StepSetupError,
)
# why the agent stopped: the trace's metadata.stop_reason
DONE = "task_complete"
TIMEOUT = "agent_timeout"
OUT_OF_EPISODES = "max_episodes"
SHELL_EXITED = "shell_exited"
CONTEXT_EXCEEDED = "context_length_exceeded"  # the next request would not fit the model
DISK_EXCEEDED = "disk_limit_exceeded"  # the trial wrote storage_mb: a failed task, unverified
SETUP_FAILED = "task_setup_failed"  # the task's files could not be put in place (TaskSetupError)


class TrialThread:
    """A trial's own thread for its blocking calls (the sandbox's start, terminal reads, the
    verifier, the end of its processes): no trial waits for a thread another trial holds, at
    any concurrency (asyncio's shared default pool has min(32, CPUs + 4) threads, fewer than a
    rollout's trials in flight, and a terminal read holds one for its command's duration)."""

    def __init__(self):
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="otbuild-trial")

    def __call__(self, fn, *args, **kwargs):
        return asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        self._pool.shutdown(wait=False)  # a cancelled trial's call ends on its own


@dataclass
class StepRun:
    """What one step of a trial gave (a single-step task is one step without a name)."""

    name: str | None = None
    messages: list[dict] = field(default_factory=list)  # what the model is sent
    completions: list[Completion] = field(default_factory=list)  # its answers, one per assistant message
    stop: str | None = None
    failure: str | None = None  # a task failure that is not a wrong answer
    rewards: dict | None = None  # the verifier's: {"reward": R} from reward.txt, reward.json's numbers
    details: dict = field(default_factory=dict)

    @property
    def reward(self) -> float | None:
        return None if self.rewards is None else _reward(self.rewards.get("reward", self.rewards))[0]


async def run_trial(
    task: TaskDir,
    task_id: str,
    engine,
    settings: TrialSettings,
    workdir: Path,
    *,
    sample_idx: int = 0,
    run_id: str = "",
    source: str = "",
) -> dict:
    """One trial. A multi-step task (`[[steps]]`) runs its steps in order in one sandbox, as
    Harbor does: each step a fresh conversation on the step's instruction, then the step's
    verifier; a step below its `min_reward` ends the trial; the trial's reward is the steps'
    by `multi_step_reward_strategy`, each step's kept in the trace's metadata (`steps`)."""
    started, t0 = datetime.now(UTC), time.monotonic()
    runs: list[StepRun] = []
    reward = exception = None
    details: dict = {}
    agent_timeout = verifier_timeout = 0.0
    thread = TrialThread()
    try:
        config = task_config(task)  # a task.toml Harbor would refuse is this trial's exception
        if unsupported := harness_unsupported(config):
            raise TaskKeyNotSupported(
                f"task {task.name!r}: task.toml {', '.join(unsupported)} ({unsupported_reason(unsupported[0])}) "
                "is not run by otbuild's harness; run the task with sandbox: harbor"
            )
        if refusal := host_env_refusal(task.name, config, settings.trials.host_env):
            raise HostEnvNotAllowed(refusal)
        environ = settings.host_environ
        solution = getattr(engine, "needs_solution", False)
        task_env, agent_env = _task_env(task, config, environ, solution=solution)
        steps: list[tuple[StepConfig | None, TaskDir]] = [(step, task.step(step.name)) for step in config.steps]
        steps = steps or [(None, task)]
        timeouts = [trial_timeouts(config, settings, step) for step, _ in steps]
        agent_timeout = sum(a for a, _ in timeouts)
        verifier_timeout = sum(v for _, v in timeouts) if settings.verify else 0.0
        # the sandbox's watchdog bounds the whole trial: agents, verifiers and a margin
        limits = replace(settings.limits, wall_seconds=agent_timeout + verifier_timeout + 60)
        # in a thread: podman may build the task's image first
        with await thread(
            open_sandbox,
            task,
            workdir,
            backend=settings.trials.sandbox,
            limits=limits,
            with_solution=solution,
            cleanup=True,
        ) as box:
            for (step, view), (a_timeout, v_timeout) in zip(steps, timeouts, strict=True):
                run = StepRun(step.name if step is not None else None)
                runs.append(run)
                try:
                    if step is not None:
                        await thread(box.begin_step, view)
                        await _step_setup(box, view, step.name, a_timeout, agent_env, thread)
                    verifier_env = {**task_env, **config.verifier.env, **(step.verifier.env if step else {})}
                    seed_key = f"{run_id}:{task_id}:{sample_idx}" + (f":{step.name}" if step else "")
                    await _run_step(
                        box,
                        view,
                        engine,
                        settings,
                        run,
                        a_timeout,
                        v_timeout if settings.verify else 0.0,
                        agent_env,
                        verifier_env,
                        seed_key,
                        thread,
                    )
                except TaskSetupError as e:
                    _setup_failed(run, e)
                if run.stop in (CONTEXT_EXCEEDED, DISK_EXCEEDED, SETUP_FAILED) or (
                    step and settings.verify and _below(run.rewards, step.min_reward)
                ):
                    break
        reward = _trial_reward(runs, config.multi_step_reward_strategy)
        if not settings.verify:
            details["unverified_reason"] = UNVERIFIED_REASON
    except TaskSetupError as e:  # its files cannot be laid out in a fresh trial root
        runs.append(_setup_failed(StepRun(), e))
        reward = 0.0
    except INFRASTRUCTURE_ERRORS as e:
        exception = type(e).__name__
        details["exception_message"] = str(e)[:2000]
    finally:
        thread.close()
    last = runs[-1] if runs else StepRun()
    if runs and runs[0].name is not None:  # a multi-step task
        details["steps"] = _step_records(runs, settings)
        if verified := [r.details["verifier_s"] for r in runs if "verifier_s" in r.details]:
            details["verifier_s"] = round(sum(verified), 3)
    else:
        details.update(last.details)
    completions = [c for r in runs for c in r.completions]
    return _trace_row(
        task,
        task_id,
        engine,
        started,
        t0,
        _conversation_of(runs, settings),
        completions,
        reward,
        exception,
        {"stop_reason": last.stop, "verifier_timeout_sec": verifier_timeout, **details},
        last.stop == TIMEOUT,
        agent_timeout,
        sample_idx,
        run_id,
        source,
        failure=last.failure,
    )


async def _run_step(
    box,
    task: TaskDir,
    engine,
    settings: TrialSettings,
    run: StepRun,
    agent_timeout: float,
    verifier_timeout: float,
    agent_env: dict[str, str],
    verifier_env: dict[str, str],
    seed_key: str,
    thread: TrialThread,
) -> None:
    """The agent on `task`'s instruction, then (with `settings.verify`) its verifier, into `run`."""
    # the verifier's sandbox started now, its command run after the agent
    environ = settings.host_environ
    verifier = await thread(_park_verifier, box, verifier_env, environ) if settings.verify else None
    try:
        run.stop = await _agent(
            box,
            task,
            engine,
            settings,
            agent_timeout,
            run.messages,
            run.completions,
            env=agent_env,
            seed_key=seed_key,
            keep=verifier,
            thread=thread,
        )
    except ContextLengthExceededError as e:
        run.stop, run.failure, run.details["stop_message"] = CONTEXT_EXCEEDED, type(e).__name__, str(e)[:2000]
    finally:
        box.kill_all(keep=verifier)  # nothing the agent started survives into the verifier
    if run.stop == CONTEXT_EXCEEDED:
        run.rewards = {"reward": 0.0}  # the model can go no further: a failed task, unverified as in Harbor
    elif settings.verify and not box.disk_exceeded:
        reward, extra = await _verify(box, verifier_timeout, verifier_env, environ, verifier, thread)
        numbers = {k: float(v) for k, v in extra.get("reward_json", {}).items() if isinstance(v, (int, float))}
        run.rewards = numbers or (None if reward is None else {"reward": reward})
        run.details.update(extra)
    if box.disk_exceeded:  # the trial filled its writable space: everything was killed
        run.stop, run.failure, run.rewards = DISK_EXCEEDED, "DiskLimitExceededError", {"reward": 0.0}
        run.details["stop_message"] = (
            f"the trial reached its disk limit of {box.limits.storage_mb} MB "
            "(task.toml storage_mb, else limits.storage_mb); every process was killed"
        )


def _setup_failed(run: StepRun, error: TaskSetupError) -> StepRun:
    """`run` ended because the task's files could not be put in place (what an earlier step left
    is in their way, or its layout is): a task failure of this trial, reward 0, never retried."""
    run.stop, run.failure, run.rewards = SETUP_FAILED, type(error).__name__, {"reward": 0.0}
    run.details["stop_message"] = str(error)[:2000]
    return run


async def _step_setup(box, step: TaskDir, name: str, timeout: float, env: dict[str, str], thread: TrialThread) -> None:
    """The step's staged workdir/setup.sh, run in the working dir before its agent, as Harbor."""
    if f"{WORKDIR}/setup.sh" not in step.files:
        return
    result = await thread(box.run, ["bash", f"{box.workdir.rstrip('/')}/setup.sh"], timeout=timeout, env=env)
    if result.exit_code != 0 or result.timed_out:
        raise StepSetupError(
            f"task {step.name!r}: step {name!r}: workdir/setup.sh "
            f"{'timed out' if result.timed_out else f'exited {result.exit_code}'}; "
            f"its output ends: {result.output[-1500:]}"
        )


def _below(rewards: dict | None, min_reward: float | dict | None) -> bool:
    """Whether a step's rewards miss its `min_reward` (a number: the "reward" key; a table:
    each key), a missing reward or key counting as below, as Harbor."""
    if min_reward is None:
        return False
    thresholds = min_reward if isinstance(min_reward, dict) else {"reward": min_reward}
    return any((rewards or {}).get(k, float("-inf")) < v for k, v in thresholds.items())


def _trial_reward(runs: list[StepRun], strategy: str) -> float | None:
    """One step's reward; several steps' by Harbor's strategy: `final`, the last step run's;
    `mean`, each key's mean over the steps with a verdict (a missing key counts 0)."""
    if len(runs) == 1 or strategy == FINAL:
        return runs[-1].reward if runs else None
    judged = [r.rewards for r in runs if r.rewards is not None]
    if not judged:
        return None
    keys = {k for rewards in judged for k in rewards}
    return StepRun(rewards={k: sum(r.get(k, 0) for r in judged) / len(judged) for k in keys}).reward


def _step_records(runs: list[StepRun], settings: TrialSettings) -> list[dict]:
    """The trace metadata's `steps`: per step its name, reward (and reward.json's values), turns,
    where its conversation starts in the trace's, and why it stopped."""
    out, first = [], 0
    for r in runs:
        n = len(_conversation(r.messages, r.completions, settings))
        out.append(
            {
                "name": r.name,
                "reward": r.reward,
                "rewards": r.rewards,
                "n_turns": len(r.completions),
                "first_message": first,
                "stop_reason": r.stop,
                **{k: v for k, v in r.details.items() if k != "reward_json"},
            }
        )
        first += n
    return out


def _conversation_of(runs: list[StepRun], settings: TrialSettings) -> list[dict]:
    """The trace's conversation: each step's in order."""
    return [m for r in runs for m in _conversation(r.messages, r.completions, settings)]


VERIFIER = ["bash", "/tests/test.sh"]


def _task_env(
    task: TaskDir, config: TaskConfig, environ: dict[str, str], *, solution: bool
) -> tuple[dict[str, str], dict[str, str]]:
    """`[environment].env` (every phase's processes, as Harbor's environment has it) and the
    agent's: that plus, for the oracle replaying solve.sh, `[solution].env`; host `${VAR}`s
    resolved from `environ` (the recipe's host_env). TaskEnvError naming the task, the table and
    VAR when the host lacks one."""
    try:
        task_env = resolve_env(config.environment.env, environ, "[environment].env")
        extra = resolve_env(config.solution_env, environ, "[solution].env") if solution else {}
    except KeyError as e:
        raise TaskEnvError(f"task {task.name!r}: {e.args[0]}") from None
    return task_env, {**task_env, **extra}


def _park_verifier(box, env: dict[str, str], environ: dict[str, str]):
    """The verifier's sandbox, started now and held until `_verify` (Sandbox.park); None where
    the backend holds none or the task's verifier env cannot be resolved (`_verify` says why)."""
    try:
        env = resolve_env(env, environ)
    except KeyError:
        return None
    return box.park(VERIFIER, with_tests=True, env=env)


async def _verify(
    box, timeout: float, env: dict[str, str], environ: dict[str, str], parked, thread: TrialThread
) -> tuple[float | None, dict]:
    """tests/test.sh with the task's `[verifier].env` (host `${VAR}`s resolved, as Harbor)."""
    started = time.monotonic()
    if parked is not None:
        result = await thread(parked.run, timeout)
    else:
        try:
            env = resolve_env(env, environ)
        except KeyError as e:
            raise VerifierEnvError(e.args[0]) from None
        result = await thread(box.run, VERIFIER, timeout=timeout, with_tests=True, env=env)
    seconds = {"verifier_s": round(time.monotonic() - started, 3)}  # what teacher.verify: false saves
    if result.timed_out:
        raise VerifierTimeoutError(f"verifier exceeded {timeout}s")
    try:
        value = read_reward(box.root)
    except ValueError as e:
        raise VerifierOutputParseError(str(e)) from e
    if value is None:
        raise RewardFileNotFoundError(
            f"the verifier (exit {result.exit_code}) wrote no /logs/verifier/reward.txt "
            f"or reward.json; its output ends: {result.output[-1500:]}"
        )
    reward, extra = _reward(value)
    return reward, {**extra, **seconds}


def effective_timeout(base_sec: float | None, multiplier: float, cap_sec: float) -> float:
    """Timeout-aware evaluation as in the paper: a per-model multiplier (e.g. 2 for 8B, 16 for
    32B) on the task's own timeout, capped (e.g. 2 h): min(cap, base x multiplier); no base
    (a task without a limit of its own, as Harbor's agent by default): the cap."""
    return cap_sec if base_sec is None else min(cap_sec, base_sec * multiplier)


def trial_timeouts(config: TaskConfig, settings: TrialSettings, step: StepConfig | None = None) -> tuple[float, float]:
    """The agent's and the verifier's limits, in seconds. As Harbor: the agent has none of the
    task's own unless `[agent] timeout_sec` (or the recipe's agent_timeout_sec) sets one, the
    verifier `[verifier] timeout_sec` (600 s by default), and the recipe's timeout_multiplier
    scales both; unlike Harbor, both are capped by timeout_cap_sec, so no trial is unbounded.
    A step's agent has the step's `[steps.agent] timeout_sec`, else the task's; its verifier
    the step's own (600 s unless set)."""
    trials = settings.trials
    agent = step.agent.timeout_sec if step and step.agent.timeout_sec is not None else config.agent.timeout_sec
    verifier = (step or config).verifier.timeout_sec
    return (
        effective_timeout(trials.agent_timeout_sec or agent, trials.timeout_multiplier, trials.timeout_cap_sec),
        effective_timeout(settings.verifier_timeout_sec or verifier, trials.timeout_multiplier, trials.timeout_cap_sec),
    )


def not_runnable_trace(
    task: TaskDir, task_id: str, engine, *, sample_idx: int = 0, run_id: str = "", source: str = ""
) -> dict:
    """The row for a task that needs its container image: recorded as an infrastructure
    exception (the trace filter drops it with that reason), never run on the host."""
    return _trace_row(
        task,
        task_id,
        engine,
        datetime.now(UTC),
        time.monotonic(),
        [],
        [],
        None,
        "TaskNotRunnableLocally",
        {
            "exception_message": "the task needs its container image; run "
            "it with sandbox: podman or auto, or through harbor"
        },
        False,
        0.0,
        sample_idx,
        run_id,
        source,
    )


def _trace_row(
    task,
    task_id,
    engine,
    started,
    t0,
    conversations,
    completions,
    reward,
    exception,
    details,
    timed_out,
    agent_timeout,
    sample_idx,
    run_id,
    source,
    *,
    failure=None,
) -> dict:
    """`failure` names a task failure that is not a wrong answer (ContextLengthExceededError):
    the row's `result`, as in Harbor's export."""
    episodes = len(completions)
    return {
        "conversations": conversations,
        "agent": "terminus-2",
        "model": engine.model,
        "model_provider": engine.provider,
        "date": started.isoformat(timespec="seconds"),
        "task": task.name,
        "episode": f"episode-{max(episodes - 1, 0)}",
        "run_id": run_id,
        "trial_name": f"{task.name}__{sample_idx}__{run_id[:8]}",
        "result": exception or failure or ("" if reward is None else reward_text(reward)),
        "task_id": task_id,
        "source": source,
        "teacher": f"{engine.name}:{engine.model}",
        "sample_idx": sample_idx,
        "n_turns": sum(1 for m in conversations if m["role"] == "assistant"),
        "reward": reward,
        "timed_out": timed_out,
        "exception": exception,
        "is_subagent": False,
        "n_input_tokens": sum(c.n_input_tokens for c in completions),
        "n_output_tokens": sum(c.n_output_tokens for c in completions),
        "duration_s": round(time.monotonic() - t0, 3),
        "metadata": json.dumps(
            {"agent_timeout_sec": agent_timeout, "episodes": episodes, **details, **_engine_version(engine)},
            sort_keys=True,
            default=str,
        ),
    }


def _engine_version(engine) -> dict:
    """{"engine_version": ...} of an engine that knows its release (a managed server's)."""
    version = getattr(engine, "version", None)
    return {"engine_version": version} if isinstance(version, str) else {}


def request_seed(seed_key: str, turn: int) -> int:
    """The sampling seed of a trial's request `turn` for an engine that takes one per request
    (`seeds_requests`: otbuild's own models, whose sampling is then the same whichever trial asks
    first): from the run, the task, the sample and the turn alone."""
    return int(hashlib.sha256(f"{seed_key}:{turn}".encode()).hexdigest()[:8], 16)


async def _agent(
    box,
    task: TaskDir,
    engine,
    settings: TrialSettings,
    timeout: float,
    messages: list[dict],
    completions: list[Completion],
    *,
    env: dict[str, str],
    seed_key: str,
    keep,
    thread: TrialThread,
) -> str:
    """Terminus-2 turns, recorded in `messages` and `completions`. Returns why they stopped;
    a context overflow raises ContextLengthExceededError. `keep`: the parked verifier, which
    ending the terminal leaves be. `env`: the task's variables in the agent's shell."""
    deadline = time.monotonic() + timeout
    style = protocol.prompt_style(settings.prompt)
    term = await thread(_open_terminal, box, env)
    try:
        screen = await thread(term.read, SETTLE_SECONDS)
        messages.append({"role": "user", "content": style.first_prompt(task.instruction, screen)})
        pending_complete = False
        for turn in range(settings.trials.max_episodes):
            left = deadline - time.monotonic()
            if left <= 0:
                return TIMEOUT
            try:
                # the oracle reads the task's solution; a model's request gets the messages only
                extra = {"task": task, "style": style} if getattr(engine, "needs_solution", False) else {}
                if getattr(engine, "seeds_requests", False):
                    extra["seed"] = request_seed(seed_key, turn)
                completion = await asyncio.wait_for(engine.complete(messages, **extra), left)
            except TimeoutError:
                return TIMEOUT
            completions.append(completion)
            messages.append({"role": "assistant", "content": completion.text})
            try:
                answer = protocol.parse_answer(completion.text)
            except protocol.ParseError as e:
                messages.append({"role": "user", "content": style.parse_error_reply(e)})
                continue
            if answer.task_complete and pending_complete:
                return DONE
            output = await _execute(term, answer.commands, deadline, thread)
            if not term.alive:
                messages.append({"role": "user", "content": style.observation_reply(output)})
                return SHELL_EXITED
            if answer.task_complete:
                pending_complete = True
                reply = style.confirm_reply(output)
            else:
                pending_complete = False
                reply = style.observation_reply(output)
            messages.append({"role": "user", "content": reply})
        return OUT_OF_EPISODES
    finally:
        await thread(_close_terminal, box, term, keep)


def _open_terminal(box, env: dict[str, str]) -> Terminal:
    try:
        term = Terminal(box.argv(["bash", "--noprofile", "--norc", "-i"], env={**env, **SHELL_ENV}, tty=True))
    except OSError as e:  # no pty or no fork left on the host
        raise SandboxError(f"could not start the agent's terminal: {e}") from e
    box.adopt(term.proc)  # kill_all ends it with its pid namespace: no /proc scan
    return term


def _close_terminal(box, term: Terminal, keep=None) -> None:
    """Everything the agent started ends with the terminal's namespace (kill_all), then the pty."""
    box.kill_all(keep=keep)
    term.close()


async def _execute(term: Terminal, commands: list[protocol.Command], deadline: float, thread: TrialThread) -> str:
    out = []
    for c in commands:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        term.send(c.keystrokes)
        out.append(await thread(term.read, min(c.duration, left)))
    if not commands:  # nothing to run: what the terminal already shows (as tmux would capture)
        out.append(term.read(0, False))
    return protocol.cap_output("".join(out))


def _reward(value) -> tuple[float | None, dict]:
    """reward.txt gives a float; reward.json a flat dict (its "reward", else the mean)."""
    if value is None or isinstance(value, (int, float)):
        return value, {}
    metrics = {k: float(v) for k, v in value.items() if isinstance(v, (int, float))}
    reward = metrics.get("reward", sum(metrics.values()) / len(metrics) if metrics else None)
    return reward, {"reward_json": value}


def _conversation(messages: list[dict], completions: list[Completion], settings: TrialSettings) -> list[dict]:
    """The trace's conversation, ending on the model's last answer; with `keep_reasoning`, an
    answer's reasoning goes before it as Harbor's export has it: <think>REASONING</think>\nTEXT."""
    answers = iter(completions)
    out = []
    for m in messages:
        content = m["content"]
        if m["role"] == "assistant":
            c = next(answers)
            content = assistant_turn(content, c.reasoning if settings.trials.keep_reasoning else None)
        out.append({"role": m["role"], "content": content})
    while out and out[-1]["role"] != "assistant":
        out.pop()
    return out
