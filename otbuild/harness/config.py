"""What a trial runs under (`TrialConfig`: a recipe's trial section, the harness's prompt style,
the verifier's options), the agent's and the verifier's timeouts that follow from it and the
task, and the records the parts of a trial share while it runs: its sandbox, engine and thread
(`TrialContext`) and one step's plan (`StepPlan`)."""

from __future__ import annotations

import asyncio
import functools
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from otbuild.sandbox import Limits
from otbuild.settings.trials import Trials
from otbuild.tasks.task_toml import StepConfig, TaskConfig
from otbuild.tasks.taskdir import TaskDir


@dataclass(frozen=True)
class TrialConfig:
    """What a trial runs under: a recipe's trial section (teacher, eval or rl.sandbox: one
    declaration, otbuild/settings/trials.py), the harness prompt style (harness.prompt) and its
    protocol (harness.protocol)."""

    trials: Trials
    prompt: str
    protocol: str = "terminus2"  # settings.recipe.PROTOCOLS
    verifier_timeout_sec: float | None = None  # None: the task's [verifier] timeout_sec (scaled and capped alike)
    verify: bool = True  # False: the verifier is not run (teacher.verify), the reward stays unknown
    # the last this many characters of the verifier's output go into the trace's metadata
    # (`verifier_output`: the task's text, kept as data); 0: none (rollouts, eval)
    verifier_output: int = 0

    @property
    def limits(self) -> Limits:
        return Limits(**self.trials.limits.model_dump(), build_network=self.trials.build_network)

    @property
    def host_environ(self) -> dict[str, str]:
        """What a task's `${VAR}` may read of this process's environment: the recipe's `host_env`."""
        return {name: os.environ[name] for name in self.trials.host_env if name in os.environ}


def effective_timeout(base_sec: float | None, multiplier: float, cap_sec: float) -> float:
    """Timeout-aware evaluation as in the paper: a per-model multiplier (e.g. 2 for 8B, 16 for
    32B) on the task's own timeout, capped (e.g. 2 h): min(cap, base x multiplier); no base
    (a task without a limit of its own, as Harbor's agent by default): the cap."""
    return cap_sec if base_sec is None else min(cap_sec, base_sec * multiplier)


def trial_timeouts(config: TaskConfig, trial: TrialConfig, step: StepConfig | None = None) -> tuple[float, float]:
    """The agent's and the verifier's limits, in seconds. As Harbor: the agent has none of the
    task's own unless `[agent] timeout_sec` (or the recipe's agent_timeout_sec) sets one, the
    verifier `[verifier] timeout_sec` (600 s by default), and the recipe's timeout_multiplier
    scales both; unlike Harbor, both are capped by timeout_cap_sec, so no trial is unbounded.
    A step's agent has the step's `[steps.agent] timeout_sec`, else the task's; its verifier
    the step's own (600 s unless set)."""
    trials = trial.trials
    agent = step.agent.timeout_sec if step and step.agent.timeout_sec is not None else config.agent.timeout_sec
    verifier = (step or config).verifier.timeout_sec
    return (
        effective_timeout(trials.agent_timeout_sec or agent, trials.timeout_multiplier, trials.timeout_cap_sec),
        effective_timeout(trial.verifier_timeout_sec or verifier, trials.timeout_multiplier, trials.timeout_cap_sec),
    )


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


@dataclass(frozen=True)
class TrialContext:
    """A trial under way: its sandbox (`box`), the engine that answers, what it runs under, the
    thread its blocking calls go to and its agent slot (otbuild/harness/slots.py; None: none to
    wait for)."""

    box: Any
    engine: Any
    config: TrialConfig
    thread: TrialThread
    slot: Any = None


@dataclass(frozen=True)
class StepPlan:
    """One step of a trial, as it is to run (a single-step task is one step without a name): the
    task as the step sees it, its agent's and verifier's limits (verifier 0: not verified), the
    environments of its agent's and its verifier's processes, and the key of its requests' seeds."""

    task: TaskDir
    agent_timeout: float
    verifier_timeout: float
    agent_env: dict[str, str]
    verifier_env: dict[str, str]
    seed_key: str
