"""The sandbox's own failures. A trial records them as infrastructure exceptions (apart from
task failures); anything else a trial raises is a bug and propagates."""


class SandboxError(RuntimeError):
    """The sandbox could not be set up, or could not start a command (not the command's own
    failure, which is its exit code)."""


class WallClockExceeded(SandboxError, TimeoutError):
    """A command was asked for after the trial's wall clock ran out."""
