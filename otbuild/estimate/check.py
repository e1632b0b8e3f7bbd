"""The estimate against the profile: a job whose estimated time exceeds what the profile grants
it (runtime x attempts) is flagged before anything runs, with what would make it fit: more
attempts for a stage that resumes, more GPUs or shards, or a longer runtime."""

from __future__ import annotations

import math

from otbuild.estimate.model import Job, StageEstimate
from otbuild.stages import STAGES

RETRIES_WHERE = "profiles/default/config.yaml `retries` (its keys win), or `--retries N` on the command line"


def profile_flags(stages: list[StageEstimate]) -> list[str]:
    flags = []
    for e in stages:
        for j in e.jobs:
            if (text := _flag(e, j)) is not None:
                flags.append(text)
    return flags


def _hours(s: float) -> str:
    return f"{s / 3600:,.1f} h" + (f" ({s / 86400:,.1f} days)" if s >= 2 * 86400 else "")


def _flag(e: StageEstimate, j: Job) -> str | None:
    g = j.grant
    if g.runtime_s is None:
        return None
    need, granted = j.seconds.estimate, g.runtime_s * g.attempts
    if need <= granted:
        if j.seconds.high > granted:
            return (
                f"{e.label}: a {j.rule} job takes about {_hours(need)}, within the {_hours(granted)} the "
                f"profile grants ({g.runtime_where}, {g.attempts} attempt(s)), but up to {_hours(j.seconds.high)} "
                "at the high end of its range"
            )
        return None
    what = (
        f"{e.label}: a {j.rule} job takes about {_hours(need)}"
        + (f" ({j.seconds.estimate * g.gpus / 3600:,.0f} GPU-hours on {g.gpus} GPUs)" if g.gpus else "")
        + f", more than the {_hours(g.runtime_s)} x {g.attempts} attempt(s) = {_hours(granted)} the profile grants "
        f"it ({g.runtime_where})"
    )
    fixes = []
    d = STAGES[e.stage]
    if (d.sharded or d.training) and not j.rule.endswith("_merge"):  # they resume where a killed job stopped
        attempts = math.ceil(need / g.runtime_s)
        fixes.append(
            f"it resumes where a killed job stopped, so {attempts} attempts of {g.runtime_s / 3600:g} h "
            f"would finish it: retries: {attempts - 1} ({RETRIES_WHERE})"
        )
    if STAGES[e.stage].training and g.gpus:
        gpus = math.ceil(g.gpus * need / granted)
        per_node = max(g.gpus // max(g.nodes, 1), 1)
        nodes = math.ceil(gpus / per_node)
        fixes.append(
            f"{nodes * per_node} GPUs (nodes: {nodes} of {per_node}) finish it in {g.attempts} attempt(s), "
            "if it scales linearly"
        )
    if STAGES[e.stage].sharded and not j.rule.endswith("_merge"):
        shards = math.ceil(j.count * need / granted)
        fixes.append(f"shards: {shards} (each job does less)")
    fixes.append(f"runtime: {math.ceil(need / g.attempts / 60)} minutes per attempt")
    return f"{what}. To fit: {'; or '.join(fixes)}."
