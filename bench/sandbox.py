"""Benchmark otbuild's trial loop (sandbox + terminus-2 harness + oracle) against Harbor.

    python bench/sandbox.py [--trials 40] [--concurrency 1,2,4,8] [--harbor-concurrency 1,4]
                            [--no-harbor] [--steps 30] [--profile-trials 10] [--out DIR]

The task is trivial on purpose, so what is measured is the machinery: one command
(`echo ok > /app/out.txt`) and a verifier that checks it. Each configuration runs in its own
fresh subprocess, as a real job would:

- **otbuild**: `run_trial` with the `OracleEngine` (sandbox start, the pty terminal, one
  command turn, the two "task complete" turns, kill_all, the verifier, teardown) over --trials
  copies of the task, `asyncio.gather` under a semaphore of --concurrency, one engine; each
  trial's root is removed after it (as the rollout stage does). Start-up = from launching the
  child (`python bench/sandbox.py --child ...`: interpreter, imports, tasks) to the first
  trial finishing.
- **harbor** (when `.venv-harbor` exists and not --no-harbor): `harbor run` with its `oracle`
  agent and otbuild's container-free environment class
  (`otbuild.harbor.environment:OtbuildEnvironment`) over the same tasks exported as Harbor task
  dirs. Start-up = from launching `harbor run` to the first trial's `finished_at`.

For both, "per trial" = (last trial finished - first trial finished) / (trials - 1): the
steady-state cost of one more trial at that concurrency (trials/s is its inverse); latency =
one trial's own start-to-finish. Per-turn latency (otbuild only; Harbor's oracle runs
solve.sh in one exec, no turns) is the median time between consecutive engine calls over a
task of --steps trivial commands. A phase profile (--profile-trials at concurrency 1, with
timing wrappers, separate from the timed runs) says where otbuild's per-trial time goes.

Targets: otbuild start-up < 1 s; otbuild per trial <= 0.25x Harbor's at equal concurrency.
Exit status: 0 when every trial got reward 1 (targets met or not), 1 when any did not, 2 when
a child fails. Only stdlib is imported at module level so the children start cold.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

HARBOR = Path(os.environ.get("OTBUILD_HARBOR") or ROOT / ".venv-harbor" / "bin" / "harbor")  # as otbuild.harbor.job
TARGET_STARTUP_S = 1.0
TARGET_RATIO = 0.25  # otbuild per trial / Harbor per trial (issue 28.3; 0.5 before)
# Harbor 0.26 earlier on this kind of machine, with a bubblewrap environment class
HARBOR_REFERENCE = "Harbor 0.26 earlier (bubblewrap env class): ~8 s start-up, ~125 ms/trial at c=1, ~75 ms at c=4"

TASK_TOML = (
    'version = "1.0"\n\n[agent]\ntimeout_sec = 120.0\n\n[verifier]\ntimeout_sec = 60.0\n\n'
    "[environment]\ncpus = 1\nmemory_mb = 1024\nallow_internet = false\n"
)
DOCKERFILE = "FROM ubuntu:24.04\nWORKDIR /app\n"


def make_task(index: int, steps: int = 1):
    """A task of `steps` trivial commands: one (`echo ok > /app/out.txt`), or many
    (`echo K >> /app/out.txt`), and a verifier that checks the file."""
    from otbuild.tasks.taskdir import TaskDir

    if steps == 1:
        name, solve, want = f"bench-echo-{index:03d}", "echo ok > /app/out.txt\n", "ok"
    else:
        name = f"bench-steps{steps}-{index:03d}"
        solve = "".join(f"echo {k} >> /app/out.txt\n" for k in range(1, steps + 1))
        want = f"$(seq 1 {steps})"
    task = TaskDir(name)
    task.add("instruction.md", f"Run the reference solution: it writes {want!s} to /app/out.txt.\n")
    task.add("task.toml", TASK_TOML)
    task.add("environment/Dockerfile", DOCKERFILE)
    task.add("solution/solve.sh", "#!/bin/bash\n" + solve, executable=True)
    task.add(
        "tests/test.sh",
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        f'if [ "$(cat /app/out.txt 2>/dev/null)" = "{want}" ]; then echo 1 > /logs/verifier/reward.txt\n'
        "else echo 0 > /logs/verifier/reward.txt; fi\n",
        executable=True,
    )
    return task


# --------------------------------------------------------------------------------------------
# otbuild children


class TimedEngine:
    """The oracle, recording when each turn's completion is asked for (turn boundaries)."""

    def __init__(self, engine):
        self._engine = engine
        self.name, self.provider, self.model = engine.name, engine.provider, engine.model
        self.needs_solution = engine.needs_solution
        self.calls: dict[str, list[float]] = {}

    async def complete(self, messages, *, task, **kw):
        self.calls.setdefault(task.name, []).append(time.perf_counter())
        return await self._engine.complete(messages, task=task, **kw)

    async def aclose(self):
        await self._engine.aclose()


async def run_batch(tasks, engine, concurrency: int, work: Path, backend: str) -> list[dict]:
    import asyncio

    from otbuild.harness.config import TrialConfig
    from otbuild.harness.trial import run_trial
    from otbuild.settings.trials import Trials

    settings = TrialConfig(Trials(sandbox=backend), "terminus2")
    sem = asyncio.Semaphore(concurrency)

    async def one(i, task):
        async with sem:
            t0 = time.perf_counter()
            trace = await run_trial(task, task.task_id(), engine, settings, work / str(i))
            await asyncio.to_thread(shutil.rmtree, work / str(i), True)
            t1 = time.perf_counter()
        return {
            "task": task.name,
            "start": t0,
            "end": t1,
            "reward": trace["reward"],
            "exception": trace["exception"],
            "n_turns": trace["n_turns"],
            "message": json.loads(trace["metadata"]).get("exception_message"),
        }

    return await asyncio.gather(*(one(i, t) for i, t in enumerate(tasks)))


def child_otbuild(args) -> None:
    import asyncio

    from otbuild.harness.oracle import OracleEngine

    t_imports = time.perf_counter()
    engine = TimedEngine(OracleEngine())
    tasks = [make_task(i) for i in range(args.trials)]
    work = args.work / "trials"
    out = {
        "t_imports": t_imports,
        "trials": asyncio.run(run_batch(tasks, engine, args.concurrency, work, args.backend)),
    }
    out["turns_1"] = _turn_gaps(engine.calls)
    if args.steps:  # per-turn latency: a task of many trivial commands, a few times
        engine = TimedEngine(OracleEngine())
        tasks = [make_task(i, args.steps) for i in range(3)]
        out["steps_trials"] = asyncio.run(run_batch(tasks, engine, 1, args.work / "steps", args.backend))
        out["turns_k"] = _turn_gaps(engine.calls)
    (args.work / "result.json").write_text(json.dumps(out))


def _turn_gaps(calls: dict[str, list[float]]) -> dict:
    """Per trial, engine call k -> k+1: the turns that ran a command, and the first
    `task_complete` turn (no command: the harness reads what the screen has, without waiting)."""
    command, confirm = [], []
    for ts in calls.values():
        gaps = [b - a for a, b in itertools.pairwise(ts)]
        command += gaps[:-1]
        confirm += gaps[-1:]
    return {"command": command, "confirm": confirm}


def child_profile(args) -> None:
    """Phases of --trials trials at concurrency 1, timed by wrappers around the functions the
    trial calls. Slower than the plain runs (the wrappers cost a little)."""
    import asyncio
    from collections import defaultdict

    import otbuild.sandbox as sb
    import otbuild.sandbox.identity as ident
    import otbuild.sandbox.sandbox as sbs
    from otbuild.harness import trial
    from otbuild.harness.oracle import OracleEngine
    from otbuild.harness.terminal import Terminal

    spent: dict[str, list[float]] = defaultdict(list)
    counts: dict[str, int] = defaultdict(int)

    def timed(name, fn):
        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent[name].append(time.perf_counter() - t0)

        return wrapper

    # sandbox start (open_sandbox and its parts)
    trial.open_sandbox = timed("sandbox start: open_sandbox (total)", sb.open_sandbox)
    sb.acquire = timed("  uid lock file: identity.acquire (incl. /proc scan)", sb.acquire)
    orig_pids_of_uid = ident.pids_of_uid
    ident.pids_of_uid = timed("  /proc scan by uid: pids_of_uid (each)", orig_pids_of_uid)
    sb.materialise = timed("  materialise layout", sb.materialise)
    sb.write_subtree = timed("  write solution/", sb.write_subtree)
    sb.write_etc = timed("  write etc (passwd, hosts...)", sb.write_etc)
    sb._chown_tree = timed("  chown trial dirs", sb._chown_tree)

    # the terminal
    reads: dict[int, int] = defaultdict(int)
    orig_read = Terminal.read

    def read(self, seconds, until_ready=True):
        n = reads[id(self)]
        reads[id(self)] += 1
        name = (
            "terminal: first prompt (bwrap + bash -i start, settle)"
            if n == 0
            else "terminal: command turn read (until prompt)"
            if until_ready
            else "terminal: no-command turn read (what is there, no wait)"
        )
        return timed(name, orig_read)(self, seconds, until_ready)

    Terminal.read = read
    Terminal.close = timed("terminal: close", Terminal.close)
    orig_init = Terminal.__init__

    def init(self, argv, *a, **kw):
        return timed("terminal: spawn (pty + Popen bwrap)", orig_init)(self, argv, *a, **kw)

    Terminal.__init__ = init
    Terminal.send = timed("terminal: send keystrokes", Terminal.send)
    # the sandbox's commands and teardown
    sbs.Sandbox.argv = timed("sandbox.argv (build bwrap argv; verifier copies tests/)", sbs.Sandbox.argv)
    sbs.Sandbox.park = timed("verifier: box.park (start its sandbox, held)", sbs.Sandbox.park)
    sbs.Parked.run = timed("verifier: parked.run(test.sh) (copy tests, run, its namespace gone)", sbs.Parked.run)
    orig_kill_all = sbs.Sandbox.kill_all

    def kill_all(self, keep=None):
        return timed("kill_all (each; 2 per trial: the terminal's namespace, then a check)", orig_kill_all)(self, keep)

    sbs.Sandbox.kill_all = kill_all
    sbs.end_namespace = timed("  end_namespace (kill a launcher's pid-1, wait: no /proc scan)", sbs.end_namespace)
    sbs.Sandbox.close = timed("sandbox close (total, incl. a kill_all)", sbs.Sandbox.close)
    orig_scan = sbs.scan

    def scan():
        counts["procs.scan calls"] += 1
        return timed("  /proc scan: procs.scan (each)", orig_scan)()

    sbs.scan = scan
    sbs.pids_of_uid = timed("  /proc scan by uid: pids_of_uid (each)", orig_pids_of_uid)
    orig_sleep = time.sleep

    def sleep(s):
        counts["time.sleep calls (kill_until_gone polls)"] += 1
        spent["  time.sleep in kill_until_gone"].append(s)
        orig_sleep(s)

    from otbuild.sandbox import procs

    procs.time = type("T", (), {"monotonic": staticmethod(time.monotonic), "sleep": staticmethod(sleep)})

    engine = OracleEngine()
    orig_complete = engine.complete

    async def complete(messages, **kw):
        t0 = time.perf_counter()
        try:
            return await orig_complete(messages, **kw)
        finally:
            spent["engine.complete (oracle)"].append(time.perf_counter() - t0)

    engine.complete = complete
    orig_rt = trial.run_trial

    async def run_trial(*a, **kw):
        t0 = time.perf_counter()
        try:
            return await orig_rt(*a, **kw)
        finally:
            spent["run_trial (total)"].append(time.perf_counter() - t0)

    trial.run_trial = run_trial
    orig_rmtree = shutil.rmtree
    shutil.rmtree = timed("rmtree trial root (after run_trial)", orig_rmtree)
    # one warm-up trial (first-use costs: bwrap --help probe, split_commands' bash -n)
    tasks = [make_task(i) for i in range(args.trials + 1)]
    asyncio.run(run_batch(tasks[:1], engine, 1, args.work / "warm", args.backend))
    spent.clear()
    counts.clear()
    t0 = time.perf_counter()
    rows = asyncio.run(run_batch(tasks[1:], engine, 1, args.work / "trials", args.backend))
    wall = time.perf_counter() - t0
    shutil.rmtree = orig_rmtree
    (args.work / "result.json").write_text(json.dumps({"spent": spent, "counts": counts, "wall": wall, "trials": rows}))


# --------------------------------------------------------------------------------------------
# parent: launching children


def run_otbuild(kind: str, trials: int, concurrency: int, work: Path, backend: str, steps: int = 0) -> dict:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        kind,
        "--trials",
        str(trials),
        "--concurrency",
        str(concurrency),
        "--work",
        str(work),
        "--backend",
        backend,
        "--steps",
        str(steps),
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise ChildFailed(f"otbuild {kind} child (concurrency {concurrency}) exited {proc.returncode}")
    res = json.loads((work / "result.json").read_text())
    shutil.rmtree(work / "trials", ignore_errors=True)
    return res | {"launch": t0, "process_wall": wall}


class ChildFailed(RuntimeError):
    pass


def export_harbor_tasks(dest: Path, n: int) -> Path:
    shutil.rmtree(dest, ignore_errors=True)
    for i in range(n):
        task = make_task(i)
        task.write(dest / task.name)
    return dest


def run_harbor(tasks_dir: Path, concurrency: int, work: Path) -> dict:
    from otbuild.harbor.job import (
        OTBUILD_IMPORT_PATH,
        harbor_command,
        harbor_env,
        job_config,
        write_job_config,
    )

    name = f"bench-c{concurrency}"
    jobs = work / "jobs"
    shutil.rmtree(jobs / name, ignore_errors=True)
    cfg = job_config(
        tasks_dir,
        jobs,
        name,
        agent="oracle",
        environment="otbuild",
        n_concurrent=concurrency,
        environment_kwargs={"workdir": str(work / "roots")},
    )
    assert cfg["environment"]["import_path"] == OTBUILD_IMPORT_PATH
    path = write_job_config(work / f"{name}.json", cfg)
    log = work / f"{name}.log"
    t_wall, t0 = time.time(), time.perf_counter()
    with open(log, "wb") as f:
        proc = subprocess.run(
            harbor_command(path), stdout=f, stderr=subprocess.STDOUT, cwd=work, env=harbor_env(), check=False
        )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise ChildFailed(
            f"harbor run (concurrency {concurrency}) exited {proc.returncode}; "
            f"log {log}:\n{log.read_text(errors='replace')[-2000:]}"
        )
    rows = []
    for res in sorted((jobs / name).glob("*/result.json")):
        r = json.loads(res.read_text())
        rewards = (r.get("verifier_result") or {}).get("rewards") or {}
        exc = r.get("exception_info") or {}
        # harbor's timestamps are UTC ("...Z"); map them onto perf_counter via the launch
        start = _ts(r["started_at"]) - t_wall + t0
        end = _ts(r["finished_at"]) - t_wall + t0
        rows.append(
            {
                "task": r.get("task_name"),
                "start": start,
                "end": end,
                "reward": rewards.get("reward"),
                "exception": exc.get("exception_type"),
                "message": exc.get("exception_message"),
            }
        )
    return {"launch": t0, "process_wall": wall, "trials": rows}


def _ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


# --------------------------------------------------------------------------------------------
# statistics and report


def summarise(system: str, concurrency: int, res: dict) -> dict:
    rows = res["trials"]
    ends = sorted(r["end"] for r in rows)
    lat = sorted(r["end"] - r["start"] for r in rows)
    n = len(rows)
    per_trial = (ends[-1] - ends[0]) / (n - 1) if n > 1 else lat[0]
    return {
        "system": system,
        "concurrency": concurrency,
        "trials": n,
        "startup_s": ends[0] - res["launch"],
        "imports_s": res["t_imports"] - res["launch"] if "t_imports" in res else None,
        "per_trial_s": per_trial,
        "trials_per_s": 1 / per_trial if per_trial > 0 else float("inf"),
        "lat_median_s": statistics.median(lat),
        "lat_p90_s": _pct(lat, 0.9),
        "process_wall_s": res["process_wall"],
        "failed": [r for r in rows if r["reward"] != 1],
    }


def _pct(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    k = max(0, min(len(sorted_values) - 1, int(-(-q * len(sorted_values) // 1)) - 1))
    return sorted_values[k]


def _ms(s: float | None) -> str:
    return "" if s is None else f"{s * 1000:,.0f}"


def print_table(title: str, header: list[str], body: list[list[str]], left: int = 1) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover
        print(title)
        print("  ".join(header))
        for row in body:
            print("  ".join(row))
        return
    t = Table(title=title)
    for i, h in enumerate(header):
        t.add_column(h, justify="left" if i < left else "right")
    for row in body:
        t.add_row(*row)
    Console(width=160).print(t)


def report(summaries: list[dict], turns: dict, profile: dict | None, args) -> None:
    by = {(s["system"], s["concurrency"]): s for s in summaries}
    header = [
        "system",
        "concurrency",
        "trials",
        "start-up s (to 1st trial)",
        "per trial ms",
        "trials/s",
        "latency median ms",
        "latency p90 ms",
        "process wall s",
        "per trial vs harbor",
    ]
    body = []
    for s in summaries:
        h = by.get(("harbor", s["concurrency"]))
        ratio = f"{s['per_trial_s'] / h['per_trial_s']:.2f}x" if s["system"] == "otbuild" and h else ""
        body.append(
            [
                s["system"],
                str(s["concurrency"]),
                str(s["trials"]),
                f"{s['startup_s']:.3f}",
                _ms(s["per_trial_s"]),
                f"{s['trials_per_s']:.1f}",
                _ms(s["lat_median_s"]),
                _ms(s["lat_p90_s"]),
                f"{s['process_wall_s']:.2f}",
                ratio,
            ]
        )
    print(
        f"machine: {os.cpu_count()} CPUs, uid {os.geteuid()}, backend {args.backend}, python "
        f"{sys.version.split()[0]}; task: one command (echo ok > /app/out.txt) + a verifier"
    )
    print(
        "per trial = (last trial finished - first finished) / (trials - 1); latency = one "
        "trial's own start to finish; start-up = process launch to first trial finished"
    )
    print_table("otbuild trial loop (run_trial + oracle) vs Harbor (oracle + OtbuildEnvironment)", header, body)
    c1 = by.get(("otbuild", 1))
    if turns:
        cmd, conf = turns.get("command") or [], turns.get("confirm") or []

        def cell(xs, q):
            return f"{(statistics.median(xs) if q == 0.5 else _pct(sorted(xs), q)) * 1000:.2f}" if xs else ""

        tb = [
            ["command turn (send + read until prompt + harness)", str(len(cmd)), cell(cmd, 0.5), cell(cmd, 0.9)],
            ["task_complete turn without commands (no wait)", str(len(conf)), cell(conf, 0.5), cell(conf, 0.9)],
        ]
        print_table(
            f"otbuild per-turn latency (oracle, {args.steps}-command task, concurrency 1)",
            ["turn", "n", "median ms", "p90 ms"],
            tb,
        )
    if profile:
        n = len(profile["trials"])
        pb = []
        for name, xs in profile["spent"].items():
            pb.append([name, str(len(xs)), f"{sum(xs) / n * 1000:.1f}", f"{statistics.median(xs) * 1000:.2f}"])
        for name, k in profile["counts"].items():
            pb.append([name, str(k), "", f"{k / n:.1f} per trial"])
        print_table(
            f"otbuild phase profile ({n} trials, concurrency 1, wall {profile['wall'] / n * 1000:.0f} "
            "ms/trial with wrappers)",
            ["phase", "calls", "ms per trial", "median ms per call"],
            pb,
        )
    print(HARBOR_REFERENCE)
    if c1:
        ok = c1["startup_s"] < TARGET_STARTUP_S
        print(
            f"{'PASS' if ok else 'FAIL'}: otbuild start-up {c1['startup_s']:.3f} s "
            f"(imports {c1['imports_s']:.3f} s) (target < {TARGET_STARTUP_S:g} s)"
        )
        print(
            f"otbuild trial overhead at concurrency 1: median {_ms(c1['lat_median_s'])} ms, "
            f"p90 {_ms(c1['lat_p90_s'])} ms over {c1['trials']} trials"
        )
    for s in summaries:
        h = by.get(("harbor", s["concurrency"]))
        if s["system"] != "otbuild" or not h:
            continue
        r = s["per_trial_s"] / h["per_trial_s"]
        print(
            f"{'PASS' if r <= TARGET_RATIO else 'FAIL'}: concurrency {s['concurrency']}: otbuild "
            f"{_ms(s['per_trial_s'])} ms/trial vs harbor {_ms(h['per_trial_s'])} ms/trial = {r:.2f}x "
            f"(target <= {TARGET_RATIO:g}x)"
        )
    if not any(s["system"] == "harbor" for s in summaries):
        print("harbor: not run (--no-harbor or no .venv-harbor); no per-trial comparison")


def _progress(s: dict) -> None:
    print(
        f"{s['system']} c={s['concurrency']}: start-up {s['startup_s']:.3f} s, {_ms(s['per_trial_s'])} "
        f"ms/trial, median latency {_ms(s['lat_median_s'])} ms",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    from outdir import out_dir  # bench/outdir.py: --out is made, or refused (exit 2)

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=40, help="copies of the one-command task per run")
    ap.add_argument("--concurrency", default="1,2,4,8", help="otbuild concurrency levels")
    ap.add_argument("--harbor-concurrency", default="1,4", help="Harbor concurrency levels")
    ap.add_argument("--no-harbor", action="store_true", help="skip Harbor")
    ap.add_argument("--steps", type=int, default=30, help="commands in the per-turn task (0: skip)")
    ap.add_argument("--profile-trials", type=int, default=10, help="trials in the phase profile (0: skip)")
    ap.add_argument("--backend", default="bwrap", choices=["bwrap", "unshare", "none"])
    ap.add_argument("--out", type=out_dir, default=Path(tempfile.gettempdir()) / "otbuild-bench-sandbox")
    ap.add_argument("--child", choices=["otbuild", "profile"], help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        args.concurrency = int(args.concurrency)
        (child_otbuild if args.child == "otbuild" else child_profile)(args)
        return 0
    if args.trials < 2:
        ap.error("--trials must be at least 2")
    levels = [int(x) for x in args.concurrency.split(",") if x]
    harbor_levels = [int(x) for x in args.harbor_concurrency.split(",") if x]
    use_harbor = not args.no_harbor and HARBOR.is_file() and os.access(HARBOR, os.X_OK)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)

    summaries, turns, profile = [], {}, None
    tasks_dir = export_harbor_tasks(out / "harbor" / "tasks", args.trials) if use_harbor else None
    try:
        # otbuild and harbor alternate, level by level, so both see the same machine load
        for c in sorted(set(levels) | (set(harbor_levels) if use_harbor else set())):
            if c in levels:
                res = run_otbuild(
                    "otbuild",
                    args.trials,
                    c,
                    out / f"otbuild-c{c}",
                    args.backend,
                    steps=args.steps if c == levels[0] else 0,
                )
                s = summarise("otbuild", c, res)
                summaries.append(s)
                if "turns_k" in res:
                    turns = res["turns_k"]
                    s["failed"] += [r for r in res["steps_trials"] if r["reward"] != 1]
                _progress(s)
            if use_harbor and c in harbor_levels:
                s = summarise("harbor", c, run_harbor(tasks_dir, c, out / "harbor"))
                summaries.append(s)
                _progress(s)
        if use_harbor:
            shutil.rmtree(out / "harbor" / "roots", ignore_errors=True)
        if args.profile_trials:
            profile = run_otbuild("profile", args.profile_trials, 1, out / "profile", args.backend)
    except ChildFailed as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 2
    summaries.sort(key=lambda s: (s["concurrency"], s["system"] != "otbuild"))
    report(summaries, turns, profile, args)
    failed = [(s["system"], s["concurrency"], r) for s in summaries for r in s["failed"]]
    for system, c, r in failed[:10]:
        print(
            f"FAILED TRIAL: {system} c={c} {r['task']}: reward {r['reward']}, exception "
            f"{r['exception']}: {(r.get('message') or '')[:300]}"
        )
    print(f"trials: {'ALL PASSED (reward 1)' if not failed else f'{len(failed)} FAILED'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
