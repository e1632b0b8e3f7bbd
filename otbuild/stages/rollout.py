"""Teacher rollouts: tasks x samples -> trials, in shards that are separate Snakemake jobs.

Trial t (tasks in table order, each task's samples in turn) belongs to shard t mod N
(N = `shards`, an execution knob: not part of the id). Shard K of N appends every finished
trial to shards/K-of-N.partial.jsonl (flushed and fsynced) as it completes; a killed job that
runs again drops a torn last line (a crash or a full disk mid-write) and skips the trials
already there, in any shard's partial file (trial numbers do not depend on N, so a restart
with another N loses nothing), so nothing is redone and nothing is duplicated. The shard's
parquet, shards/K-of-N.parquet, is written (atomically) when all its trials are done. The
merge job concatenates the shards, in trial order, into traces.parquet.

A task's number of samples is `samples_per_task`, or its `n_rollouts` column when the task
table has one (upsampling weights from the task filter).
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from otbuild import usage
from otbuild.hashing import file_sha256
from otbuild.stages import shard_path
from otbuild.stages.partials import append, drop_torn_tail, iter_records
from otbuild.tasks.taskdir import TaskDir
from otbuild.traces.table import TRACE_SCHEMA, write_traces


@dataclass(frozen=True)
class Trial:
    index: int  # position in the whole rollout
    row: int  # task row in the input table
    sample_idx: int


def plan_trials(inputs: list[Path], samples_per_task: int) -> list[Trial]:
    trials: list[Trial] = []
    row = 0
    for path in inputs:
        pf = pq.ParquetFile(path)
        has_n = "n_rollouts" in pf.schema_arrow.names
        for batch in pf.iter_batches(columns=["n_rollouts"] if has_n else ["task_id"]):
            counts = batch.column(0).to_pylist() if has_n else [samples_per_task] * batch.num_rows
            for n in counts:
                trials += [Trial(len(trials) + s, row, s) for s in range(int(n or 0))]
                row += 1
    return trials


def run_shard(settings: dict, inputs: list[Path], outdir: Path, shard: int) -> None:
    n = settings["shards"]
    trials = [t for t in plan_trials(inputs, settings["samples_per_task"]) if t.index % n == shard]
    dest = shard_path(outdir, n, shard)
    if settings["sandbox"] == "harbor":
        from otbuild.stages.rollout_harbor import run_harbor_shard

        write_traces(dest, run_harbor_shard(settings, inputs, outdir, shard, trials))
        return
    partial = dest.with_suffix(".partial.jsonl")
    partial.parent.mkdir(parents=True, exist_ok=True)
    drop_torn_tail(partial)
    done = _read_partials(outdir)
    todo = [t for t in trials if t.index not in done]
    print(f"shard {shard}: {len(trials)} trials, {len(done)} already done, {len(todo)} to run", flush=True)
    if todo:
        asyncio.run(_run_trials(settings, inputs, todo, partial, run_id=outdir.name, total=len(trials),
                                already=len(done)))
        done = _read_partials(outdir)
    missing = [t.index for t in trials if t.index not in done]
    if missing:
        raise RuntimeError(f"shard {shard}: trials {missing[:10]} did not finish")
    write_traces(dest, (done[t.index] for t in trials))
    partial.unlink(missing_ok=True)


def run(settings: dict, inputs: list[Path], outdir: Path) -> dict:
    """Merge the shards into traces.parquet."""
    rows, shards = merge_shards(settings, outdir)
    subagents = sum(1 for r in rows if r["is_subagent"])
    rows = [r for r in rows if not r["is_subagent"]]
    rewards = [r["reward"] for r in rows if r["reward"] is not None]
    return {
        "trials": len(rows),
        "subagent_traces": subagents,
        "shards": shards,
        "passed": sum(1 for r in rewards if r >= 1.0),
        "exceptions": sum(1 for r in rows if r["exception"]),
        "timed_out": sum(1 for r in rows if r["timed_out"]),
        "llm_usage": usage.of_traces(outdir / "traces.parquet"),
    }


def merge_shards(settings: dict, outdir: Path) -> tuple[list[dict], list[dict]]:
    """The shards' rows in trial order (trial t is row t // S of shard t % S), written to
    traces.parquet; returns them and the shards' paths and sha256."""
    shards = [shard_path(outdir, settings["shards"], k) for k in range(settings["shards"])]
    parts = [pq.read_table(p, schema=TRACE_SCHEMA).to_pylist() for p in shards]
    rows = [part[pos] for pos in range(max(map(len, parts), default=0)) for part in parts if pos < len(part)]
    write_traces(outdir / "traces.parquet", rows)
    for stale in (outdir / "shards").glob("*.partial.jsonl"):  # left by a run with another N
        stale.unlink()
    return rows, [{"path": str(p), "sha256": file_sha256(p)} for p in shards]


async def _run_trials(settings: dict, inputs: list[Path], todo: list[Trial], partial: Path, *,
                      run_id: str, total: int, already: int) -> None:
    from otbuild.engines import engine_settings, open_engine
    from otbuild.engines.settings import concurrency
    from otbuild.harness.trial import TrialSettings, not_runnable_trace, run_trial
    from otbuild.sandbox import Limits

    rows = task_rows(inputs, {t.row for t in todo})
    containers = settings["sandbox"] in ("podman", "auto")  # a task's own image can run here
    if containers:
        check_podman(settings["sandbox"], [r for r in rows.values() if _needs_image(r, settings["sandbox"])])
    trial_settings = TrialSettings(
        max_episodes=settings["max_episodes"], agent_timeout_sec=settings.get("agent_timeout_sec"),
        timeout_multiplier=settings["timeout_multiplier"], timeout_cap_sec=settings["timeout_cap_sec"],
        backend=settings["sandbox"], limits=Limits(**settings.get("limits", {})),
        keep_reasoning=settings["keep_reasoning"],
        prompt=settings.get("prompt", "terminus2"),
    )
    progress = Progress(total, already)
    sem = asyncio.Semaphore(concurrency(settings))
    workroot = Path(tempfile.mkdtemp(prefix="otbuild-trials-"))
    engine = await open_engine(engine_settings(settings))
    try:
        with open(partial, "a") as out:  # noqa: ASYNC230 (appends are small and fsynced)

            async def one(t: Trial) -> None:
                async with sem:
                    row = rows[t.row]
                    task = TaskDir.unpack(row["path"], row["task_binary"])
                    ids = {"sample_idx": t.sample_idx, "run_id": run_id, "source": row["source"]}
                    if row["runnable_locally"] or containers:
                        workdir = workroot / f"{t.index}"
                        trace = await run_trial(task, row["task_id"], engine, trial_settings, workdir, **ids)
                        shutil.rmtree(workdir, ignore_errors=True)
                    else:
                        trace = not_runnable_trace(task, row["task_id"], engine, **ids)
                    append(out, {"_trial": t.index, **trace})
                    progress.update(trace)

            async with asyncio.TaskGroup() as tg:  # a bug in one trial cancels the others, then raises
                for t in todo:
                    tg.create_task(one(t))
    finally:
        await engine.aclose()
        shutil.rmtree(workroot, ignore_errors=True)
        progress.finish()


def _read_partials(outdir: Path) -> dict[int, dict]:
    """Finished trials by index, from every shard's partial file."""
    done = {}
    for index, rec in iter_records(outdir, "_trial"):
        rec.pop("_trial")
        done[index] = rec
    return done


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
        which = (f"tasks {', '.join(names[:5])}{' ...' if len(names) > 5 else ''} need their container "
                 "image (RUN lines, a prebuilt image or a FROM the host is not)" if need_image else "the recipe asks for it")
        raise RuntimeError(f"sandbox {backend}: {which}, but podman cannot run here: {problem}")


def task_rows(inputs: list[Path], wanted: set[int], columns=("path", "task_binary", "task_id", "source",
                                                                "runnable_locally")) -> dict[int, dict]:
    """The task rows (by position across the inputs) that trials need, streamed."""
    rows, i = {}, 0
    for path in inputs:
        for batch in pq.ParquetFile(path).iter_batches(columns=list(columns)):
            for r in batch.to_pylist():
                if i in wanted:
                    rows[i] = r
                i += 1
    return rows


class Progress:
    """Trials done, pass rate, trials/s and ETA: a live bar on a terminal, lines in a log."""

    def __init__(self, total: int, already: int):
        from rich.console import Console
        from rich.progress import BarColumn, TextColumn, TimeRemainingColumn
        from rich.progress import Progress as Bar

        self.total, self.done, self.passed, self.errors = total, already, 0, 0
        self.start, self.last_line, self.run_now = time.monotonic(), 0.0, 0
        self.console = Console(stderr=True)
        self.bar = None
        if self.console.is_terminal:
            self.bar = Bar(TextColumn("rollouts"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                           TextColumn("{task.fields[stats]}"), TimeRemainingColumn(), console=self.console)
            self.task = self.bar.add_task("", total=total, completed=already, stats="")
            self.bar.start()

    def update(self, trace: dict) -> None:
        self.done += 1
        self.run_now += 1
        self.passed += (trace["reward"] or 0) >= 1.0
        self.errors += trace["exception"] is not None
        elapsed = time.monotonic() - self.start
        rate = self.run_now / elapsed if elapsed else 0.0
        eta = (self.total - self.done) / rate if rate else float("inf")
        stats = (f"pass {self.passed / self.run_now:.0%}  errors {self.errors}  {rate:.2f} trials/s")
        if self.bar:
            self.bar.update(self.task, completed=self.done, stats=stats)
        elif time.monotonic() - self.last_line > 10 or self.done == self.total:
            self.last_line = time.monotonic()
            print(f"rollouts {self.done}/{self.total}  {stats}  eta {eta:.0f}s", file=sys.stderr, flush=True)

    def finish(self) -> None:
        if self.bar:
            self.bar.stop()
