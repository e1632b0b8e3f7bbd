"""Agent trials in shards, as the teacher's rollouts and the eval run them: tasks x samples ->
trials, in shards that are separate Snakemake jobs.

Trial t (tasks in table order, each task's samples in turn) belongs to shard t mod N
(N = `shards`, an execution knob: not part of the id). Shard K of N appends every finished
trial to shards/K-of-N.partial.jsonl (flushed and fsynced) as it completes; a killed job that
runs again drops a torn last line (a crash or a full disk mid-write) and skips the trials
already in its own partial file, so nothing is redone and nothing is duplicated. A shard
never opens the partial files of its run's other shards; those of a run with another N are
read once and their trials of this shard copied over (trial numbers do not depend on N, so a
restart with another N loses nothing). The shard's parquet, shards/K-of-N.parquet, is written
(atomically) in trial order when all its trials are done, reading one record at a time. The
merge job interleaves the shards, in trial order, into traces.parquet, a few hundred rows at a
time: no stage of the trace path holds all its traces in memory.

A task's number of samples is `samples_per_task`, or its `n_rollouts` column when the task
table has one (upsampling weights from the task filter); a stage that needs the same number for
every task (the difficulty pilot's k) passes `samples`, and the column is not read.

Failures (docs/failures.md): a shard's first request to the model goes alone, and a refusal
(a wrong key, an unknown model) or no answer stops the shard at once; a trial that failed for
infrastructure reasons is rerun (`infra_retries`) before its record is written; what still
fails is counted, and past `max_infra_failures` the shard fails keeping its partial file,
whose infrastructure-failed trials a rerun runs again (a trial's last record is its own).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from otbuild.errors import StageError
from otbuild.fsio import atomic_path, parquet_batches
from otbuild.hashing import file_sha256
from otbuild.progress import JobProgress, duration, eta
from otbuild.settings.stages import RolloutSettings
from otbuild.settings.trials import HARBOR
from otbuild.stagekit import Inputs, shard_path
from otbuild.stagekit.calls import CALLS, calls_path, merge_call_files, trial_calls, write_calls
from otbuild.stagekit.failures import FailureCount, retry_delay, with_attempts
from otbuild.stagekit.partials import append, drop_torn_tail
from otbuild.tasks.table import task_rows
from otbuild.tasks.taskdir import TaskDir
from otbuild.traces import outcome as oc
from otbuild.traces.table import TRACE_SCHEMA, VOLATILE_COLUMNS, WRITE_OPTIONS, write_traces

# a stage that runs trials: the fields of its traces that measure the run (`StageDef.volatile`)
TRACES = {"traces.parquet": tuple(VOLATILE_COLUMNS)}


@dataclass(frozen=True)
class Trial:
    index: int  # position in the whole rollout
    row: int  # task row in the input table
    sample_idx: int


def plan_trials(inputs: list[Path], samples_per_task: int, per_task: str | None = "n_rollouts") -> list[Trial]:
    """Each task's trials, in table order: as many as its `per_task` column says (a count, or a
    flag: 1 or 0) where the table has one, else `samples_per_task`."""
    trials: list[Trial] = []
    row = 0
    for path in inputs:
        pf = pq.ParquetFile(path)
        has_n = per_task is not None and per_task in pf.schema_arrow.names
        for batch in parquet_batches(path, 65536, [per_task] if has_n and per_task else ["task_id"]):
            counts = batch.column(0).to_pylist() if has_n else [samples_per_task] * batch.num_rows
            for n in counts:
                trials += [Trial(len(trials) + s, row, s) for s in range(int(n or 0))]
                row += 1
    return trials


def run_trials_shard(
    cfg: RolloutSettings,
    inputs: Inputs,
    outdir: Path,
    shard: int,
    *,
    samples: int | None = None,
    per_task: str | None = "n_rollouts",
    verifier_output: int = 0,
    ask_tokens: bool = True,
    pipelined: bool = True,
) -> None:
    """One shard's trials, for the teacher's rollouts, eval (otbuild/stages/eval.py), task
    validation (otbuild/stages/validate.py) and the difficulty pilot. `samples`: that many trials
    of every task (no column read); else `per_task`, the task column that counts a task's trials
    (plan_trials); `verifier_output`: characters of the verifier's output kept in each trace's
    metadata (TrialConfig); `ask_tokens`: with capture, a vLLM otbuild started is asked for token
    ids and log-probs (otbuild/engines/capture.py); `pipelined`: trials get ready and verify
    beside the agents at work (otbuild/harness/slots.py; False: each inside its concurrency slot,
    as before, what bench/vllm.py compares against)."""
    n = cfg.shards
    planned = plan_trials(inputs, samples, None) if samples else plan_trials(inputs, cfg.samples_per_task, per_task)
    trials = [t for t in planned if t.index % n == shard]
    dest = shard_path(outdir, n, shard)
    failures = FailureCount(len(trials), cfg.max_infra_failures, f"shard {shard} of {n}")
    if cfg.sandbox == HARBOR:
        from otbuild.stagekit.harbor_trials import run_harbor_shard

        rows, calls = run_harbor_shard(cfg, inputs, outdir, shard, trials, ask_tokens)
        for row in rows:
            failures.add(row)
        failures.check()
        if cfg.capture or calls:  # without capture: the calls Harbor's agents reported (rollout details)
            write_calls(calls_path(dest), calls)
        write_traces(dest, rows)
        return
    partial = dest.with_suffix(".partial.jsonl")
    partial.parent.mkdir(parents=True, exist_ok=True)
    drop_torn_tail(partial)
    _adopt_stale_trials(partial, n, shard)
    done = _finished_trials(partial)
    rerun = sum(1 for t in trials if t.index in done and done[t.index][1] == oc.INFRASTRUCTURE)
    todo = [t for t in trials if t.index not in done or done[t.index][1] == oc.INFRASTRUCTURE]
    print(
        f"shard {shard}: {len(trials)} trials, {len(trials) - len(todo)} already done, {len(todo)} to run"
        + (f" ({rerun} of them failed for infrastructure reasons before)" if rerun else ""),
        flush=True,
    )
    if todo:
        asyncio.run(
            _run_trials(
                cfg,
                inputs,
                todo,
                partial,
                run_id=outdir.name,
                total=len(trials),
                already=len(trials) - len(todo),
                failures=failures,
                verifier_output=verifier_output,
                ask_tokens=ask_tokens,
                pipelined=pipelined,
            )
        )
        done = _finished_trials(partial)
    missing = [t.index for t in trials if t.index not in done]
    if missing:
        raise RuntimeError(f"shard {shard}: trials {missing[:10]} did not finish")
    with open(partial, "rb") as f:
        failures = FailureCount(len(trials), cfg.max_infra_failures, failures.shard)
        for t in trials:
            if done[t.index][1] == oc.INFRASTRUCTURE:
                failures.add(_record(f, done[t.index][0]))
        failures.check()  # the partial file stays: a rerun retries the failed trials
        if cfg.capture:
            write_calls(calls_path(dest), (c for t in trials for c in _record(f, done[t.index][0], "_calls") or []))
        write_traces(dest, (_record(f, done[t.index][0]) for t in trials))
    partial.unlink(missing_ok=True)


# Rows held in memory at once by the merge, over all shards together (~110 KB each).
MERGE_ROWS = 256


def merge_step(shards: int) -> int:
    """Rows the merge takes from each shard at a time (parquet pages are read as needed)."""
    return max(1, MERGE_ROWS // shards)


def merge_shards(n: int, outdir: Path) -> list[dict]:
    """Write the shards' rows, in trial order (trial t is row t // S of shard t % S), to
    traces.parquet, streamed: each shard of the `n` is read merge_step(S) rows at a time and the
    batches are interleaved. Returns the shards' paths and sha256."""
    shards = [shard_path(outdir, n, k) for k in range(n)]
    step = merge_step(len(shards))
    readers = [parquet_batches(p, step) for p in shards]
    with atomic_path(outdir / "traces.parquet") as tmp, pq.ParquetWriter(tmp, TRACE_SCHEMA, **WRITE_OPTIONS) as out:
        while parts := [b for b in (next(r, None) for r in readers) if b is not None and b.num_rows]:
            table = pa.Table.from_batches([b.select(TRACE_SCHEMA.names) for b in parts]).cast(TRACE_SCHEMA)
            # row pos of part k sits at offset(k) + pos; interleave: pos-major, then shard
            starts = np.cumsum([0] + [b.num_rows for b in parts[:-1]])
            order = [starts[k] + pos for pos in range(step) for k, b in enumerate(parts) if pos < b.num_rows]
            out.write_table(table.take(order))
    for stale in (outdir / "shards").glob("*.partial.jsonl"):  # left by a run with another N
        stale.unlink()
    return [{"path": str(p), "sha256": file_sha256(p)} for p in shards]


def merge_calls(cfg: RolloutSettings, outdir: Path) -> dict:
    """The shards' calls (captured, or reported by Harbor's agents) into calls.parquet
    (otbuild/stagekit/calls.py) after merge_shards; their counts under the stage stats'
    `capture`. No shard wrote any: none."""
    files = [calls_path(shard_path(outdir, cfg.shards, k)) for k in range(cfg.shards)]
    stats = merge_call_files(files, outdir / CALLS)
    return {"capture": stats} if stats else {}


def _trial_lines(path: Path) -> Iterator[tuple[int, int, bytes, str]]:
    """(trial, byte offset, line, outcome) of each whole record in a partial file, one line in
    memory at a time; a line that is not a whole record (cut short by a crash) is skipped: it
    reruns. A trial may have several records (one that failed for infrastructure reasons, then
    its rerun): the last one is the trial's."""
    with open(path, "rb") as f:
        offset = 0
        for line in f:
            start, offset = offset, offset + len(line)
            try:
                rec = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if isinstance(rec, dict) and isinstance(rec.get("_trial"), int):
                yield rec["_trial"], start, line, oc.outcome(rec)


def _finished_trials(partial: Path) -> dict[int, tuple[int, str]]:
    """{trial: (byte offset of its last record, its outcome)} in this shard's own partial file
    (never another's)."""
    return {t: (at, o) for t, at, _, o in _trial_lines(partial)} if partial.exists() else {}


def _record(f, offset: int, part: str | None = None):
    """The trace recorded at `offset`, or (`part`="_calls") its captured calls, if any."""
    f.seek(offset)
    rec = json.loads(f.readline())
    if part is not None:
        return rec.get(part)
    del rec["_trial"]
    rec.pop("_calls", None)
    return rec


def _adopt_stale_trials(partial: Path, n: int, shard: int) -> None:
    """Trials finished by a run with another number of shards (their partial files are named
    K-of-M, M != n) are copied, streamed, into this shard's file when they are this shard's:
    a restart with another `shards` loses nothing. A trial's last record is the one copied, and
    never over one of this shard's that did not fail for infrastructure reasons. Files of this
    run's other shards are never opened."""
    stale = [p for p in sorted(partial.parent.glob("*.partial.jsonl")) if not p.name.endswith(f"-of-{n}.partial.jsonl")]
    if not stale:
        return
    have = {t for t, (_, o) in _finished_trials(partial).items() if o != oc.INFRASTRUCTURE}
    with open(partial, "ab") as out:
        for path in stale:
            try:
                last = {t: (at, o) for t, at, _, o in _trial_lines(path) if t % n == shard and t not in have}
                with open(path, "rb") as f:
                    for t, (at, o) in sorted(last.items()):
                        f.seek(at)
                        line = f.readline()
                        out.write(line if line.endswith(b"\n") else line + b"\n")
                        if o != oc.INFRASTRUCTURE:
                            have.add(t)
            except FileNotFoundError:  # merged and removed meanwhile
                continue
        out.flush()
        os.fsync(out.fileno())


async def _run_trials(
    cfg: RolloutSettings,
    inputs: list[Path],
    todo: list[Trial],
    partial: Path,
    *,
    run_id: str,
    total: int,
    already: int,
    failures: FailureCount,
    verifier_output: int = 0,
    ask_tokens: bool = True,
    pipelined: bool = True,
) -> None:
    """Run `todo`, appending each trial's record to `partial` once it has its outcome: a trial
    that failed for infrastructure reasons is first rerun (infra_retries, with backoff), and
    the shard stops as soon as more of them failed than it allows (`failures`), or when the
    model's endpoint refuses the run (otbuild/engines/endpoint.py: its first request goes
    alone)."""
    from otbuild.capture import call_scope
    from otbuild.engines import open_engine, refuse_tools, resolve_auto
    from otbuild.engines.capture import capture_engine
    from otbuild.engines.endpoint import FirstRequest
    from otbuild.harness.config import TrialConfig
    from otbuild.harness.slots import TrialSlots
    from otbuild.harness.trial import not_runnable_trace, run_trial
    from otbuild.settings.engines import concurrency

    in_flight = concurrency(cfg)  # as the plan counted them (auto's own)
    cfg = resolve_auto(cfg)  # serve_with: auto is decided here, by what this machine has
    if cfg.protocol == "tools":  # the plan's check saw the recipe's engine; this is the one resolved here
        refuse_tools(cfg, f"the trials' model ({cfg.engine}:{cfg.model or cfg.engine})")

    rows = task_rows(inputs, {t.row for t in todo})
    containers = cfg.sandbox in ("podman", "auto")  # a task's own image can run here
    if containers:
        need_image = [r for r in rows.values() if _needs_image(r, cfg.sandbox)]
        check_podman(cfg.sandbox, need_image)
        if cfg.sandbox == "podman" or need_image:  # restarted right after a kill -9: what it left
            from otbuild.sandbox.podman.container import remove_leaked_containers

            if removed := remove_leaked_containers():
                print(f"removed {removed} trial container(s) of jobs that are no longer running", flush=True)
    trial_config = TrialConfig(
        cfg, cfg.prompt, protocol=cfg.protocol, verify=cfg.verify, verifier_output=verifier_output
    )
    progress = Progress(total, already)
    slots = TrialSlots(in_flight, pipelined=pipelined)
    workroot = Path(tempfile.mkdtemp(prefix="otbuild-trials-"))
    engine = await open_engine(cfg)
    proxy = capture_engine(engine, cfg, ask_tokens=ask_tokens) if cfg.capture else None
    model = engine if getattr(engine, "needs_solution", False) else FirstRequest(engine)
    try:
        with open(partial, "a") as out:  # noqa: ASYNC230 (appends are small and fsynced)

            async def attempt(t: Trial, n: int) -> tuple[dict, bool]:
                """The attempt's trace, and whether the shard stopped meanwhile (its verifier
                ran to its end all the same: TrialSlot.finish)."""
                async with slots.trial() as slot:
                    row = rows[t.row]
                    task = TaskDir.unpack(row["path"], row["task_binary"])
                    ids = {"sample_idx": t.sample_idx, "run_id": run_id, "source": row["source"]}
                    if not (row["runnable_locally"] or containers):
                        return not_runnable_trace(task, row["task_id"], engine, protocol=cfg.protocol, **ids), False
                    workdir = workroot / f"{t.index}-{n}"
                    scope = call_scope.set(f"{t.index}-{n}")  # this attempt's model calls
                    try:  # the trial's task copies the scope now
                        trial = asyncio.ensure_future(
                            run_trial(task, row["task_id"], model, trial_config, workdir, slot=slot, **ids)
                        )
                    finally:
                        call_scope.reset(scope)
                    trace, stopped = await slot.finish(trial)
                    shutil.rmtree(workdir, ignore_errors=True)
                    if proxy is not None:
                        calls = await asyncio.to_thread(proxy.take, f"{t.index}-{n}")
                        trace["_calls"] = trial_calls(t.index, trace, calls, cfg.keep_reasoning)
                    return trace, stopped

            async def one(t: Trial) -> None:
                retried: list[str | None] = []
                for n in range(cfg.infra_retries + 1):
                    if n:
                        await asyncio.sleep(retry_delay(cfg, n))
                    trace, stopped = await attempt(t, n)
                    if stopped or oc.outcome(trace) != oc.INFRASTRUCTURE or n == cfg.infra_retries:
                        break
                    retried.append(oc.error_name(trace["result"], trace["exception"]))
                trace = with_attempts(trace, len(retried) + 1, retried)
                append(out, {"_trial": t.index, **trace})
                progress.update(trace)
                if stopped:  # kept; the shard's stop goes on
                    raise asyncio.CancelledError
                if failures.add(trace):
                    failures.check()

            try:
                async with asyncio.TaskGroup() as tg:  # a bug in one trial cancels the others, then raises
                    for t in todo:
                        tg.create_task(one(t))
            except BaseExceptionGroup as group:  # the run stopped: say why, plainly
                if stop := next((e for e in group.exceptions if isinstance(e, StageError)), None):
                    raise stop from None
                raise
    finally:
        await engine.aclose()
        if proxy is not None:
            proxy.close()
        shutil.rmtree(workroot, ignore_errors=True)
        progress.finish()


def _needs_image(row: dict, backend: str) -> bool:
    """The task runs in its own image: no RUN-free layout, or (auto) a FROM the host is not."""
    from otbuild.sandbox import needs_image

    if not row["runnable_locally"] or backend != "auto":
        return not row["runnable_locally"]
    return needs_image(TaskDir.unpack(row["path"], row["task_binary"]))


def check_podman(backend: str, need_image: list[dict]) -> None:
    """Fail before any trial when tasks need their image and podman cannot run here."""
    from otbuild.sandbox import backend_problem

    if (backend == "podman" or need_image) and (problem := backend_problem("podman")):
        names = sorted({r["path"] for r in need_image})
        which = (
            f"tasks {', '.join(names[:5])}{' ...' if len(names) > 5 else ''} need their container "
            "image (RUN lines, a prebuilt image or a FROM the host is not)"
            if need_image
            else "the recipe asks for it"
        )
        raise RuntimeError(f"sandbox {backend}: {which}, but podman cannot run here: {problem}")


class Progress:
    """Trials done, pass rate, trials/s and ETA: a live bar on a terminal, lines in a log, and
    the same on the console of the Snakemake run (otbuild/progress.py)."""

    def __init__(self, total: int, already: int):
        from rich.console import Console
        from rich.progress import BarColumn, TextColumn, TimeRemainingColumn
        from rich.progress import Progress as Bar

        self.job = JobProgress("trials", total, already)
        self.total, self.done, self.passed, self.errors = total, already, 0, 0
        self.start, self.last_line, self.run_now = time.monotonic(), 0.0, 0
        self.console = Console(stderr=True)
        self.bar = None
        if self.console.is_terminal:
            self.bar = Bar(
                TextColumn("rollouts"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TextColumn("{task.fields[stats]}"),
                TimeRemainingColumn(),
                console=self.console,
            )
            self.task = self.bar.add_task("", total=total, completed=already, stats="")
            self.bar.start()

    def update(self, trace: dict) -> None:
        self.done += 1
        self.run_now += 1
        self.passed += (trace["reward"] or 0) >= 1.0
        self.errors += trace["exception"] is not None
        elapsed = time.monotonic() - self.start
        rate = self.run_now / elapsed if elapsed else 0.0
        left = eta(self.run_now, self.total - self.done, elapsed)
        stats = f"pass {self.passed / self.run_now:.0%}  errors {self.errors}  {rate:.2f} trials/s"
        self.job.update(self.done, f"pass {self.passed / self.run_now:.0%}, errors {self.errors}")
        if self.bar:
            self.bar.update(self.task, completed=self.done, stats=stats)
        elif time.monotonic() - self.last_line > 10 or self.done == self.total:
            self.last_line = time.monotonic()
            print(f"rollouts {self.done}/{self.total}  {stats}  eta {duration(left)}", file=sys.stderr, flush=True)

    def finish(self) -> None:
        self.job.finish()
        if self.bar:
            self.bar.stop()
