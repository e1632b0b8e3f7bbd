"""Whether a merged run of trials is broken, however healthy its endpoint looked (docs/failures.md,
"A broken run"): its trials average about one turn, every verified trial got the same reward, or
one error ended most of its trials. Every stage that runs trials calls `check` from its merge
`run`, over the traces it merged: one DuckDB pass of aggregates over the file, whatever its size.

A signal is the model's (turns, rewards, the agent's own ends: `timed_out`, `task_failure`) or
the run's (an infrastructure error, a task not run, a verifier with no verdict). A stage that
measures its model (eval: an untrained base may well score 0 in one turn) only warns on the
model's signals; the run's, and every signal of a stage that makes data, follow the section's
`health.on_broken`. The numbers go in the stage's stats (`health`) either way.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import cast

from otbuild import duck
from otbuild.errors import StageError
from otbuild.settings.trials import RunHealth
from otbuild.traces import outcome as oc

RUN_OUTCOMES = (oc.INFRASTRUCTURE, oc.NOT_RUN, oc.VERIFIER_ERROR)  # not the model's doing
VERDICTS = (oc.PASSED, oc.FAILED, oc.TIMED_OUT)  # a reward the verifier gave (a task failure's 0 is not)


class RunBroken(StageError):
    """A run of trials that is broken (its health numbers say how)."""


def check(cfg, traces: Path, what: str, measures_model: bool = False) -> dict:
    """The health of the trials in `traces` (a merged trace file) by `cfg.health` (a RunHealth):
    raises RunBroken naming the numbers, or returns {"health": ...} for the stage's stats, with
    what it warns about in `warnings`. `what`: the stage, as the message names it; `cfg.engine`
    `oracle` lets a run whose every trial passed be healthy."""
    health: RunHealth = cfg.health
    numbers = measure(traces)
    signals = judge(numbers, health, oracle=getattr(cfg, "engine", None) == "oracle")
    failing = [text for text, owner in signals if health.on_broken == "fail" and not (measures_model and owner)]
    warnings = [text for text, _ in signals if text not in failing]
    if failing:
        raise RunBroken(
            f"{what}: the run is broken: {'; '.join(failing + warnings)}. Its shards are kept (shards/): "
            "with health.on_broken: warn a rerun merges them into the artifact as they are (docs/failures.md)"
        )
    for text in warnings:
        print(f"warning: {what}: {text}", file=sys.stderr, flush=True)
    return {"health": {**numbers, "warnings": warnings}}


def measure(traces: Path) -> dict:
    """Aggregates of the run's trials (subagents' traces apart): their count, mean turns (of
    the trials that ran), the verifier's rewards (how many trials, distinct values, lowest and
    highest), and the most common error with its outcome, count and one message."""
    con = duck.connect()
    con.execute(oc.sql_macros())
    con.execute(
        "CREATE TEMP VIEW trials AS SELECT n_turns, reward, otb_error(result, exception) AS error,"
        " otb_outcome(result, exception, timed_out, reward) AS outcome,"
        " coalesce(json_extract_string(metadata, '$.exception_message'),"
        " json_extract_string(metadata, '$.stop_message')) AS message"
        f" FROM read_parquet({duck.sql_literal(traces)}) WHERE NOT coalesce(is_subagent, false)"
    )
    trials, mean_turns, verified, distinct, low, high = cast(
        tuple,
        con.execute(
            f"SELECT count(*), avg(coalesce(n_turns, 0)) FILTER (outcome <> '{oc.NOT_RUN}'), count(*) FILTER (verdict),"
            " count(DISTINCT reward) FILTER (verdict), min(reward) FILTER (verdict), max(reward) FILTER (verdict)"
            f" FROM (SELECT *, outcome IN {oc.sql_in(VERDICTS)} AND NOT isnan(reward) AS verdict FROM trials)"
        ).fetchone(),
    )
    top = con.execute(
        "SELECT error, any_value(outcome), count(*), min(message) FROM trials WHERE error IS NOT NULL"
        " GROUP BY error ORDER BY count(*) DESC, error LIMIT 1"
    ).fetchone()
    error = None
    if top:
        name, outcome, n, message = top
        error = {"name": name, "outcome": outcome, "trials": n, "share": n / trials, "message": (message or "")[:300]}
    return {
        "trials": trials,
        "mean_turns": round(mean_turns, 3) if mean_turns is not None else None,
        "verified_trials": verified,
        "distinct_rewards": distinct,
        "reward_range": [low, high] if verified else None,
        "top_error": error,
    }


def judge(numbers: dict, health: RunHealth, oracle: bool) -> list[tuple[str, bool]]:
    """What is broken about a run with these numbers: (text, whether it is the model's doing)."""
    trials = numbers["trials"]
    if trials < health.min_trials:
        return []
    out = []
    turns = numbers["mean_turns"]
    if health.max_mean_turns is not None and turns is not None and turns <= health.max_mean_turns:
        out.append(
            (f"its {trials} trials average {turns:g} turns (health.max_mean_turns: {health.max_mean_turns})", True)
        )
    verified, one = numbers["verified_trials"], numbers["distinct_rewards"] == 1
    value = numbers["reward_range"][0] if one else None
    all_passed = oracle and value is not None and value >= 1.0
    if health.same_reward and one and verified >= health.min_trials and not all_passed:
        out.append((f"all {verified} verified trials got reward {value:g} (health.same_reward)", True))
    error = numbers["top_error"]
    if health.max_error_share is not None and error and error["share"] >= health.max_error_share:
        text = (
            f"{error['name']} ({error['outcome']}) ended {error['trials']} of {trials} trials"
            f" ({error['share']:.0%}, health.max_error_share: {health.max_error_share:g}),"
            f" e.g. {error['message'] or '(no message)'}"
        )
        out.append((text, error["outcome"] not in RUN_OUTCOMES))
    return out
