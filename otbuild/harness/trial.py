"""One trial: a task, an engine, a sandbox; turns in the recipe's protocol (terminus-2's JSON
or native tool calls: `turns.py`) until the agent is done (`agent.py`), then the task's
verifier (`verifier.py`). Returns a trace row (`record.py`, otbuild/traces/table.py); what it
runs under is a `TrialConfig` (`config.py`).

Task failures (wrong answer, agent timeout, a conversation the model's context window no
longer holds, the trial's disk limit, task files that cannot be put in place because of what
an earlier step left: TaskSetupError) and errors (the sandbox would not start or cannot give
the task the network it asks for, the task's task.toml is not one Harbor accepts, the engine
failed after its retries, the verifier timed out or wrote a malformed reward) are kept apart
(`endings.py`): the latter set `exception` to the error's class name, which is also the row's
`result`; a task failure that is not a wrong answer names itself in `result` only. How each
way of ending is then classified, retried and counted is otbuild/traces/outcome.py
(docs/failures.md). An EndpointError (the model's endpoint refused the run:
otbuild/engines/endpoint.py) stops the rollout; any other exception is a bug and propagates.
"""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from otbuild.engines.base import ContextLengthExceededError
from otbuild.harness.agent import make_protocol, run_agent
from otbuild.harness.config import StepPlan, TrialConfig, TrialContext, TrialThread, trial_timeouts
from otbuild.harness.endings import (
    CONTEXT_EXCEEDED,
    DISK_EXCEEDED,
    INFRASTRUCTURE_ERRORS,
    SETUP_FAILED,
    TIMEOUT,
    HostEnvNotAllowed,
    StepSetupError,
    TaskEnvError,
    TaskKeyNotSupported,
)
from otbuild.harness.record import StepRun, TrialRecord, conversation_of, step_records
from otbuild.harness.slots import TrialSlot
from otbuild.harness.verifier import park_verifier, verify
from otbuild.sandbox import TaskSetupError, open_sandbox
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
from otbuild.tasks.taskdir import WORKDIR, TaskDir
from otbuild.traces.outcome import UNVERIFIED_REASON


async def run_trial(
    task: TaskDir,
    task_id: str,
    engine,
    trial_config: TrialConfig,
    workdir: Path,
    *,
    sample_idx: int = 0,
    run_id: str = "",
    source: str = "",
    slot: TrialSlot | None = None,
) -> dict:
    """One trial. A multi-step task (`[[steps]]`) runs its steps in order in one sandbox, as
    Harbor does: each step a fresh conversation on the step's instruction, then the step's
    verifier; a step below its `min_reward` ends the trial; the trial's reward is the steps'
    by `multi_step_reward_strategy`, each step's kept in the trace's metadata (`steps`).
    `slot`: the trial's agent slot (otbuild/harness/slots.py), taken when its first request is
    ready and handed back when its last step's agent has ended, before that step's verifier."""
    record = TrialRecord(
        task, task_id, engine, datetime.now(UTC), time.monotonic(), sample_idx=sample_idx, run_id=run_id, source=source
    )
    record.protocol = trial_config.protocol
    record.tools = make_protocol(trial_config.protocol, trial_config.prompt).tools
    runs: list[StepRun] = []
    verifier_timeout = 0.0
    verify_on = trial_config.verify
    thread = TrialThread()
    try:
        config = task_config(task)  # a task.toml Harbor would refuse is this trial's exception
        if unsupported := harness_unsupported(config):
            raise TaskKeyNotSupported(
                f"task {task.name!r}: task.toml {', '.join(unsupported)} ({unsupported_reason(unsupported[0])}) "
                "is not run by otbuild's harness; run the task with sandbox: harbor"
            )
        if refusal := host_env_refusal(task.name, config, trial_config.trials.host_env):
            raise HostEnvNotAllowed(refusal)
        solution = getattr(engine, "needs_solution", False)
        task_env, agent_env = _task_env(task, config, trial_config.host_environ, solution=solution)
        steps: list[tuple[StepConfig | None, TaskDir]] = [(step, task.step(step.name)) for step in config.steps]
        steps = steps or [(None, task)]
        timeouts = [trial_timeouts(config, trial_config, step) for step, _ in steps]
        record.agent_timeout = sum(a for a, _ in timeouts)
        verifier_timeout = sum(v for _, v in timeouts) if verify_on else 0.0
        # the sandbox's watchdog bounds the whole trial: agents, verifiers and a margin
        limits = replace(trial_config.limits, wall_seconds=record.agent_timeout + verifier_timeout + 60)
        # in a thread: podman may build the task's image first
        with await thread(
            open_sandbox,
            task,
            workdir,
            backend=trial_config.trials.sandbox,
            limits=limits,
            with_solution=solution,
            cleanup=True,
        ) as box:
            trial = TrialContext(box, engine, trial_config, thread, slot)
            for k, ((step, view), (a_timeout, v_timeout)) in enumerate(zip(steps, timeouts, strict=True)):
                run = StepRun(step.name if step is not None else None)
                runs.append(run)
                plan = StepPlan(
                    view,
                    a_timeout,
                    v_timeout if verify_on else 0.0,
                    agent_env,
                    {**task_env, **config.verifier.env, **(step.verifier.env if step else {})},
                    f"{run_id}:{task_id}:{sample_idx}" + (f":{step.name}" if step else ""),
                )
                try:
                    if step is not None:
                        await thread(box.begin_step, view)
                        await _step_setup(trial, plan, step.name)
                    await _run_step(trial, plan, run, last=k == len(steps) - 1)
                except TaskSetupError as e:
                    _setup_failed(run, e)
                if run.stop in (CONTEXT_EXCEEDED, DISK_EXCEEDED, SETUP_FAILED) or (
                    step and verify_on and _below(run.rewards, step.min_reward)
                ):
                    break
        record.reward = _trial_reward(runs, config.multi_step_reward_strategy)
        if not verify_on:
            record.details["unverified_reason"] = UNVERIFIED_REASON
    except TaskSetupError as e:  # its files cannot be laid out in a fresh trial root
        runs.append(_setup_failed(StepRun(), e))
        record.reward = 0.0
    except INFRASTRUCTURE_ERRORS as e:
        record.exception = type(e).__name__
        record.details["exception_message"] = str(e)[:2000]
    finally:
        thread.close()
    last = runs[-1] if runs else StepRun()
    keep_reasoning = trial_config.trials.keep_reasoning
    if runs and runs[0].name is not None:  # a multi-step task
        record.details["steps"] = step_records(runs, keep_reasoning)
        if verified := [r.details["verifier_s"] for r in runs if "verifier_s" in r.details]:
            record.details["verifier_s"] = round(sum(verified), 3)
    else:
        record.details.update(last.details)
    record.details = {"stop_reason": last.stop, "verifier_timeout_sec": verifier_timeout, **record.details}
    record.conversations = conversation_of(runs, keep_reasoning)
    record.completions = [c for r in runs for c in r.completions]
    record.timed_out, record.failure = last.stop == TIMEOUT, last.failure
    return record.trace_row()


async def _run_step(trial: TrialContext, step: StepPlan, run: StepRun, *, last: bool = True) -> None:
    """The agent on the step's instruction, then (with `verify`) its verifier, into `run`; after
    the `last` step's agent the trial's agent slot is handed back."""
    box, verify_on = trial.box, trial.config.verify
    # the verifier's sandbox started now, its command run after the agent
    verifier = await trial.thread(park_verifier, trial, step) if verify_on else None
    try:
        run.stop = await run_agent(trial, step, run, keep=verifier)
    except ContextLengthExceededError as e:
        run.stop, run.failure, run.details["stop_message"] = CONTEXT_EXCEEDED, type(e).__name__, str(e)[:2000]
    finally:
        box.kill_all(keep=verifier)  # nothing the agent started survives into the verifier
        if last and trial.slot is not None:
            trial.slot.agents_done()
    if run.stop == CONTEXT_EXCEEDED:
        run.rewards = {"reward": 0.0}  # the model can go no further: a failed task, unverified as in Harbor
    elif verify_on and not box.disk_exceeded:
        reward, extra = await verify(trial, step, verifier)
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


async def _step_setup(trial: TrialContext, step: StepPlan, name: str) -> None:
    """The step's staged workdir/setup.sh, run in the working dir before its agent, as Harbor."""
    box = trial.box
    if f"{WORKDIR}/setup.sh" not in step.task.files:
        return
    result = await trial.thread(
        box.run, ["bash", f"{box.workdir.rstrip('/')}/setup.sh"], timeout=step.agent_timeout, env=step.agent_env
    )
    if result.exit_code != 0 or result.timed_out:
        raise StepSetupError(
            f"task {step.task.name!r}: step {name!r}: workdir/setup.sh "
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


def not_runnable_trace(
    task: TaskDir,
    task_id: str,
    engine,
    *,
    sample_idx: int = 0,
    run_id: str = "",
    source: str = "",
    protocol: str = "terminus2",
) -> dict:
    """The row for a task that needs its container image: recorded as an infrastructure
    exception (the trace filter drops it with that reason), never run on the host."""
    return TrialRecord(
        task,
        task_id,
        engine,
        datetime.now(UTC),
        time.monotonic(),
        sample_idx=sample_idx,
        run_id=run_id,
        source=source,
        exception="TaskNotRunnableLocally",
        protocol=protocol,
        details={
            "exception_message": "the task needs its container image; run "
            "it with sandbox: podman or auto, or through harbor"
        },
    ).trace_row()
