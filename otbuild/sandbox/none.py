"""`none` backend: NO isolation. Commands run on the host, as the calling user, with the
trial's working dir as cwd and a clean environment; only rlimits apply. Paths such as /app
or /tests in a command are the host's, not the trial's. For debugging only."""

from __future__ import annotations

from otbuild.sandbox.spec import Invocation


def argv(inv: Invocation, host_cwd: str) -> list[str]:
    env = [f"{k}={v}" for k, v in inv.env.items()]
    return ["/usr/bin/env", "-i", "-C", host_cwd, *env, *inv.prefix, *inv.command]
