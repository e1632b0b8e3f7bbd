"""Benchmark near_dedup (MinHash LSH, candidates checked exactly) beside task_filter's exact dedup.

    python bench/near_dedup.py [--n 10000,100000,1000000] [--memory 1GB] [--out DIR]

For each N, generates (seeded, cached under --out) N tasks of 30-60 words (~250 characters) from
a 20,000-word vocabulary, with planted twins: 5% copy an earlier task with one or two words
changed (near-duplicates: Jaccard of 5-character shingles 0.8-0.95, the exact value noted) and
2% copy one in other case and spacing (exact duplicates once normalised). Then runs, each in its
own fresh subprocess with DuckDB capped at --memory (OTBUILD_DUCKDB_MEMORY):

- exact: `otbuild.stages.task_filter.run` with only `dedup` (the baseline);
- near: `otbuild.stages.near_dedup.run` with its defaults (128 permutations, 5-character
  shingles, threshold 0.8), `max_dropped_fraction` 1.

Prints, per N, seconds, peak RSS of the child (its own wait4 rusage), rows dropped and the
planted twins found, with near's ratios against exact. Exit 0 when both run and near drops
every exact duplicate and no task that is no twin; 1 otherwise; 2 when a child fails.
Only stdlib is imported at module level so a child's RSS is its own.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GEN_VERSION = 1  # bump when the generator changes, so cached data is regenerated
NEAR, EXACT = 0.05, 0.02  # shares of planted near-duplicates and exact ones


def generate(path: Path, n: int, seed: int = 1) -> dict:
    """N tasks as a task parquet; returns the planted twins {path: (kind, original path, jaccard)}."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from otbuild.stages.near_dedup import jaccard, shingles
    from otbuild.tasks.table import TASK_SCHEMA

    rng = random.Random(seed)
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9))) for _ in range(20_000)]
    texts: list[str] = []
    planted: dict[str, tuple[str, str, float]] = {}
    with pq.ParquetWriter(path, TASK_SCHEMA, compression="zstd") as w:
        batch: list[dict] = []
        for i in range(n):
            roll = rng.random()
            if i > 10 and roll < NEAR + EXACT:
                j = rng.randrange(i - min(i, 100_000), i)  # an earlier task (the last 100K kept in memory)
                original = texts[j - (i - len(texts))]
                if roll < NEAR:
                    words = original.split()
                    for _ in range(rng.randint(1, 2)):
                        words[rng.randrange(len(words))] = rng.choice(vocab)
                    text = " ".join(words)
                    kind = "near"
                else:
                    text = "  " + original.upper().replace(" ", "\n ")
                    kind = "exact"
                planted[f"t{i}"] = (kind, f"t{j}", jaccard(shingles(text, 5), shingles(original, 5)))
            else:
                text = " ".join(rng.choice(vocab) for _ in range(rng.randint(30, 60)))
            texts.append(text)
            if len(texts) > 100_000:
                texts.pop(0)
            batch.append(
                {"path": f"t{i}", "task_binary": b"", "task_id": f"t{i}", "source": "synthetic", "instruction": text}
            )
            if len(batch) == 50_000:
                w.write_table(pa.Table.from_pylist(batch, TASK_SCHEMA))
                batch = []
        if batch:
            w.write_table(pa.Table.from_pylist(batch, TASK_SCHEMA))
    return planted


def child(impl: str, data: Path, work: Path) -> None:
    from otbuild.stagekit import Inputs

    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if impl == "exact":
        from otbuild.stages.task_filter import TaskFilter, run

        stats = run(TaskFilter(dedup=True), Inputs.of(tasks=[data]), work)
    else:
        from otbuild.stages.near_dedup import NearDedup
        from otbuild.stages.near_dedup import run as near

        stats = near(NearDedup(max_dropped_fraction=1.0), Inputs.of(tasks=[data]), work)
    seconds = time.perf_counter() - t0
    import pyarrow.parquet as pq

    rejected = pq.read_table(work / "rejected.parquet", columns=["path", "reason"]).to_pydict()
    (work / "result.json").write_text(
        json.dumps({"s": seconds, "stats": stats, "rejected": dict(zip(rejected["path"], rejected["reason"]))})
    )


def run_child(impl: str, data: Path, work: Path, memory: str) -> dict:
    cmd = [sys.executable, __file__, "--child", impl, "--data", str(data), "--work", str(work)]
    proc = subprocess.Popen(cmd, env={**os.environ, "OTBUILD_DUCKDB_MEMORY": memory})
    _, status, usage = os.wait4(proc.pid, 0)  # rusage of this child alone
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(2)
    return json.loads((work / "result.json").read_text()) | {"rss_mb": usage.ru_maxrss / 1024}


def main() -> int:
    from outdir import out_dir  # bench/outdir.py: --out is made, or refused (exit 2)

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", default="10000,100000,1000000", help="task counts, comma-separated")
    p.add_argument("--memory", default="1GB", help="DuckDB's memory limit in the children")
    p.add_argument("--out", type=out_dir, default=Path(tempfile.gettempdir()) / "otbuild-bench-near-dedup")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child, args.data, args.work)
        return 0

    ok, rows = True, []
    for n in (int(x) for x in args.n.split(",")):
        data, meta = args.out / f"tasks-{n}-v{GEN_VERSION}.parquet", args.out / f"planted-{n}-v{GEN_VERSION}.json"
        if not (data.exists() and meta.exists()):
            meta.write_text(json.dumps(generate(data, n)))
        planted = json.loads(meta.read_text())
        results = {impl: run_child(impl, data, args.out / f"run-{n}-{impl}", args.memory) for impl in ("exact", "near")}
        # what each found of the planted twins (near: those at or above its threshold)
        twins = {k: {p for p, (kind, _, _) in planted.items() if kind == k} for k in ("exact", "near")}
        above = {p for p in twins["near"] if planted[p][2] >= 0.8}
        near_rej, exact_rej = set(results["near"]["rejected"]), set(results["exact"]["rejected"])
        stray = near_rej - set(planted)  # dropped, yet no planted twin: a false merge
        ok &= twins["exact"] <= near_rej and not stray
        for impl, r in results.items():
            rej = near_rej if impl == "near" else exact_rej
            found = f"exact {len(twins['exact'] & rej)}/{len(twins['exact'])}, near {len(above & rej)}/{len(above)}"
            rows.append((n, impl, r["s"], r["rss_mb"], len(rej), found, results["exact"]))
        print(
            f"N={n:,}: near_dedup lsh {results['near']['stats']['lsh']}; planted near twins under 0.8: "
            f"{len(twins['near'] - above)} (kept or dropped: {len((twins['near'] - above) & near_rej)} dropped "
            f"via a closer twin); stray drops: {len(stray)}",
            flush=True,
        )
    print()
    print(f"{'N':>10} {'impl':<6} {'seconds':>9} {'peak RSS MB':>12} {'dropped':>9}  {'planted found':<32} vs exact")
    for n, impl, s, rss, dropped, found, base in rows:
        ratio = (
            "baseline"
            if impl == "exact"
            else f"time x{s / base['s']:.1f}, RSS x{rss / base_rss[n]:.2f}, "
            f"dropped x{dropped / max(1, len(base['rejected'])):.2f}"
        )
        print(f"{n:>10,} {impl:<6} {s:>9.1f} {rss:>12.0f} {dropped:>9,}  {found:<32} {ratio}")
        if impl == "exact":
            base_rss[n] = rss
    print(f"\noutputs: {'OK' if ok else 'WRONG (an exact duplicate kept, or a task that is no twin dropped)'}")
    return 0 if ok else 1


base_rss: dict[int, float] = {}

if __name__ == "__main__":
    sys.exit(main())
