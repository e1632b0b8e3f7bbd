"""Infrastructure failures of a shard's trials, counted after their retries (docs/failures.md).

A trial whose outcome is `infrastructure` (otbuild/traces/outcome.py) is rerun, up to
`infra_retries` times, waiting like the client's retries (`backoff_sec`, doubling, capped at
`backoff_max_sec`, with jitter). What still fails is counted per shard: past
`max_infra_failures` (a fraction of the shard's trials) the shard fails, naming the counts by
exception type and one message, and keeps its partial file, so a rerun (the endpoint fixed)
runs only the failed trials again. Harbor's shards are counted the same way (Harbor retries
its trials itself).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

from otbuild import duck
from otbuild.engines.base import backoff_delay
from otbuild.errors import StageError
from otbuild.traces import outcome as oc


class InfraFailuresExceeded(StageError):
    """More of a shard's trials failed for infrastructure reasons than the recipe allows."""


class FailureCount:
    """The infrastructure failures among a shard's `n_trials`, by exception type, with the first
    message of each type; `max_fraction` of them are allowed (max_infra_failures)."""

    def __init__(self, n_trials: int, max_fraction: float, shard: str):
        self.n_trials, self.shard = n_trials, shard
        self.allowed = math.floor(max_fraction * n_trials + 1e-9)
        self.by_type: Counter = Counter()
        self.messages: dict[str | None, str] = {}  # None: an error that names none

    @property
    def failures(self) -> int:
        return sum(self.by_type.values())

    def add(self, row: dict) -> bool:
        """Count `row` (a trace row); True when it is an infrastructure failure."""
        if row.get("is_subagent") or oc.outcome(row) != oc.INFRASTRUCTURE:
            return False
        name = oc.error_name(row.get("result"), row.get("exception"))
        self.by_type[name] += 1
        self.messages.setdefault(name, message_of(row))
        return True

    def exceeded(self) -> bool:
        return self.failures > self.allowed

    def check(self) -> None:
        if self.exceeded():
            raise InfraFailuresExceeded(self.describe())

    def describe(self) -> str:
        counts = ", ".join(f"{name} x{n}" for name, n in self.by_type.most_common())
        name = self.by_type.most_common(1)[0][0]
        return (
            f"{self.shard}: {self.failures} of {self.n_trials} trials failed for infrastructure reasons "
            f"after their retries, more than max_infra_failures allows ({self.allowed}): {counts}; "
            f"e.g. {name}: {self.messages[name] or '(no message)'}. The finished trials are kept: "
            "a rerun runs only the failed ones again"
        )

    def stats(self) -> dict:
        return {"infra_failures": self.failures, "infra_failures_by_type": dict(self.by_type)}


def message_of(row: dict) -> str:
    try:
        meta = json.loads(row.get("metadata") or "{}")
    except ValueError:
        meta = {}
    return str(meta.get("exception_message") or "")[:500]


def retry_delay(cfg, attempt: int) -> float:
    """Before retry `attempt` (1, 2, ...) of a trial: as the client waits between requests."""
    return backoff_delay(attempt, cfg.backoff_sec, cfg.backoff_max_sec)


def with_attempts(row: dict, attempts: int, retried: list[str | None]) -> dict:
    """`row` with, in its metadata, how many attempts the trial took and what the failed ones
    raised (only for a retried trial: a first attempt's row is unchanged)."""
    if attempts <= 1:
        return row
    meta = json.loads(row["metadata"] or "{}")
    meta.update(attempts=attempts, retried_exceptions=retried)
    return {**row, "metadata": json.dumps(meta, sort_keys=True, default=str)}


def outcome_stats(con, traces: Path) -> dict:
    """A trace file's trials by outcome, and its infrastructure failures by exception type (the
    stage's stats, so its provenance record says them)."""
    con.execute(oc.sql_macros())
    rows = con.execute(
        "SELECT otb_outcome(result, exception, timed_out, reward), otb_error(result, exception), count(*)"
        f" FROM read_parquet({duck.sql_literal(traces)}) WHERE NOT coalesce(is_subagent, false)"
        " GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    outcomes: Counter = Counter()
    infra: Counter = Counter()
    for outcome, error, n in rows:
        outcomes[outcome] += n
        if outcome == oc.INFRASTRUCTURE:
            infra[error] += n
    return {"outcomes": dict(outcomes), "infra_failures": sum(infra.values()), "infra_failures_by_type": dict(infra)}
