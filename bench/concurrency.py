"""Trials/s against concurrency: otbuild's trial loop with a model that answers after a set latency.

    python bench/concurrency.py [--concurrency 1,2,4,8,16,32,64] [--latency 1.0] [--turns 5]
                                [--rounds 2] [--target 0.85] [--out DIR]

The model is the tests' stand-in endpoint (`tests/support/standin.py`: an OpenAI-compatible server on
127.0.0.1), run by this parent process and answering every request after --latency seconds,
as a served model whose answer takes that long. Its answers follow the terminus-2 protocol:
request k (counted from the assistant turns in the conversation) runs `echo k >> /app/out.txt`
for k = 1 .. turns - 2, then `task_complete` twice (the harness confirms it): --turns requests
per trial (at least 4). The tasks are bench/sandbox.py's many-step ones (`make_task(i, turns -
2)`, whose verifier checks 1 .. turns - 2 in /app/out.txt), so every trial gets reward 1.

Each level C runs in its own fresh child: C x --rounds trials as the rollout stage runs them
(`run_trial` under a semaphore of C, one `openai` engine with concurrency C, over httpx, bwrap
sandboxes), after one untimed request (the client's one-off set-up). wall = first trial started to last trial finished; trials/s = trials / wall.
ideal trials/s = C / (turns x latency): what C trials in flight give when a trial costs only
its model's time (so the efficiency also counts the harness's own time per trial, which at
concurrency 1 is the whole gap); efficiency = trials/s / ideal. Also printed: each level's
median trial latency and its overhead over turns x latency.

PASS when the efficiency is >= --target (85%) at every level. Exit status: 0 when every trial
got reward 1 (targets met or not), 1 when any did not, 2 when a child fails.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

TARGET = 0.85


def answer(body: dict, turns: int) -> tuple[int, dict]:
    """The stand-in model's reply to one request: the next step of a `turns`-request trial."""
    from tests.support.standin import chat_answer

    k = sum(1 for m in body["messages"] if m["role"] == "assistant") + 1
    steps = turns - 2
    commands = [{"keystrokes": f"echo {k} >> /app/out.txt\n", "duration": 5}] if k <= steps else []
    text = json.dumps(
        {
            "analysis": f"step {k} of {turns}",
            "plan": "append the next number" if commands else "done",
            "commands": commands,
            "task_complete": k > steps,
        }
    )
    return 200, chat_answer(text)


def start_endpoint(latency: float, turns: int):
    from tests.support.standin import Scripted

    server = Scripted(lambda body: answer(body, turns), delay=latency)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# --------------------------------------------------------------------------------------------
# child: one concurrency level


def child(args) -> None:
    import asyncio

    from sandbox import make_task  # bench/sandbox.py's task

    from otbuild.engines.openai import OpenAIEngine
    from otbuild.harness.config import TrialConfig
    from otbuild.harness.trial import run_trial
    from otbuild.settings.engines import LLM
    from otbuild.settings.trials import Trials

    c = args.child
    settings = TrialConfig(Trials(sandbox="bwrap"), "terminus2")
    tasks = [make_task(i, args.turns - 2) for i in range(c * args.rounds)]
    work = args.work / "trials"

    async def run() -> list[dict]:
        engine = OpenAIEngine(
            LLM(engine="openai", model="stand-in", base_url=args.base_url, concurrency=c, max_retries=0)
        )
        # one request first, untimed: the client's one-off set-up (httpx, its TLS context: ~0.25 s),
        # which a rollout pays once per job, not per trial
        await engine.complete([{"role": "user", "content": "warm-up"}])
        sem = asyncio.Semaphore(c)

        async def one(i, task):
            async with sem:
                t0 = time.perf_counter()
                trace = await run_trial(task, task.task_id(), engine, settings, work / str(i))
                t1 = time.perf_counter()
            await asyncio.to_thread(shutil.rmtree, work / str(i), True)
            return {
                "start": t0,
                "end": t1,
                "reward": trace["reward"],
                "n_turns": trace["n_turns"],
                "exception": trace["exception"],
                "result": trace["result"],
            }

        try:
            return await asyncio.gather(*(one(i, t) for i, t in enumerate(tasks)))
        finally:
            await engine.aclose()

    (args.work / "result.json").write_text(json.dumps(asyncio.run(run())))


# --------------------------------------------------------------------------------------------
# parent


class ChildFailed(RuntimeError):
    pass


def run_level(c: int, args, base_url: str) -> dict:
    work = args.out / f"c{c}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        str(c),
        "--base-url",
        base_url,
        "--work",
        str(work),
        "--turns",
        str(args.turns),
        "--rounds",
        str(args.rounds),
    ]
    proc = subprocess.run(cmd, check=False)
    if proc.returncode != 0:
        raise ChildFailed(f"concurrency {c}: child exited {proc.returncode}")
    rows = json.loads((work / "result.json").read_text())
    shutil.rmtree(work, ignore_errors=True)
    return summarise(c, rows, args)


def summarise(c: int, rows: list[dict], args) -> dict:
    wall = max(r["end"] for r in rows) - min(r["start"] for r in rows)
    floor = args.turns * args.latency  # a trial's model time
    rate, ideal = len(rows) / wall, c / floor
    latency = statistics.median(r["end"] - r["start"] for r in rows)
    return {
        "concurrency": c,
        "trials": len(rows),
        "wall_s": wall,
        "trials_per_s": rate,
        "ideal": ideal,
        "efficiency": rate / ideal,
        "latency_s": latency,
        "overhead_ms": (latency - floor) * 1000,
        "failed": [r for r in rows if r["reward"] != 1 or r["n_turns"] != args.turns],
    }


def report(levels: list[dict], args) -> bool:
    from sandbox import print_table  # bench/sandbox.py's table

    body = [
        [
            str(s["concurrency"]),
            str(s["trials"]),
            f"{s['wall_s']:.2f}",
            f"{s['trials_per_s']:.2f}",
            f"{s['ideal']:.2f}",
            f"{s['efficiency']:.1%}",
            f"{s['latency_s']:.3f}",
            f"{s['overhead_ms']:.0f}",
            "PASS" if s["efficiency"] >= args.target else "FAIL",
        ]
        for s in levels
    ]
    print_table(
        f"otbuild trials/s against concurrency (model latency {args.latency:g} s, {args.turns} "
        f"requests per trial, {args.rounds} rounds)",
        [
            "concurrency",
            "trials",
            "wall s",
            "trials/s",
            "ideal trials/s",
            "efficiency",
            "latency median s",
            "overhead ms",
            f">= {args.target:.0%}",
        ],
        body,
        left=0,
    )
    print(
        f"ideal trials/s = concurrency / (turns x latency) = concurrency / {args.turns * args.latency:g} s; "
        "efficiency = trials/s / ideal; overhead = median trial latency - turns x latency"
    )
    worst = min(levels, key=lambda s: s["efficiency"])
    ok = worst["efficiency"] >= args.target
    print(
        f"{'PASS' if ok else 'FAIL'}: efficiency >= {args.target:.0%} at every concurrency up to "
        f"{max(s['concurrency'] for s in levels)} (lowest {worst['efficiency']:.1%} at {worst['concurrency']})"
    )
    return ok


def main(argv: list[str] | None = None) -> int:
    from outdir import out_dir  # bench/outdir.py: --out is made, or refused (exit 2)

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", default="1,2,4,8,16,32,64", help="levels, each in its own child")
    ap.add_argument("--latency", type=float, default=1.0, help="seconds the model takes per request")
    ap.add_argument("--turns", type=int, default=5, help="requests per trial (>= 4: turns - 2 commands)")
    ap.add_argument("--rounds", type=int, default=2, help="trials per level = concurrency x rounds")
    ap.add_argument("--target", type=float, default=TARGET, help="efficiency to reach at every level")
    ap.add_argument("--out", type=out_dir, default=Path(tempfile.gettempdir()) / "otbuild-bench-concurrency")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--base-url", help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.turns < 4:
        ap.error("--turns must be at least 4 (two commands or more, then task_complete twice)")
    if args.child:
        child(args)
        return 0
    args.out = args.out.resolve()
    server = start_endpoint(args.latency, args.turns)
    levels = []
    try:
        for c in [int(x) for x in args.concurrency.split(",") if x]:
            s = run_level(c, args, server.base_url)
            levels.append(s)
            print(
                f"c={c}: {s['trials']} trials in {s['wall_s']:.2f} s, {s['trials_per_s']:.2f} trials/s, "
                f"efficiency {s['efficiency']:.1%}",
                flush=True,
            )
    except ChildFailed as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 2
    finally:
        server.shutdown()
        server.server_close()
    report(levels, args)
    failed = [(s["concurrency"], r) for s in levels for r in s["failed"]]
    for c, r in failed[:10]:
        print(f"FAILED TRIAL: c={c}: reward {r['reward']}, {r['n_turns']} turns, result {r['result']}")
    print(f"trials: {'ALL PASSED (reward 1)' if not failed else f'{len(failed)} FAILED'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
