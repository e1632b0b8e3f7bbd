"""Progress of long jobs on the console of the Snakemake run that started them.

Under Snakemake a job's stdout and stderr go to its log file (`logs/<stage>/<id>.log`, a shard's
`logs/<stage>/<id>/K-of-N.log`), so a rollout's bar or SFT's step lines never reach the console.
The rules name the log to the job (`OTBUILD_LOG`); a long job (rollout and eval shards, Harbor's
included; augment and task_score shards; SFT, RL) keeps a small status file,
`.otbuild/progress/<log path>.json`: what it does, done/total, an ETA and a note (pass rate,
loss), rewritten every few seconds and removed when the job ends. The run's own process (the
Snakefile starts a `Watcher` thread when the run starts) prints one line when it
first sees a job, naming the log to follow, then one line per job every OTBUILD_PROGRESS_SECONDS
(30 by default) while it moves. The files live on the project's filesystem, so this works for
Slurm jobs too. Snakemake's own output is left as it is.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

from otbuild.fsio import write_json

DIR = Path(".otbuild") / "progress"
LOG_ENV = "OTBUILD_LOG"  # the job's log file, set by the rules (otbuild/rules/common.smk)
EVERY_ENV = "OTBUILD_PROGRESS_SECONDS"
WRITE_EVERY = 2.0  # seconds between two writes of a job's status file
QUIET_FOR = 300.0  # a job that has not moved is named again after this long
LOG_RE = re.compile(r"logs/(?P<stage>\w+)/(?P<id>[0-9a-f]{16})(?:/(?P<shard>\d+)-of-(?P<shards>\d+))?\.log$")


def duration(seconds: float | None) -> str:
    """Seconds as a person reads them: 42 s, 3 min 5 s, 2 h 10 min."""
    if seconds is None:
        return "–"
    s = round(seconds)
    if s < 60:
        return f"{seconds:.3g} s" if seconds < 10 else f"{s} s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m} min {s} s"
    h, m = divmod(m, 60)
    return f"{h} h {m} min"


def eta(done_now: int, left: int, elapsed: float) -> float | None:
    """Seconds left at the rate of this run (items done since it started / its time)."""
    return left / (done_now / elapsed) if done_now > 0 and elapsed > 0 else None


def status_file(log: str) -> Path:
    return DIR / (log.strip("/").replace("/", "+") + ".json")


class JobProgress:
    """A job's done/total for the run's console (nothing when OTBUILD_LOG is not set: a stage
    run by hand prints its own progress)."""

    def __init__(self, what: str, total: int, done: int = 0, unit: str = ""):
        self.log = os.environ.get(LOG_ENV)
        self.path = status_file(self.log) if self.log else None
        self.what, self.total, self.unit, self.first = what, total, unit, done
        self.start, self.written = time.monotonic(), 0.0
        self.update(done, force=True)

    def update(self, done: int, note: str = "", force: bool = False) -> None:
        now = time.monotonic()
        if self.path is None or (not force and now - self.written < WRITE_EVERY and done < self.total):
            return
        self.written = now
        left = eta(done - self.first, self.total - done, now - self.start)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_json(
                self.path,
                {
                    "what": self.what,
                    "unit": self.unit,
                    "done": done,
                    "total": self.total,
                    "eta_s": left,
                    "note": note,
                    "log": self.log,
                    "pid": os.getpid(),
                },
            )
        except OSError:
            pass  # the console's view only: never a reason to fail the job

    def finish(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)


class StepProgress:
    """A training run's steps: on the run's console (rank 0: `log` is not None) and, every
    `every` seconds (0: every step) and at the last step, a line in the job's log through `log`."""

    LOG_EVERY = 30.0

    def __init__(self, what: str, total: int, done: int, log: Callable[[str], None] | None, every: float = LOG_EVERY):
        self.job = JobProgress(f"{what} steps", total, done) if log is not None else None
        self.what, self.total, self.first, self.log, self.every = what, total, done, log, every
        self.start = self.logged = time.monotonic()

    def step(self, done: int, note: str) -> None:
        if self.job is None or self.log is None:
            return
        self.job.update(done, note)
        now = time.monotonic()
        if now - self.logged >= self.every or done == self.total:
            self.logged = now
            left = eta(done - self.first, self.total - done, now - self.start)
            self.log(
                f"{self.what.lower()}: step {done}/{self.total}, {note}"
                + (f", about {duration(left)} left" if left else "")
            )

    def finish(self) -> None:
        if self.job is not None:
            self.job.finish()


class Watcher:
    """Prints the status of the project's running jobs every `every` seconds (a daemon thread of
    the Snakemake process). `describe(log)` names a job from its log path (the recipe's label)."""

    def __init__(
        self, root: Path, describe: Callable[[str], str], out: Callable[[str], None], every: float | None = None
    ):
        self.dir = Path(root) / DIR
        self.describe, self.out = describe, out
        self.every = every if every is not None else float(os.environ.get(EVERY_ENV) or 30)
        self.since = time.time() - 1  # status files of earlier runs (a killed job's) are not this run's
        self.shown: dict[str, tuple[int, float]] = {}  # file -> (done, when last printed)
        self._stop = threading.Event()

    def start(self) -> Watcher:
        if self.every > 0:
            threading.Thread(target=self._run, name="otbuild-progress", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.tick()
            except Exception:  # noqa: BLE001, S110 (the console's view only: never stops the run)
                pass

    def tick(self) -> list[str]:
        lines = []
        for f in sorted(self.dir.glob("*.json")) if self.dir.is_dir() else ():
            try:
                if f.stat().st_mtime < self.since:
                    continue
                s = json.loads(f.read_text())
            except (OSError, ValueError):
                continue  # removed meanwhile: the job ended
            if line := self._line(f.name, s):
                lines.append(line)
        for line in lines:
            self.out(line)
        return lines

    def _line(self, key: str, s: dict) -> str | None:
        who = self.describe(s.get("log") or "")
        done, total, unit = s.get("done", 0), s.get("total", 0), s.get("unit", "")
        count = f"{done:,}/{total:,} {unit}".rstrip()
        if total:
            count += f" ({done / total:.0%})"
        left = s.get("eta_s")
        tail = "".join((f", {s['note']}" if s.get("note") else "", f", about {duration(left)} left" if left else ""))
        before = self.shown.get(key)
        now = time.monotonic()
        if before is None:
            self.shown[key] = (done, now)
            return f"otbuild: {who}: {s.get('what', 'running')} {count}{tail}; follow it: tail -f {s.get('log')}"
        if done == before[0] and now - before[1] < QUIET_FOR:
            return None
        self.shown[key] = (done, now)
        return f"otbuild: {who}: {s.get('what', 'running')} {count}{tail}"


def describe_log(log: str, label_of: Callable[[str, str], str | None]) -> str:
    """`teacher, shard 1 of 2` for logs/rollout/<id>/0-of-2.log (label_of(stage, id): the label)."""
    m = LOG_RE.search(log)
    if not m:
        return log
    who = label_of(m["stage"], m["id"]) or f"{m['stage']} {m['id']}"
    return f"{who}, shard {int(m['shard']) + 1} of {m['shards']}" if m["shard"] is not None else who
