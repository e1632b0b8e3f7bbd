"""Decide: the winner of one stage of a search (docs/search.md), from that stage's ranking and
its candidates' eval summaries.

The leader is the ranking's first (the recipe's `rank_by`, cross-benchmark z-score). It wins
when it is separated from the runner-up: its score (the mean over benchmarks of `rank_by`'s
mean) leads by more than `margin_se` standard errors of the difference, and each of the two was
scored on at least `min_trials` trials. Otherwise the stage is undecided and keeps its default
candidate, saying why; with `strict` an undecided stage fails the job instead. An incomplete
candidate (a benchmark without a score) is never the leader.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from pydantic import Field

from otbuild.errors import StageError
from otbuild.fsio import atomic_path
from otbuild.settings.base import Strict
from otbuild.settings.recipe import Decision, RankBy
from otbuild.stagekit import Inputs, StageDef, stage_run
from otbuild.stagekit.metrics import METRICS

DECISION = "decision.json"


class SearchCandidate(Strict):
    """A candidate of a search stage: its name and the values it sets."""

    name: str
    values: dict[str, Any]  # setting path -> this candidate's value


class DecideSettings(Decision):
    """One stage of a search: the recipe's decision rules, its candidates (in the order of its
    eval inputs) and the one kept when the stage is undecided."""

    step: int = Field(ge=1)  # the search stage, from 1
    candidates: list[SearchCandidate] = Field(min_length=1)
    default: str
    metric: RankBy = "pass_at_1"


@stage_run
def run(cfg: DecideSettings, inputs: Inputs, outdir: Path) -> dict:
    decision = derive(cfg, inputs)
    if cfg.strict and not decision["decided"]:
        raise StageError(
            f"search stage {cfg.step} is undecided ({decision['reason']}) and decision.strict is "
            "true: widen the grid's gap, score more trials, or set decision.strict: false"
        )
    with atomic_path(outdir / DECISION) as tmp:
        tmp.write_text(json.dumps(decision, indent=2, sort_keys=True) + "\n")
    return {k: decision[k] for k in ("step", "winner", "decided", "reason", "margin")}


def derive(cfg: DecideSettings, inputs: Inputs) -> dict:
    """The decision from the stage's ranking and its candidates' eval summaries (`otbuild audit`
    derives it again from the same artifacts)."""
    [ranking] = inputs.named("rank")
    evals = inputs.named("eval")
    if len(evals) != len(cfg.candidates):
        raise StageError(f"decide: {len(cfg.candidates)} candidates but {len(evals)} eval inputs")
    ranked = {r["candidate"]: r for r in pq.read_table(ranking).to_pylist()}
    rows = [
        _candidate(c.name, c.values, ranked.get(c.name, {}), path, cfg.metric)
        for c, path in zip(cfg.candidates, evals, strict=True)
    ]
    rows.sort(key=lambda r: (r["rank"] is None, r["rank"] or 0, r["name"]))
    return decide(cfg, rows)


def decide(cfg: DecideSettings, rows: list[dict]) -> dict:
    """The decision over candidates `rows` (ranking order: rank 1 first, unranked last)."""
    default = next(r for r in rows if r["name"] == cfg.default)
    leader, runner = rows[0], (rows[1] if len(rows) > 1 else None)
    margin = None
    if runner is None:
        decided, reason = True, "one candidate"
    elif leader["rank"] is None:
        decided, reason = False, "no candidate has a score on every benchmark"
    elif (fewest := min(leader["trials"], runner["trials"])) < cfg.min_trials:
        decided, reason = False, f"{fewest} scored trials, fewer than decision.min_trials ({cfg.min_trials})"
    else:
        margin = _margin(leader, runner)
        decided = margin > cfg.margin_se
        lead = (
            "leads with exact scores (standard error 0)"
            if math.isinf(margin)
            else f"leads by {margin:.2f} standard errors"
        )
        reason = (
            f"{lead}, more than decision.margin_se ({cfg.margin_se:g})"
            if decided
            else f"{lead}, not more than decision.margin_se ({cfg.margin_se:g})"
        )
        margin = margin if math.isfinite(margin) else None
    winner = leader if decided else default
    return {
        "step": cfg.step,
        "winner": winner["name"],
        "values": winner["values"],
        "decided": decided,
        "reason": reason,
        "margin": margin,
        "leader": leader["name"],
        "default": cfg.default,
        "metric": cfg.metric,
        "rules": {"min_trials": cfg.min_trials, "margin_se": cfg.margin_se},
        "candidates": rows,
    }


def _candidate(name: str, values: dict, ranked: dict, summary: Path, metric: str) -> dict:
    """A candidate's rank and mean z (from the ranking), its score, the score's standard error
    and its scored trials (from its eval summary)."""
    column, error = METRICS[metric]
    rows = pq.read_table(summary).to_pylist()
    means = [r.get(column) for r in rows]
    errors = [r.get(error) for r in rows]
    score = sum(means) / len(means) if rows and None not in means else None
    stderr = math.sqrt(sum(e * e for e in errors)) / len(errors) if rows and None not in errors else None
    trials = sum(int(r.get("repeats") or 0) * int(r.get("n_tasks") or 0) - int(r.get("n_excluded") or 0) for r in rows)
    return {
        "name": name,
        "values": values,
        "rank": ranked.get("rank"),
        "mean_z": ranked.get("mean_z"),
        "score": score,
        "stderr": stderr,
        "trials": trials,
    }


def _margin(leader: dict, runner: dict) -> float:
    """How many standard errors of the difference the leader's score is ahead (inf when both
    are exact and differ; 0 when a score or its error is unknown)."""
    if leader["score"] is None or runner["score"] is None or None in (leader["stderr"], runner["stderr"]):
        return 0.0
    gap = leader["score"] - runner["score"]
    se = math.hypot(leader["stderr"], runner["stderr"])
    return gap / se if se > 0 else (math.inf if gap > 0 else 0.0)


def read_decision(artifact: Path) -> dict | None:
    """A decide artifact's decision, once its record is written (the artifact complete)."""
    from otbuild.artifact import PROVENANCE

    if not (artifact / PROVENANCE).is_file():
        return None
    return json.loads((artifact / DECISION).read_text())


STAGE = StageDef(
    "decide",
    1,
    ("decision.json",),
    __name__,
    DecideSettings,
    plan="search_step",
    over="grid",
    checkpoint=True,
    local=True,
    estimate="table",
)
