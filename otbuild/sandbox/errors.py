"""The sandbox's own failures. A trial records them as infrastructure exceptions (apart from
task failures); TaskSetupError, the task's own, as a task failure; anything else a trial raises
is a bug and propagates."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class SandboxError(RuntimeError):
    """The sandbox could not be set up, or could not start a command (not the command's own
    failure, which is its exit code)."""


class WallClockExceeded(SandboxError, TimeoutError):
    """A command was asked for after the trial's wall clock ran out."""


class TaskSetupError(Exception):
    """The task's files could not be put in place in its trial: what the trial left where they
    go (a link, a file where a folder goes, its disk full) or what the task lays out is the
    task's own doing, the same at every try. That trial's failure (otbuild/traces/outcome.py:
    a task failure), never an infrastructure error to retry."""


@contextmanager
def task_setup(task: str, what: str) -> Iterator[None]:
    """An OSError while putting task `task`'s files in its trial root (which its commands have
    written) is the task's: a TaskSetupError saying `what` failed."""
    try:
        yield
    except OSError as e:
        raise TaskSetupError(f"task {task!r}: {what}: {e}") from e
