"""Benchmark task_filter's decontamination (DuckDB, hashed n-grams) against plain Python.

    python bench/decontaminate.py [--rows 50000] [--benchmark-tasks 500] [--ngram 13] [--out DIR]

Generates (seeded, cached under --out) a training task table of --rows instructions (100-500
words from a 5,000-word vocabulary) and a benchmark of --benchmark-tasks instructions
(200-800 words); 1% of the training rows quote a 20-40 word span of a benchmark task and
0.2% copy one whole (in upper case). Then runs, each in its own fresh subprocess:

- duckdb: the real stage, `otbuild.stages.task_filter.run` with only `decontaminate` set;
- python-index: a Python dict from each benchmark n-gram to its tasks, training rows streamed;
- python-pairwise: every training row against every benchmark task (`reference`, the rule as
  docs/task-filter.md states it; the test's oracle), on --pairwise-rows rows, extrapolated.

Reports wall time, rows/s, peak RSS of each child (its own wait4 rusage) and the ratios against
python-index; checks that the three name the same benchmark task with the same reason for every
row they both saw. Exit status: 0 when they agree, 1 when they differ, 2 when a child fails.
Only stdlib is imported at module level so a child's RSS is its own.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GEN_VERSION = 2  # bump when the generator changes, so cached data is regenerated
BENCH = "bench"


# -- the rule, in plain Python --------------------------------------------------------------
def words(text: str | None) -> list[str]:
    return re.sub(r"[^a-z0-9]+", " ", (text or "").lower()).split()


def grams(w: list[str], n: int) -> set[tuple[str, ...]]:
    """Word n-grams; a text shorter than n words is one gram of all its words."""
    return {tuple(w[i : i + n]) for i in range(max(len(w) - n + 1, 1))}


def _verdict(key_reasons):
    best = min(key_reasons, default=None)
    return best[1] if best else None


def fuzzy_score(a: str, b: str, threshold: float):
    """OpenThoughts-Agent's fuzzy rule: rapidfuzz ratio, else partial_ratio, over 100 >= threshold."""
    from rapidfuzz import fuzz

    for name, scorer in (("ratio", fuzz.ratio), ("partial_ratio", fuzz.partial_ratio)):
        if (score := scorer(a, b, score_cutoff=round(threshold * 100, 9)) / 100) >= threshold:
            return name, score
    return None


def _fuzzy_found(w, candidates, fuzzy: float):
    """The fuzzy verdicts of one row against (b, bench, path, words) candidates."""
    found = []
    for b, bench, path, rw in candidates:
        if m := fuzzy_score(" ".join(w), " ".join(rw), fuzzy):
            found.append(((2, -m[1], b, path), f"contaminated by {bench}: fuzzy {m[0]} {m[1]:.2f} with task {path}"))
    return found


def reference(
    train: list[str],
    benchmarks: list[tuple[str, list[tuple[str, str]]]],
    n: int,
    min_shared: int = 1,
    fuzzy: float | None = None,
) -> dict[int, str]:
    """Every training row against every benchmark task: row index -> reason, for the rows an
    equal normalised text or >= min_shared shared n-grams contaminate, or (with `fuzzy`, the
    rows neither catches) a fuzzy score >= fuzzy with any benchmark task, as OpenThoughts-Agent
    scores every pair. Ties: equal text first, then the most shared grams, then the best fuzzy
    score, then the benchmark's place, then the task path."""
    refs = [(b, bench, path, words(text)) for b, (bench, tasks) in enumerate(benchmarks) for path, text in tasks]
    refs = [(b, bench, path, w, grams(w, n)) for b, bench, path, w in refs if w]
    out = {}
    for i, text in enumerate(train):
        if not (w := words(text)):
            continue
        mine, found = grams(w, n), []
        for b, bench, path, rw, rgrams in refs:
            if rw == w:
                found.append(((0, 0, b, path), f"contaminated by {bench}: same instruction as task {path}"))
            elif len(shared := mine & rgrams) >= min_shared:
                found.append(
                    (
                        (1, -len(shared), b, path),
                        f"contaminated by {bench}: {len(shared)} shared {n}-grams with task {path}",
                    )
                )
        if not found and fuzzy:
            found = _fuzzy_found(w, [r[:4] for r in refs], fuzzy)
        if found:
            out[i] = _verdict(found)
    return out


def indexed(
    train,
    benchmarks,
    n: int,
    min_shared: int = 1,
    fuzzy: float | None = None,
    fuzzy_ngram: int = 5,
    fuzzy_min_shared: int = 2,
):
    """The same rule through a dict from n-gram to benchmark tasks, the fuzzy pass on the pairs
    sharing >= fuzzy_min_shared fuzzy_ngram-grams (the stage's pre-filter); yields (row, reason)."""
    from collections import Counter

    index, texts, findex, ref_words = {}, {}, {}, {}
    for b, (bench, tasks) in enumerate(benchmarks):
        for path, text in tasks:
            if w := words(text):
                texts.setdefault(tuple(w), []).append((b, bench, path))
                ref_words[b, bench, path] = w
                for g in grams(w, n):
                    index.setdefault(g, []).append((b, bench, path))
                for g in grams(w, fuzzy_ngram) if fuzzy else ():
                    findex.setdefault(g, []).append((b, bench, path))
    for i, text in enumerate(train):
        if not (w := words(text)):
            continue
        shared, exact = Counter(t for g in grams(w, n) for t in index.get(g, ())), texts.get(tuple(w), [])
        found = [
            ((0, 0, b, path), f"contaminated by {bench}: same instruction as task {path}") for b, bench, path in exact
        ]
        found += [
            ((1, -k, b, path), f"contaminated by {bench}: {k} shared {n}-grams with task {path}")
            for (b, bench, path), k in shared.items()
            if k >= min_shared and (b, bench, path) not in exact
        ]
        if not found and fuzzy:
            cands = Counter(t for g in grams(w, fuzzy_ngram) for t in findex.get(g, ()))
            found = _fuzzy_found(
                w, [(*t, ref_words[t]) for t, k in sorted(cands.items()) if k >= fuzzy_min_shared], fuzzy
            )
        if found:
            yield i, _verdict(found)


# -- data -------------------------------------------------------------------------------------
def generate(data: Path, rows: int, bench_tasks: int, seed: int = 0) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from otbuild.tasks.table import TASK_SCHEMA

    stamp = data / "manifest.json"
    want = {"version": GEN_VERSION, "rows": rows, "bench_tasks": bench_tasks, "seed": seed}
    if stamp.exists() and json.loads(stamp.read_text()) == want:
        return
    data.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    syll = ["ka", "to", "ri", "mu", "sel", "da", "ven", "po", "li", "qua", "ner", "fi", "zo", "bar"]
    vocab = sorted({"".join(rng.choices(syll, k=rng.randint(2, 4))) for _ in range(6000)})[:5000]

    def text(lo, hi):
        return " ".join(rng.choices(vocab, k=rng.randint(lo, hi)))

    def table(name, texts):
        return pa.Table.from_pylist(
            [
                {
                    "path": f"{name}-{i}",
                    "task_binary": b"",
                    "task_id": f"{name}-{i}",
                    "source": name,
                    "instruction": t,
                    "has_solution": False,
                    "has_tests": False,
                    "runnable_locally": True,
                    "metadata": "{}",
                }
                for i, t in enumerate(texts)
            ],
            TASK_SCHEMA,
        )

    bench, planted = [text(200, 800) + "." for _ in range(bench_tasks)], {}
    pq.write_table(table(BENCH, bench), data / "bench.parquet")
    with pq.ParquetWriter(data / "train.parquet", TASK_SCHEMA) as writer:
        for start in range(0, rows, 10_000):
            batch = []
            for i in range(start, min(rows, start + 10_000)):
                t, roll = text(100, 500), rng.random()
                if roll < 0.002:
                    t, planted[f"train-{i}"] = rng.choice(bench).upper(), "copy"
                elif roll < 0.012:
                    src = rng.choice(bench).split()
                    k = rng.randint(0, len(src) - 40)
                    t += " " + " ".join(src[k : k + rng.randint(20, 40)])
                    planted[f"train-{i}"] = "quote"
                elif roll < 0.015:  # a reworded span: every 6th word replaced, so no 13-gram survives
                    src = rng.choice(bench).split()
                    k = rng.randint(0, len(src) - 150)
                    t = " ".join(
                        rng.choice(vocab) if j % 6 == 5 else w for j, w in enumerate(src[k : k + rng.randint(50, 150)])
                    )
                    planted[f"train-{i}"] = "reworded"
                batch.append(t)
            writer.write_table(
                table("train", batch).set_column(0, "path", pa.array([f"train-{start + i}" for i in range(len(batch))]))
            )
    (data / "planted.json").write_text(json.dumps(planted))
    stamp.write_text(json.dumps(want))


# -- children ----------------------------------------------------------------------------------
def child(impl: str, data: Path, work: Path, ngram: int, fuzzy: float | None, rows_cap: int) -> None:
    """One implementation; `rows_cap` bounds the pairwise one (its time is extrapolated)."""
    import pyarrow.parquet as pq

    bench = [
        (BENCH, list(zip(*pq.read_table(data / "bench.parquet", columns=["path", "instruction"]).to_pydict().values())))
    ]
    t0 = time.perf_counter()
    if impl == "duckdb":
        from otbuild.stagekit import Inputs
        from otbuild.stages import task_filter
        from otbuild.stages.task_filter import TaskFilter

        settings = TaskFilter(dedup=False, decontaminate={"against": [BENCH], "ngram": ngram, "fuzzy": fuzzy})
        stats = task_filter.run(
            settings, Inputs.of(tasks=[data / "train.parquet"], held_out=[data / "bench.parquet"]), work
        )
        rows = pq.read_table(work / "rejected.parquet", columns=["path", "reason"]).to_pydict()
        verdicts = dict(zip(rows["path"], rows["reason"]))
        seen = pq.read_metadata(data / "train.parquet").num_rows
        assert sum(stats["contaminated"][BENCH].values()) == len(verdicts), stats
    else:
        f = pq.ParquetFile(data / "train.parquet")
        seen, verdicts = 0, {}
        for batch in f.iter_batches(batch_size=5_000, columns=["path", "instruction"]):
            b = batch.to_pydict()
            if impl == "python-pairwise":
                b = {k: v[: rows_cap - seen] for k, v in b.items()}
            found = (
                reference(b["instruction"], bench, ngram, fuzzy=fuzzy)
                if impl == "python-pairwise"
                else dict(indexed(b["instruction"], bench, ngram, fuzzy=fuzzy))
            )
            verdicts.update({b["path"][i]: r for i, r in found.items()})
            seen += len(b["path"])
            if impl == "python-pairwise" and seen >= rows_cap:
                break
    (work / "result.json").write_text(json.dumps({"s": time.perf_counter() - t0, "rows": seen, "verdicts": verdicts}))


def run_child(impl: str, data: Path, work: Path, args, fuzzy: float | None, rows_cap: int) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        __file__,
        "--child",
        impl,
        "--data-dir",
        str(data),
        "--work",
        str(work),
        "--ngram",
        str(args.ngram),
        "--pairwise-rows",
        str(rows_cap),
        "--fuzzy",
        str(fuzzy or 0),
    ]
    proc = subprocess.Popen(cmd)
    _, status, usage = os.wait4(proc.pid, 0)  # rusage of this child alone
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(2)
    return json.loads((work / "result.json").read_text()) | {"impl": impl, "rss_mb": usage.ru_maxrss / 1024}


IMPLS = ("duckdb", "python-index", "python-pairwise")


def main() -> int:
    from outdir import out_dir  # bench/outdir.py: --out is made, or refused (exit 2)

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=50_000)
    p.add_argument("--benchmark-tasks", type=int, default=500)
    p.add_argument("--ngram", type=int, default=13)
    p.add_argument("--pairwise-rows", type=int, default=200, help="rows the pairwise version sees (extrapolated)")
    p.add_argument("--fuzzy", type=float, default=0.8, help="the fuzzy pass's threshold (0: leave the fuzzy runs out)")
    p.add_argument(
        "--fuzzy-pairwise-rows",
        type=int,
        default=1,
        help="rows the pairwise fuzzy version (every pair scored, as OpenThoughts-Agent does) sees",
    )
    p.add_argument("--out", type=out_dir, default=Path(tempfile.gettempdir()) / "otbuild-bench-decontaminate")
    p.add_argument("--child"), p.add_argument("--data-dir", type=Path), p.add_argument("--work", type=Path)
    args = p.parse_args()
    if args.child:
        child(args.child, args.data_dir, args.work, args.ngram, args.fuzzy or None, args.pairwise_rows)
        return 0
    data = args.out / "data"
    generate(data, args.rows, args.benchmark_tasks)
    planted = json.loads((data / "planted.json").read_text())
    runs = [("", None, args.pairwise_rows)] + (
        [(f"+fuzzy {args.fuzzy}", args.fuzzy, args.fuzzy_pairwise_rows)] if args.fuzzy else []
    )
    print(
        f"decontaminate: {args.rows:,} training rows x {args.benchmark_tasks} benchmark tasks, {args.ngram}-grams; "
        f"{os.cpu_count()} CPUs, OTBUILD_DUCKDB_MEMORY={os.environ.get('OTBUILD_DUCKDB_MEMORY', '1GB (default)')}"
    )
    print(f"{'implementation':<28}{'rows':>9}{'seconds':>12}{'rows/s':>11}{'peak RSS MB':>13}  speed vs python-index")
    agree, summary = True, []
    for label, fuzzy, cap in runs:
        tag = label.replace(" ", "-").replace("+", "fuzzy-") if label else "ngram"
        results = {impl: run_child(impl, data, args.out / tag / impl, args, fuzzy, cap) for impl in IMPLS}
        base = results["python-index"]
        for impl, r in results.items():
            full = r["s"] * args.rows / r["rows"]  # the pairwise version's time for every row, extrapolated
            note = f"{base['s'] / full:.2f}x" + (" (extrapolated)" if r["rows"] < args.rows else "")
            print(
                f"{impl + label:<28}{r['rows']:>9,}{full:>12.1f}{args.rows / full:>11,.0f}{r['rss_mb']:>13,.0f}  {note}"
            )
        duck, sample = results["duckdb"]["verdicts"], results["python-pairwise"]["verdicts"]
        seen = {f"train-{i}" for i in range(results["python-pairwise"]["rows"])}
        same = duck == base["verdicts"] and {k: v for k, v in duck.items() if k in seen} == sample
        agree &= same
        kinds = {
            k: (sum(1 for p in planted.values() if p == k), sum(1 for p, v in planted.items() if v == k and p in duck))
            for k in ("copy", "quote", "reworded")
        }
        summary.append(
            f"{(label or 'n-grams').strip('+')}: contaminated rows {len(duck):,} ({len(duck) / args.rows:.2%}); "
            f"planted found: {', '.join(f'{k} {f}/{n}' for k, (n, f) in kinds.items())}; "
            f"outputs: {'MATCH' if same else 'DIFFER'}"
        )
    print("\n".join(summary))
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
