"""The stage registry: every stage of the pipeline, in pipeline order, each declared by its own
module as `STAGE = StageDef(...)` (otbuild/stagekit/: what it writes, its implementation version,
its settings model, its recipe key, what kind of job it is, its estimate hook, and what the other
parts ask of it: the report's funnel, the rebuild's volatile fields, the counts an estimate is
checked on). A built-in stage is its module plus its line in BUILT_IN; a stage an installed
package adds is its module plus an entry point (otbuild/settings/added.py), loaded the same way.
Everything that treats stages differently (the Snakemake rules, job sizes, the preflight, the
estimate, the report, costs, rebuilds) asks this registry; tests/stages/test_registry.py fails
when a stage does not answer one of them. A stage imports neither another stage nor this registry
(tests/test_imports.py): its code, as the audit hashes it (otbuild/codehash.py), is its own.

Bump `version` by hand when a stage's output semantics change: it is part of every id of
that stage, so old artifacts are left alone and new ones are built beside them. Refactors
that keep the semantics do not bump it (the audit reports code drift instead).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from otbuild.settings.added import ENTRY_POINTS, added_stages
from otbuild.stagekit import StageDef

__all__ = ["STAGES", "StageDef", "input_name"]


# The built-in stages in pipeline order (the report's funnel shows its task and trace stages in
# this order): each is the module that declares it (its `STAGE`), loaded as an added stage's
# entry point is.
BUILT_IN: tuple[str, ...] = (
    "otbuild.stages.source",
    "otbuild.stages.augment",
    "otbuild.stages.mix",
    "otbuild.stages.near_dedup",
    # run each task: its solution passes, doing nothing fails (before the pilot and the paid LLM scoring)
    "otbuild.stages.task_check",
    "otbuild.stages.difficulty",
    "otbuild.stages.task_score",
    "otbuild.stages.skills",
    "otbuild.stages.task_filter",
    "otbuild.stages.trace_import",
    "otbuild.stages.rollout",
    "otbuild.stages.trace_filter",
    "otbuild.stages.sft",
    "otbuild.stages.rl",
    "otbuild.stages.eval",
    "otbuild.stages.rank",
    # a search's stage winner, from its ranking and its candidates' evals (docs/search.md)
    "otbuild.stages.decide",
    "otbuild.report",
)


def _declared(module: str) -> StageDef:
    """The StageDef a built-in stage's module declares (`STAGE`), made where it runs."""
    d = getattr(import_module(module), "STAGE", None)
    if not isinstance(d, StageDef) or d.module != module:
        raise ImportError(f"{module}: expected `STAGE = StageDef(..., module=__name__, ...)`, found {d!r}")
    return d


def _registered(built_in: tuple[StageDef, ...], added: tuple[Any, ...]) -> dict[str, StageDef]:
    """The built-in stages in their order, then those installed packages add (entry points in
    ENTRY_POINTS, each a StageDef), each placed after the stage it names."""
    out: dict[str, StageDef] = {}
    for d in (*built_in, *added):
        built = d in built_in
        if not isinstance(d, StageDef) or d.name in out or (not built and d.after not in out):
            raise ImportError(
                f"an entry point of {ENTRY_POINTS} names {d!r}: expected a StageDef with a new name "
                f"that follows a known stage (`after`: one of {', '.join(out)})"
            )
        names = list(out)
        names.insert(names.index(d.after) + 1 if not built else len(names), d.name)
        out = {n: out.get(n, d) for n in names}
    return out


def input_name(stage: str) -> str:
    """The name an input of `stage` goes by when the plan gives it none: the kind of data it
    produces (tasks, traces, checkpoint), else the stage's name."""
    d = STAGES.get(stage)
    return (d.produces if d else None) or stage


# an added stage's module imports what is above
STAGES: dict[str, StageDef] = _registered(tuple(_declared(m) for m in BUILT_IN), added_stages())
