"""Ctrl-C during `snakemake NAME`: one line per interrupted job and how to resume, instead of
Snakemake's error block for each (a RuleException quoting the job's whole spec JSON, "message:
None", the log's tail) and its "At least one job did not complete successfully"."""

from __future__ import annotations

import logging
import shlex
import sys

# What Snakemake's scheduler logs when it catches the KeyboardInterrupt (snakemake/scheduling).
TERMINATING = "Terminating processes on user request"


class Interrupted(logging.Filter):
    """A filter on Snakemake's logger. Until Ctrl-C it passes everything; after it, a failed
    job's error record becomes one line naming the job and its log, the exception blocks of
    those jobs are dropped, and the run's closing error says how to resume."""

    def __init__(self, command: str):
        super().__init__()
        self.command = command
        self.interrupted = False

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg if isinstance(record.msg, str) else ""
        if TERMINATING in msg:
            self.interrupted = True
            _plain(record, "otbuild: interrupted (Ctrl-C): stopping the running jobs")
            return True
        if not self.interrupted:
            return True
        if str(getattr(record, "event", None) or "") == "job_error":
            logs = ", ".join(str(f) for f in getattr(record, "log", None) or []) or "no log"
            wildcards = getattr(record, "wildcards", None) or {}
            what = ", ".join(f"{k}={v}" for k, v in dict(wildcards).items())
            _plain(
                record,
                f"otbuild: interrupted: {getattr(record, 'rule_name', '?')}"
                f"{f' ({what})' if what else ''}; its log: {logs}",
            )
            return True
        if msg.startswith(("RuleException", "Error in rule", "CalledProcessError")):
            return False
        if "At least one job did not complete successfully" in msg:
            _plain(
                record,
                f"otbuild: to resume, run `{self.command}` again: finished jobs are kept, "
                "interrupted rollouts, evals and training pick up where they stopped",
            )
        return True


def _plain(record: logging.LogRecord, text: str) -> None:
    """Make `record` a plain message (Snakemake's formatter prints `msg` for records without an event)."""
    record.msg, record.args = text, ()
    record.event = None


def install(logger: logging.Logger | None = None) -> Interrupted:
    """Attach the filter to Snakemake's logger (the Snakefile does, in the main process)."""
    from snakemake.logging import logger as snakemake_logger

    command = shlex.join(["snakemake", *sys.argv[1:]])
    flt = Interrupted(command)
    (logger or snakemake_logger).addFilter(flt)
    return flt
