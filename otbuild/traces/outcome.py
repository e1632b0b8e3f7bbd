"""How a trial ended: the one classification that the trace filter, the eval scores and a
shard's failure counts all use (docs/failures.md has the table). Standard library only.

A trace row names its error in `exception` or in `result` (which holds the reward as text, or
an error's class name: otbuild's harness puts task failures there and leaves `exception`
empty; Harbor's rows put every error but AgentTimeoutError in `exception`). The outcome is a
function of the error's name, `timed_out` and `reward`, so rows of either origin classify
alike:

    not_run         the task needs what the sandbox refuses to give it (TaskNotRunnableLocally:
                    its container image; EnvironmentDefinitionError: otbuild's Harbor
                    environment refused its Dockerfile; NetworkPolicyError: an allowlist) or
                    its task.toml is one Harbor refuses (TaskFormatError) or asks for a host
                    variable the recipe does not allow (HostEnvNotAllowed); never attempted,
                    never retried
    infrastructure  any other error not named below: the endpoint (EngineError, Harbor's
                    InternalServerError, AuthenticationError, ...), the sandbox (SandboxError),
                    the environment (EnvironmentStartTimeoutError, image builds, ...)
    verifier_error  the task's verifier gave no verdict (VerifierTimeoutError, VerifierEnvError:
                    a variable its [verifier].env names is not set, ...)
    timed_out       the agent ran out of time (timed_out, AgentTimeoutError)
    task_failure    the agent's own end without a verdict: its context window, its disk limit,
                    its output length (ContextLengthExceededError, DiskLimitExceededError, ...);
                    or the task's files could not be put in place in its trial (TaskSetupError:
                    a link or a file an earlier step left where the next stages its own)
    unverified      no error and no reward (imported traces without a label; teacher.verify: false)
    passed / failed the verifier's reward, >= 1 or below

An unknown error name is infrastructure: as Harbor's retries do, only what is known to be
the task's or the agent's own is kept out of retries and failure counts.
"""

from __future__ import annotations

import math

NOT_RUN = "not_run"
INFRASTRUCTURE = "infrastructure"
VERIFIER_ERROR = "verifier_error"
TIMED_OUT = "timed_out"
TASK_FAILURE = "task_failure"
UNVERIFIED = "unverified"
UNVERIFIED_REASON = "teacher.verify: false: the verifier was not run"  # in a trace's metadata
PASSED = "passed"
FAILED = "failed"
OUTCOMES = (NOT_RUN, INFRASTRUCTURE, VERIFIER_ERROR, TIMED_OUT, TASK_FAILURE, UNVERIFIED, PASSED, FAILED)

NOT_RUN_ERRORS = (
    "TaskNotRunnableLocally",
    "EnvironmentDefinitionError",
    "NetworkPolicyError",
    "TaskFormatError",
    "TaskKeyNotSupported",
    "TaskEnvError",
    "HostEnvNotAllowed",
)
VERIFIER_ERRORS = (
    "VerifierTimeoutError",
    "VerifierOutputParseError",
    "RewardFileNotFoundError",
    "RewardFileEmptyError",
    "VerifierEnvError",
)
TIMEOUT_ERRORS = ("AgentTimeoutError",)
TASK_FAILURE_ERRORS = (
    "ContextLengthExceededError",
    "DiskLimitExceededError",
    "OutputLengthExceededError",
    "TaskSetupError",
)
KNOWN_ERRORS = NOT_RUN_ERRORS + VERIFIER_ERRORS + TIMEOUT_ERRORS + TASK_FAILURE_ERRORS

# eval: these have no score (left out of the mean, counted as n_excluded); task failures and
# verifier errors score 0 (counted as n_exceptions)
EXCLUDED_FROM_SCORES = (INFRASTRUCTURE, NOT_RUN)
SCORED_ZERO_ERRORS = (TASK_FAILURE, VERIFIER_ERROR)
# the trace filter's drop_exceptions: rows without a trajectory worth keeping or a verdict
DROPPED_AS_EXCEPTIONS = (NOT_RUN, INFRASTRUCTURE, VERIFIER_ERROR)


def error_name(result: str | None, exception: str | None) -> str | None:
    """The error a row names: its `exception`, else a `result` that is not a number."""
    if exception:
        return exception
    if not result:
        return None
    try:
        float(result)
    except ValueError:
        return result
    return None


def classify(result: str | None, exception: str | None, timed_out: bool | None, reward: float | None) -> str:
    """One of OUTCOMES (the table in this module's docstring)."""
    name = error_name(result, exception)
    if name in NOT_RUN_ERRORS:
        return NOT_RUN
    if name is not None and name not in KNOWN_ERRORS:
        return INFRASTRUCTURE
    if name in VERIFIER_ERRORS:
        return VERIFIER_ERROR
    if timed_out or name in TIMEOUT_ERRORS:
        return TIMED_OUT
    if name in TASK_FAILURE_ERRORS:
        return TASK_FAILURE
    if reward is None or (isinstance(reward, float) and math.isnan(reward)):
        return UNVERIFIED
    return PASSED if reward >= 1.0 else FAILED


def outcome(row: dict) -> str:
    """classify() of a trace row (a dict with TRACE_SCHEMA's keys)."""
    return classify(row.get("result"), row.get("exception"), row.get("timed_out"), row.get("reward"))


def sql_in(values) -> str:
    return "(" + ", ".join("'" + v.replace("'", "''") + "'" for v in values) + ")"


def sql_context() -> dict:
    """What a SQL template that asks how trials ended gets as `outcome` (eval.sql, trace_filter.sql)."""
    return {
        "macros": sql_macros(),
        "excluded": sql_in(EXCLUDED_FROM_SCORES),
        "scored_zero": sql_in(SCORED_ZERO_ERRORS),
        "dropped": sql_in(DROPPED_AS_EXCEPTIONS),
    }


def sql_macros() -> str:
    """DuckDB macros `otb_error(result, exception)` and `otb_outcome(result, exception,
    timed_out, reward)`: error_name() and classify() in SQL, from the same lists."""
    name = "otb_error(result, exception)"
    return f"""
CREATE OR REPLACE TEMP MACRO otb_error(result, exception) AS
    CASE WHEN coalesce(exception, '') <> '' THEN exception
         WHEN coalesce(result, '') <> '' AND TRY_CAST(result AS DOUBLE) IS NULL THEN result END;
CREATE OR REPLACE TEMP MACRO otb_outcome(result, exception, timed_out, reward) AS CASE
    WHEN {name} IN {sql_in(NOT_RUN_ERRORS)} THEN '{NOT_RUN}'
    WHEN {name} IS NOT NULL AND {name} NOT IN {sql_in(KNOWN_ERRORS)} THEN '{INFRASTRUCTURE}'
    WHEN {name} IN {sql_in(VERIFIER_ERRORS)} THEN '{VERIFIER_ERROR}'
    WHEN coalesce(timed_out, false) OR {name} IN {sql_in(TIMEOUT_ERRORS)} THEN '{TIMED_OUT}'
    WHEN {name} IN {sql_in(TASK_FAILURE_ERRORS)} THEN '{TASK_FAILURE}'
    WHEN reward IS NULL OR isnan(reward) THEN '{UNVERIFIED}'
    WHEN reward >= 1.0 THEN '{PASSED}' ELSE '{FAILED}' END;
"""
