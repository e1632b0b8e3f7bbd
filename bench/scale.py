"""The trace path at the paper's scale: wall time and peak RSS per stage and N, and how they grow.

    python bench/scale.py [--n 1000,10000] [--shards 64] [--sft-max 1000] [--sft-workers auto]
                          [--baseline DIR] [--out DIR] [--keep]

For each N, bench/tracegen.py writes N realistic traces (5-100 turns, `<think>` blocks,
terminal outputs of a few KB; ~110 KB each, distribution in its docstring) as the 64 partial
files a rollout leaves when every trial has finished (a restart after a kill), then runs each
stage with default settings in its own fresh child process (peak RSS from that child's own
wait4 rusage, taken by a small launcher process):

- near_dedup: the near-duplicate filter's defaults (MinHash LSH, candidates checked exactly) over
  a task table of N tasks with planted twins (bench/near_dedup.py's generator), its drop guard off;
- skills merge: the skills stage's merge (`otbuild.stages.skills.run`) over that task table and
  one finished shard of N answers (a tag, a tag among words, an answer naming no tag), as its
  shard job leaves them: the rows streamed back beside their tags;
- task_check merge: the task check's merge job (`otbuild.stages.task_check.run`) over N tasks
  whose 2N trials (a solution's and a no-op's, each with a verifier output tail of 2,000
  characters) are done in 64 shards each: both merges, the verdicts, kept and rejected;
- rollout shards: the 64 shard jobs, one after the other in one process (each turns its own
  partial file into shards/K-of-64.parquet);
- rollout merge: `otbuild.stages.rollout.run` (the shards -> traces.parquet and its summary);
- difficulty merge: `otbuild.stages.difficulty.run` on the same shards, read as a pilot's (k 2:
  tracegen gives each of the first N/2 tasks two trials, the others none): traces.parquet, each
  task's pass rate and band, and the task table with them;
- trace_filter: the paper's defaults (min_turns 5, timeouts, subagents, exceptions, dedup);
- sft data: the SFT data preparation (`prepare_sft` below: the tokenized set, with
  the tiny student's tokenizer, cutoff 32768, in --sft-workers processes), only for
  N <= --sft-max (it is slow); reported also as ms per trace per worker (flat when the
  workers scale);
- sharegpt export: `otbuild.train.export.export_llamafactory` of the kept traces.

The table gives seconds, microseconds per trace, peak RSS, and between consecutive sizes the
growth exponents log(t2/t1)/log(N2/N1) of time and of RSS (1 = linear, 0 = flat). Targets:
peak RSS < 2 GB for every stage, RSS within 1.5x from 10K to 100K, time exponent <= 1.1.
With --baseline DIR (another checkout, e.g. /work/main) every stage also runs on that code
and the table adds the ratios baseline / this tree (time and RSS; "failed" when its child
failed, e.g. killed for memory). Data lives under --out (default $TMPDIR/otbuild-scale),
removed at the end unless --keep. Exit 1 when a stage of this tree fails, else 0.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
STAGES = (
    "near_dedup",
    "skills merge",
    "task_check merge",
    "rollout shards",
    "rollout merge",
    "difficulty merge",
    "trace_filter",
    "sft data",
    "sharegpt export",
)
RSS_TARGET_MB = 2048


def prepare_sft(kept: Path, tokenizer_dir: Path, workers: str = "auto") -> dict:
    """The SFT data preparation being measured: the tokenized training set, built once per
    run (otbuild.train.tokenized) in `workers` processes; a --baseline checkout without it runs
    its in-memory path, one without workers one process."""
    try:
        from otbuild.train.tokenized import build_tokenized_set
    except ImportError:  # a baseline from before the tokenized set
        from otbuild.train.data import build, read_conversations
        from otbuild.train.model import load_tokenizer

        tok, _ = load_tokenizer(tokenizer_dir)
        ds = build(tok, read_conversations([kept]), cutoff_len=32768)
        return {"rows": len(ds.rows), "tokens": ds.stats["tokens"], "workers": 1}
    try:
        from otbuild.train.tokenized import BATCH_ROWS, worker_count
    except ImportError:  # a baseline from before the worker processes
        stats = build_tokenized_set([kept], tokenizer_dir, "auto", 32768, kept.parent / "tokenized")
        return {"rows": stats["sequences"], "tokens": stats["tokens"], "workers": 1}
    w = int(workers) if workers.isdigit() else workers
    stats = build_tokenized_set([kept], tokenizer_dir, "auto", 32768, kept.parent / "tokenized", workers=w)
    return {
        "rows": stats["sequences"],
        "tokens": stats["tokens"],
        "workers": max(1, worker_count([kept], BATCH_ROWS, w)),
    }


# --------------------------------------------------------------------------------------------
# data


def generate(data: Path, n: int, shards: int) -> dict:
    """Partial files of N finished trials and a task table of N tasks (1 sample each)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tracegen import write_partials

    done = data / "manifest.json"
    if done.exists():
        return json.loads(done.read_text())
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    pq.write_table(pa.table({"task_id": [f"{i:016x}" for i in range(n)]}), data / "tasks.parquet")
    from near_dedup import generate as task_table  # bench/near_dedup.py: tasks with planted twins

    task_table(data / "task_table.parquet", n)
    skill_answers(data / "skill_answers" / "0-of-1.parquet", n)
    task_check_trials(data, n, shards)
    t0 = time.perf_counter()
    size = write_partials(data / "partials", n, shards)
    manifest = {"n": n, "shards": shards, "bytes": size, "generate_s": time.perf_counter() - t0}
    done.write_text(json.dumps(manifest))
    return manifest


def skill_answers(path: Path, n: int) -> None:
    """N answers of a skills shard job, one per request, as llm_requests writes them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from otbuild.stagekit.llm_requests import ANSWER_SCHEMA

    said = ("networking", "It is mostly text-processing work.", "cooking")
    path.parent.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(path, ANSWER_SCHEMA, compression="zstd") as w:
        for start in range(0, n, 65536):
            rows = range(start, min(n, start + 65536))
            w.write_table(
                pa.table(
                    {
                        "request": list(rows),
                        "text": [said[i % 3] for i in rows],
                        "error": [None] * len(rows),
                        "n_output_tokens": [3] * len(rows),
                        "usage_reported": [True] * len(rows),
                        "n_input_tokens": [200] * len(rows),
                    },
                    ANSWER_SCHEMA,
                )
            )


def task_check_trials(data: Path, n: int, shards: int) -> None:
    """The task_check stage's input (the task table, every task with a solution) and its finished
    shards, data/task_check/{oracle,noop}/shards/K-of-S.parquet: trial t is task t; one task in 10
    fails its solution, one in 17 passes doing nothing."""
    import duckdb
    import pyarrow as pa
    import pyarrow.parquet as pq

    from otbuild.stagekit import shard_path
    from otbuild.traces.table import TRACE_SCHEMA

    duckdb.sql(
        f"COPY (SELECT * REPLACE (true AS has_solution) FROM '{data / 'task_table.parquet'}') "
        f"TO '{data / 'task_check_tasks.parquet'}' (FORMAT parquet)"
    )
    said = "\x1b[31mFAILED\x1b[0m " + "x" * 1990  # what a verifier prints: a 2,000-character tail
    for engine in ("oracle", "noop"):
        for k in range(shards):
            dest = shard_path(data / "task_check" / engine, shards, k)
            dest.parent.mkdir(parents=True, exist_ok=True)
            with pq.ParquetWriter(dest, TRACE_SCHEMA, compression="zstd") as w:
                for start in range(k, n, shards * 4096):
                    rows = []
                    for t in range(start, min(n, start + shards * 4096), shards):
                        passed = (t % 10 != 0) if engine == "oracle" else (t % 17 == 0)
                        rows.append(
                            {
                                "conversations": [{"role": "user", "content": "x"}],
                                "task": f"t{t}",
                                "task_id": f"t{t}",
                                "result": "1.0" if passed else "0.0",
                                "reward": 1.0 if passed else 0.0,
                                "timed_out": False,
                                "is_subagent": False,
                                "metadata": json.dumps({"verifier_output": said}),
                            }
                        )
                    w.write_table(pa.Table.from_pylist(rows, TRACE_SCHEMA))


def tokenizer_dir(out: Path) -> Path:
    """The tiny student's tokenizer, trained once on a few generated traces."""
    from tracegen import TraceGen

    from otbuild.settings.train import TinyModel
    from otbuild.traces.table import TRACE_SCHEMA, write_traces
    from otbuild.train.model import materialise

    sample = out / "tokenizer_traces.parquet"
    write_traces(sample, ({k: r.get(k) for k in TRACE_SCHEMA.names} for r in TraceGen(1).traces(20)))
    return materialise(TinyModel(kind="tiny", max_position_embeddings=32768), out / "tiny", [sample])


# --------------------------------------------------------------------------------------------
# children: one stage each, on the code of PYTHONPATH


def child(stage: str, data: Path, work: Path, tok: Path, sft_workers: str = "auto") -> None:
    from otbuild.settings.stages import RolloutSettings
    from otbuild.stages.trace_filter import TraceFilter

    settings = RolloutSettings(engine="oracle", shards=json.loads((data / "manifest.json").read_text())["shards"])
    rollout_dir, tasks = work / "rollout", [data / "tasks.parquet"]
    kept = work / "trace_filter" / "kept.parquet"
    t0, extra = time.perf_counter(), {}
    if stage == "near_dedup":
        from otbuild.stagekit import Inputs
        from otbuild.stages.near_dedup import NearDedup
        from otbuild.stages.near_dedup import run as near_dedup

        near_dedup(
            NearDedup(max_dropped_fraction=1.0), Inputs.of(tasks=[data / "task_table.parquet"]), work / "near_dedup"
        )
    elif stage == "skills merge":
        from otbuild.stagekit import Inputs
        from otbuild.stages.skills import Skills
        from otbuild.stages.skills import run as skills

        shutil.copytree(data / "skill_answers", work / "skills" / "shards", dirs_exist_ok=True)
        t0 = time.perf_counter()  # the copy above is the shard job's, not the merge's
        cfg = Skills(engine="openai", model="m", base_url="http://127.0.0.1:9/v1")
        skills(cfg, Inputs.of(tasks=[data / "task_table.parquet"]), work / "skills")
    elif stage == "task_check merge":
        from otbuild.stagekit import Inputs
        from otbuild.stages.task_check import TaskCheckSettings
        from otbuild.stages.task_check import run as task_check

        shutil.copytree(data / "task_check", work / "task_check")
        t0 = time.perf_counter()  # the copy is not the stage's
        cfg = TaskCheckSettings(shards=settings.shards, max_dropped_fraction=1.0)
        task_check(cfg, Inputs.of(tasks=[data / "task_check_tasks.parquet"]), work / "task_check")
    elif stage == "rollout shards":
        from otbuild.stages.rollout import run_shard

        for k in range(settings.shards):
            run_shard(settings, tasks, rollout_dir, k)
    elif stage == "rollout merge":
        from otbuild.stages.rollout import run

        run(settings, tasks, rollout_dir)
    elif stage == "difficulty merge":
        from otbuild.stagekit import Inputs
        from otbuild.stages.difficulty import DifficultySettings
        from otbuild.stages.difficulty import run as difficulty

        pilot = DifficultySettings(engine="oracle", k=2, shards=settings.shards, allow_all_impossible=True)
        (work / "difficulty" / "shards").mkdir(parents=True, exist_ok=True)
        for k in range(settings.shards):  # the rollout's shard files, read as the pilot's
            shard = Path("shards") / f"{k}-of-{settings.shards}.parquet"
            (work / "difficulty" / shard).unlink(missing_ok=True)
            os.link(rollout_dir / shard, work / "difficulty" / shard)
        difficulty(pilot, Inputs.of(tasks=tasks), work / "difficulty")
    elif stage == "trace_filter":
        from otbuild.stages.trace_filter import run

        run(TraceFilter(), [rollout_dir / "traces.parquet"], work / "trace_filter")
    elif stage == "sft data":
        extra["workers"] = prepare_sft(kept, tok, sft_workers)["workers"]
    elif stage == "sharegpt export":
        from otbuild.train.export import export_llamafactory

        export_llamafactory([kept], work / "export")
    (work / "result.json").write_text(json.dumps({"stage_s": time.perf_counter() - t0, **extra}))


# Peak RSS comes from the child's own wait4 rusage, taken by this small launcher: Linux carries
# the parent's RSS high-water mark into a child across fork and exec, so waiting from the
# (large) bench or test process would count its memory too.
LAUNCHER = (
    "import os, subprocess, sys; p = subprocess.Popen(sys.argv[2:]); _, st, ru = os.wait4(p.pid, 0); "
    "open(sys.argv[1], 'w').write(str(ru.ru_maxrss)); sys.exit(os.waitstatus_to_exitcode(st))"
)


def measured(cmd: list[str], log: Path, **popen) -> tuple[int, float]:
    """Run cmd (output to `log`); its exit status and peak RSS in MB."""
    rss = log.with_suffix(".maxrss")
    with open(log, "w") as out:
        code = subprocess.run(
            [sys.executable, "-c", LAUNCHER, str(rss), *cmd], stdout=out, stderr=subprocess.STDOUT, check=False, **popen
        ).returncode
    return code, int(rss.read_text()) / 1024 if rss.exists() else 0.0


def run_child(stage: str, data: Path, work: Path, tok: Path, code: Path, sft_workers: str) -> dict:
    """One stage in a fresh process on `code`'s otbuild; its own wall time and peak RSS (the
    SFT data step's worker processes are not in it: each is a process of its own)."""
    (work / "result.json").unlink(missing_ok=True)
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        stage,
        "--data",
        str(data),
        "--work",
        str(work),
        "--tokenizer",
        str(tok),
        "--sft-workers",
        sft_workers,
    ]
    status, rss = measured(cmd, work / f"{stage.replace(' ', '_')}.log", env={**os.environ, "PYTHONPATH": str(code)})
    ok = status == 0 and (work / "result.json").exists()
    res = json.loads((work / "result.json").read_text()) if ok else {}
    return {"ok": ok, "s": res.get("stage_s"), "rss_mb": rss, "workers": res.get("workers")}


def run_tree(data: Path, work: Path, tok: Path, code: Path, n: int, sft_max: int, sft_workers: str) -> dict:
    """Every stage at one N on one checkout; a stage after a failed one is skipped."""
    shutil.rmtree(work, ignore_errors=True)
    shards = work / "rollout" / "shards"
    shards.mkdir(parents=True)
    for p in (data / "partials").iterdir():  # the shard jobs delete their partial files
        os.link(p, shards / p.name)
    out, failed = {}, False
    for stage in STAGES:
        if stage == "sft data" and n > sft_max:
            continue
        out[stage] = (
            {"ok": False, "s": None, "rss_mb": None} if failed else run_child(stage, data, work, tok, code, sft_workers)
        )
        failed = failed or not out[stage]["ok"]
        print(f"  N={n} {stage}: {_fmt(out[stage])}  [{code}]", flush=True)
    return out


# --------------------------------------------------------------------------------------------
# report


def _fmt(r: dict) -> str:
    return f"{r['s']:.2f} s, {r['rss_mb']:.0f} MB" if r["ok"] else "failed"


def _exp(a: float | None, b: float | None, n1: int, n2: int) -> str:
    return f"{math.log(b / a) / math.log(n2 / n1):.2f}" if a and b else "-"


def report(results: dict, baseline: dict | None) -> bool:
    sizes = sorted(results)
    head = f"{'stage':<16} {'N':>7} {'s':>9} {'us/trace':>9} {'peak MB':>8} {'t exp':>6} {'RSS exp':>7}"
    if baseline:
        head += f" {'base s':>8} {'base MB':>8} {'t ratio':>8} {'RSS ratio':>9}"
    print("\n" + head + "\n" + "-" * len(head))
    ok = True
    for stage in STAGES:
        prev = None
        for n in sizes:
            r = results[n].get(stage)
            if r is None:
                continue
            ok = ok and r["ok"] and r["rss_mb"] < RSS_TARGET_MB
            t_exp = _exp(prev[1]["s"], r["s"], prev[0], n) if prev and r["ok"] and prev[1]["ok"] else "-"
            m_exp = _exp(prev[1]["rss_mb"], r["rss_mb"], prev[0], n) if prev and r["ok"] and prev[1]["ok"] else "-"
            line = (
                f"{stage:<16} {n:>7} {r['s']:>9.2f} {r['s'] / n * 1e6:>9.0f} {r['rss_mb']:>8.0f} {t_exp:>6} {m_exp:>7}"
                if r["ok"]
                else f"{stage:<16} {n:>7} {'failed':>9}"
            )
            if baseline and (b := baseline.get(n, {}).get(stage)):
                line += (
                    f" {b['s']:>8.2f} {b['rss_mb']:>8.0f} {b['s'] / r['s']:>7.2f}x {b['rss_mb'] / r['rss_mb']:>8.2f}x"
                    if b["ok"] and r["ok"]
                    else f" {'failed':>8} {b['rss_mb'] or 0:>8.0f}"
                )
            print(line)
            prev = (n, r)
    for label, res in (("", results), ("baseline ", baseline or {})):
        for n in sorted(res):
            r = res[n].get("sft data")
            if r and r["ok"]:
                w = r.get("workers") or 1
                print(
                    f"{label}sft data N={n}: {w} worker process{'es' if w > 1 else ''}, {r['s'] / n * 1e3:.1f} ms "
                    f"per trace, {r['s'] * w / n * 1e3:.1f} ms per trace per worker"
                )
    print(f"\npeak RSS < {RSS_TARGET_MB} MB for every stage and N: {'PASS' if ok else 'FAIL'}")
    return ok


def main(argv: list[str] | None = None) -> int:
    from outdir import out_dir  # bench/outdir.py: --out is made, or refused (exit 2)

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", default="1000,10000", help="comma-separated trace counts (e.g. 1000,10000,100000)")
    ap.add_argument("--shards", type=int, default=64)
    ap.add_argument("--sft-max", type=int, default=1000, help="run the SFT data step only up to this N")
    ap.add_argument(
        "--sft-workers", default="auto", help="worker processes of the SFT data step (auto: one per available CPU)"
    )
    ap.add_argument("--baseline", type=Path, help="another checkout to run the same stages on")
    ap.add_argument("--out", type=out_dir, default=Path(tempfile.gettempdir()) / "otbuild-scale")
    ap.add_argument("--keep", action="store_true", help="keep the generated data and outputs")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--tokenizer", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.data, args.work, args.tokenizer, args.sft_workers)
        return 0
    sys.path.insert(0, str(REPO))
    sizes = [int(x) for x in args.n.split(",")]
    results, baseline = {}, {} if args.baseline else None
    try:
        tok = tokenizer_dir(args.out)
        for n in sizes:
            data = args.out / f"n{n}"
            m = generate(data, n, args.shards)
            print(
                f"N={n}: {m['bytes'] / 1e9:.2f} GB of partial files ({m['bytes'] / n / 1e3:.0f} KB per trace), "
                f"generated in {m['generate_s']:.0f} s",
                flush=True,
            )
            results[n] = run_tree(data, args.out / f"work{n}", tok, REPO, n, args.sft_max, args.sft_workers)
            if args.baseline:
                baseline[n] = run_tree(
                    data, args.out / f"base{n}", tok, args.baseline.resolve(), n, args.sft_max, args.sft_workers
                )
            if not args.keep:  # the biggest N needs the disk for itself
                for d in (data, args.out / f"work{n}", args.out / f"base{n}"):
                    shutil.rmtree(d, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(args.out, ignore_errors=True)
    return 0 if report(results, baseline) else 1


if __name__ == "__main__":
    sys.exit(main())
