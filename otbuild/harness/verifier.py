"""A trial's verifier: the task's tests/test.sh in a sandbox of its own, started beside the agent
and run after it, and the reward it writes (reward.txt, or reward.json's numbers)."""

from __future__ import annotations

import time

from otbuild.harness.config import StepPlan, TrialContext
from otbuild.harness.endings import (
    RewardFileNotFoundError,
    VerifierEnvError,
    VerifierOutputParseError,
    VerifierTimeoutError,
)
from otbuild.sandbox import read_reward
from otbuild.tasks.task_toml import resolve_env

VERIFIER = ["bash", "/tests/test.sh"]


def park_verifier(trial: TrialContext, step: StepPlan):
    """The verifier's sandbox, started now and held until `verify` (Sandbox.park); None where the
    backend holds none or the task's verifier env cannot be resolved (`verify` says why)."""
    try:
        env = resolve_env(step.verifier_env, trial.config.host_environ)
    except KeyError:
        return None
    return trial.box.park(VERIFIER, with_tests=True, env=env)


async def verify(trial: TrialContext, step: StepPlan, parked) -> tuple[float | None, dict]:
    """tests/test.sh with the task's `[verifier].env` (host `${VAR}`s resolved, as Harbor), in the
    sandbox `parked` holds (else a new one); the reward and what it says beside it."""
    box, timeout, started = trial.box, step.verifier_timeout, time.monotonic()
    if parked is not None:
        result = await trial.thread(parked.run, timeout)
    else:
        try:
            env = resolve_env(step.verifier_env, trial.config.host_environ)
        except KeyError as e:
            raise VerifierEnvError(e.args[0]) from None
        result = await trial.thread(box.run, VERIFIER, timeout=timeout, with_tests=True, env=env)
    seconds = {"verifier_s": round(time.monotonic() - started, 3)}  # what teacher.verify: false saves
    if keep := trial.config.verifier_output:  # the sandbox bounded it (limits.output_bytes); its tail
        seconds["verifier_output"] = result.output[-keep:]
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
    reward, extra = reward_of(value)
    return reward, {**extra, **seconds}


def reward_of(value) -> tuple[float | None, dict]:
    """reward.txt gives a float; reward.json a flat dict (its "reward", else the mean)."""
    if value is None or isinstance(value, (int, float)):
        return value, {}
    metrics = {k: float(v) for k, v in value.items() if isinstance(v, (int, float))}
    reward = metrics.get("reward", sum(metrics.values()) / len(metrics) if metrics else None)
    return reward, {"reward_json": value}
