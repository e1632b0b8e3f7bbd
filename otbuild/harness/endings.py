"""How a trial ends: why its agent stopped (the trace's `metadata.stop_reason`) and the errors it
records as its `exception` (outcome infrastructure or verifier_error: otbuild/traces/outcome.py,
docs/failures.md). Anything else a trial raises is a bug and propagates."""

from __future__ import annotations

from otbuild.engines.base import EngineError
from otbuild.sandbox import SandboxError
from otbuild.tasks.taskdir import TaskFormatError


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
