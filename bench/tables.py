"""Benchmark otbuild's table stages (DuckDB `mix` + `task_filter`) against plain pandas.

    python bench/tables.py [--rows 1000000] [--out DIR]

Generates (once, cached under --out) 8 synthetic sources in TASK_SCHEMA totalling --rows rows,
then runs the real stages (`otbuild.stages.mix.run`, `otbuild.stages.task_filter.run`) and a
straightforward pandas implementation of the same two stages with the same semantics, each in
its own fresh subprocess. Reports wall time, rows/s and the peak RSS of each process
(os.wait4 rusage of that child alone), checks that both produced identical outputs (every
column of mix's tasks.parquet, task_filter's kept.parquet and rejected.parquet, in order) and
prints PASS/FAIL against the targets: DuckDB >= 5x pandas rows/s, DuckDB peak RSS < 2 GB, and
each DuckDB stage <= 1.5x its floor (a bare DuckDB `COPY (SELECT * FROM read_parquet(...)) TO`
of the same input, timed in the same child after the stages).

Exit status: 0 when the outputs match (whether or not targets are met), 1 when they differ,
2 when a child fails. Only stdlib is imported at module level so a child's RSS is its own.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GEN_VERSION = 1  # bump when the generator changes, so cached data is regenerated
N_SOURCES = 8
TOP_N = 4
# share of --rows per source, by rank (1 = best). Rank 3 is short of its quota -> upsampled.
SHARES = (0.30, 0.22, 0.03, 0.15, 0.12, 0.08, 0.06, 0.04)
CHUNK_ROWS = 50_000
ROW_GROUP_ROWS = 16_384
DUP_FRACTION = 0.10
EMPTY_FRACTION = 0.0005
EXCLUDE_REGEX = r"(?i)\b(?:sudo|password)\b"
TARGET_SPEEDUP = 5.0
TARGET_RSS_MB = 2048.0
TARGET_FLOOR_X = 1.5  # a table stage vs a bare COPY of its input

VOCAB = (  # noqa: SIM905 (a word list reads better as text)
    "the a an of to in for with on from into by and or not if then else when each every all "
    "file files directory directories path paths script scripts shell bash python program "
    "write read create delete rename move copy list print output input stdout stderr exit "
    "status code return value values line lines column columns row rows table csv json yaml "
    "config configuration server service port process processes signal log logs error errors "
    "warning test tests check verify ensure make sure must should can will using use run "
    "command commands argument arguments option options flag flags environment variable "
    "variables install package packages dependency dependencies version build compile binary "
    "archive tar gzip zip extract compress checksum hash sha256 md5 sort unique count sum "
    "average maximum minimum filter match pattern regex replace substring string strings "
    "number numbers integer float date time timestamp user users group permission permissions "
    "owner mode symlink link network request response http url download upload api endpoint "
    "database query sqlite record records field fields key keys index cache temporary "
    "solution task result results report summary format formatted named called located under "
    "inside existing new given following above below first last next previous exactly only "
    "naïve café résumé /app /tmp /var/log /etc/hosts data.csv output.txt main.py Makefile"
).split()
RARE = ("sudo", "password")  # what EXCLUDE_REGEX catches


# --------------------------------------------------------------------------------------------
# data generation (parent only)


def _corpus(rng):
    """A long ASCII-ish text of sentences, and the offsets where sentences start."""
    import numpy as np

    words = np.array(VOCAB + list(RARE), dtype=object)
    p = np.full(len(words), 1.0)
    p[-len(RARE) :] = 0.0004 * len(VOCAB)  # each rare word ~0.04% of words
    p /= p.sum()
    picks = words[rng.choice(len(words), size=1_200_000, p=p)]
    lens = rng.integers(5, 18, size=len(picks) // 5)
    sentences, i = [], 0
    for n in lens:
        if i + n > len(picks):
            break
        s = " ".join(picks[i : i + n])
        sentences.append(s[0].upper() + s[1:] + ".")
        i += n
    seps = rng.choice(np.array([" ", " ", " ", "\n", "\n\n"], dtype=object), size=len(sentences))
    parts, starts, pos = [], [], 0
    for s, sep in zip(sentences, seps):
        starts.append(pos)
        parts.append(s)
        parts.append(sep)
        pos += len(s) + len(sep)
    return "".join(parts), np.array(starts[: len(starts) * 9 // 10])


def _perturb(s: str, r) -> str:
    """Same text modulo case and whitespace (same dedup key after trim/collapse/lower)."""
    k = r.random()
    if k < 0.3:
        s = s.upper()
    elif k < 0.5:
        s = s.swapcase()
    if r.random() < 0.6:
        s = s.replace(" ", "  ", r.randint(1, 5))
    if r.random() < 0.4:
        s = s.replace(". ", ".\n\t", 2)
    if r.random() < 0.3:
        s = "  " + s + " "
    return s if s != "" else " "


def generate(data_dir: Path, rows: int, seed: int) -> dict:
    """Write the sources (cached: a complete manifest.json means the data is there)."""
    manifest_path = data_dir / "manifest.json"
    if manifest_path.exists():
        return json.loads(manifest_path.read_text())
    import random

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from otbuild.tasks.table import TASK_SCHEMA

    t0 = time.perf_counter()
    data_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    pyr = random.Random(seed)
    corpus, starts = _corpus(rng)
    sizes = [int(rows * s) for s in SHARES]
    sizes[0] += rows - sum(sizes)
    fams = np.array(["files", "text", "data", "archive", "python"], dtype=object)
    pool: list[str] = []  # instructions of earlier sources, for cross-source near-duplicates
    sources = []
    for rank, size in enumerate(sizes, start=1):
        name = f"src{rank}"
        path = data_dir / f"{name}.parquet"
        tmp = path.with_suffix(".tmp")
        with pq.ParquetWriter(tmp, TASK_SCHEMA) as writer:
            for lo in range(0, size, CHUNK_ROWS):
                n = min(CHUNK_ROWS, size - lo)
                # instruction lengths: log-uniform in [50, 2000]
                lengths = np.exp(rng.uniform(np.log(50), np.log(2000), n)).astype(np.int64)
                st = starts[rng.integers(0, len(starts), n)]
                instr = [corpus[a : a + b].rstrip(" ") for a, b in zip(st.tolist(), lengths.tolist())]
                dup_idx = np.flatnonzero(rng.random(n) < DUP_FRACTION).tolist()
                for j in dup_idx:
                    if pool and pyr.random() < 0.3:
                        instr[j] = _perturb(pyr.choice(pool), pyr)
                    else:
                        instr[j] = _perturb(instr[pyr.randrange(n)], pyr)
                for j in np.flatnonzero(rng.random(n) < EMPTY_FRACTION).tolist():
                    instr[j] = pyr.choice(["", "   "])
                pool.extend(pyr.sample(instr, min(200, n)))
                ids = rng.integers(0, 2**63, n, dtype=np.int64)
                task_id = [f"{x:016x}" for x in ids.tolist()]
                paths = [f"{name}-task-{i:07d}" for i in range(lo, lo + n)]
                blen = rng.integers(200, 501, n)
                offsets = np.zeros(n + 1, dtype=np.int32)
                np.cumsum(blen, out=offsets[1:])
                blob = pa.BinaryArray.from_buffers(
                    pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(rng.bytes(int(offsets[-1])))]
                )
                diff = rng.integers(1, 4, n).tolist()
                fam = fams[rng.integers(0, len(fams), n)].tolist()
                qual = rng.random(n).tolist()
                meta = [
                    f'{{"difficulty": {d}, "family": "{f}", "quality": {q:.4f}}}' for d, f, q in zip(diff, fam, qual)
                ]
                bools = rng.random((3, n))
                table = pa.Table.from_arrays(
                    [
                        pa.array(paths, pa.string()),
                        blob,
                        pa.array(task_id, pa.string()),
                        pa.array([name] * n, pa.string()),
                        pa.array(instr, pa.string()),
                        pa.array(bools[0] < 0.7),
                        pa.array(bools[1] < 0.9),
                        pa.array(bools[2] < 0.5),
                        pa.array(meta, pa.string()),
                    ],
                    schema=TASK_SCHEMA,
                )
                writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
        os.replace(tmp, path)
        sources.append({"name": name, "rank": rank, "path": str(path), "rows": size})
    manifest = {
        "rows": rows,
        "seed": seed,
        "gen_version": GEN_VERSION,
        "sources": sources,
        "generate_s": round(time.perf_counter() - t0, 2),
    }
    manifest_path.write_text(json.dumps(manifest, indent=2))
    return manifest


def pipeline_settings(manifest: dict):
    """The typed settings the stages take (each declared by its stage's module)."""
    from otbuild.settings.recipe import Sample
    from otbuild.stages.mix import MixSettings
    from otbuild.stages.task_filter import Bounds, TaskFilter

    rows = manifest["rows"]
    ranked = sorted(manifest["sources"], key=lambda s: s["rank"])[:TOP_N]
    total = rows // 2 + 3  # + 3: a remainder, so the best-ranked sources get one more
    mix = MixSettings(n=TOP_N, total=total, order="shuffle", seed=0, sources=[s["name"] for s in ranked])
    tf = TaskFilter(
        dedup=True,
        instruction_chars=Bounds(min=80, max=1800),
        exclude_regex=EXCLUDE_REGEX,
        sample=Sample(n=max(1, total * 2 // 5), seed=0),
    )
    return mix, [s["path"] for s in ranked], tf


# --------------------------------------------------------------------------------------------
# the pandas baseline: same semantics as otbuild/sql/mix.sql and otbuild/sql/task_filter.sql


def _md5(s: str) -> str:
    import hashlib

    return hashlib.md5(s.encode()).hexdigest()


def pandas_mix(settings: dict, inputs: list[Path], outdir: Path) -> None:
    import numpy as np
    import pandas as pd

    n, total, seed = len(inputs), settings["total"], str(settings["seed"])
    parts = []
    for i, path in enumerate(inputs):
        df = pd.read_parquet(path)
        c, q = len(df), total // n + (i < total % n)
        if q and not c:
            raise ValueError(f"mix: source {settings['sources'][i]!r} ({path}) has no tasks")
        if not q:
            continue
        # seeded order within the source: md5(seed:task_id:path), then file order
        df["_key"] = [_md5(f"{seed}:{t}:{p}") for t, p in zip(df["task_id"], df["path"])]
        df["_frn"] = np.arange(c)
        df = df.sort_values(["_key", "_frn"]).reset_index(drop=True).drop(columns=["_key", "_frn"])
        # copies 0..ceil(q/c)-1 of that order, positions copy*c + r < q
        for copy in range(-(-q // c)):
            part = df.iloc[: min(c, q - copy * c)].copy()
            part["_src"] = i
            part["mix_copy"] = np.int64(copy)
            part["_pos"] = copy * c + np.arange(len(part))
            parts.append(part)
    mixed = pd.concat(parts, ignore_index=True)
    if settings["order"] == "round_robin":
        mixed = mixed.sort_values(["_pos", "_src"])
    else:
        mixed["_key"] = [_md5(f"{seed}:{s}:{p}") for s, p in zip(mixed["_src"], mixed["_pos"])]
        mixed = mixed.sort_values("_key").drop(columns="_key")
    mixed["mix_rank"] = (mixed["_src"] + 1).astype("int32")
    mixed["mix_upsampled"] = mixed["mix_copy"] > 0
    mixed = mixed.drop(columns=["_src", "_pos"])
    outdir.mkdir(parents=True, exist_ok=True)
    mixed.to_parquet(outdir / "tasks.parquet", compression="zstd", index=False)


def pandas_task_filter(settings: dict, inputs: list[Path], outdir: Path) -> None:
    import numpy as np
    import pandas as pd

    if settings.get("score"):
        raise NotImplementedError("the pandas baseline does not implement score")
    df = pd.concat([pd.read_parquet(p) for p in inputs], ignore_index=True)  # row i has _ord i
    instr = df["instruction"]
    trimmed = instr.fillna("").str.strip(" ")  # DuckDB trim(): spaces only
    norm = trimmed.str.replace(r"\s+", " ", regex=True).str.lower()
    length = instr.str.len()
    reason = pd.Series(None, index=df.index, dtype=object)

    def reject(mask, why):
        mask = mask.fillna(False).astype(bool) & reason.isna()
        reason[mask] = why[mask] if isinstance(why, pd.Series) else why

    reject(trimmed == "", "empty_instruction")
    chars = settings.get("instruction_chars") or {}
    if chars.get("min") is not None:
        lo = chars["min"]
        reject(length < lo, "too_short: " + length.astype("Int64").astype(str) + f" < {lo} chars")
    if chars.get("max") is not None:
        hi = chars["max"]
        reject(length > hi, "too_long: " + length.astype("Int64").astype(str) + f" > {hi} chars")
    if settings.get("include_regex"):
        reject(~instr.str.contains(settings["include_regex"], regex=True).fillna(True), "include_regex: no match")
    if settings.get("exclude_regex"):
        reject(instr.str.contains(settings["exclude_regex"], regex=True), "exclude_regex: matched")
    if settings["dedup"]:
        ok = reason.isna()
        key, tid = norm[ok], df["task_id"][ok]
        first = tid.groupby(key.to_numpy(), sort=False).transform("first")
        dup = key.duplicated(keep="first")
        reason[dup[dup].index] = ("duplicate: same instruction as task " + first[dup]).astype(object)
    sample = settings.get("sample")
    if sample:
        ok = np.flatnonzero(reason.isna().to_numpy())
        seed = str(sample["seed"])
        keys = np.array([_md5(f"{seed}:{t}:{o}") for t, o in zip(df["task_id"].to_numpy()[ok], ok)])
        order = np.argsort(keys, kind="stable")
        reason.iloc[ok[order[sample["n"] :]]] = f"not_sampled: seeded subsample of {sample['n']}"
    outdir.mkdir(parents=True, exist_ok=True)
    kept = reason.isna()
    df[kept].to_parquet(outdir / "kept.parquet", compression="zstd", index=False)
    rejected = df[~kept].assign(reason=reason[~kept].astype(str), rejected_by="task_filter")
    rejected.to_parquet(outdir / "rejected.parquet", compression="zstd", index=False)


# --------------------------------------------------------------------------------------------
# children


def child(impl: str, data_dir: Path, work: Path) -> None:
    manifest = json.loads((data_dir / "manifest.json").read_text())
    from otbuild.stagekit import Inputs

    mix_settings, inputs, tf_settings = pipeline_settings(manifest)
    inputs = [Path(p) for p in inputs]
    if impl == "duckdb":
        from otbuild.stages import mix, task_filter

        run_mix, run_tf = mix.run, task_filter.run
    else:
        import numpy  # noqa: F401  (imported before the clock starts, like duckdb above)
        import pandas  # noqa: F401

        def run_mix(settings, inputs, outdir):
            pandas_mix(settings.model_dump(), inputs, outdir)

        def run_tf(settings, inputs, outdir):
            pandas_task_filter(settings.model_dump(), inputs, outdir)

    t0 = time.perf_counter()
    run_mix(mix_settings, inputs, work / "mix")
    t1 = time.perf_counter()
    run_tf(tf_settings, Inputs.of(tasks=[work / "mix" / "tasks.parquet"]), work / "task_filter")
    t2 = time.perf_counter()
    res = {"mix_s": t1 - t0, "filter_s": t2 - t1, "done_at": time.time()}  # the floors below are not the run
    if impl == "duckdb":  # each stage's floor: a bare DuckDB copy of that stage's input
        res |= {
            "mix_floor_s": copy_floor(inputs, work / "floor.parquet"),
            "filter_floor_s": copy_floor([work / "mix" / "tasks.parquet"], work / "floor.parquet"),
        }
    (work / "result.json").write_text(json.dumps(res))


def copy_floor(inputs: list[Path], dest: Path) -> float:
    """Seconds of `COPY (SELECT * FROM read_parquet(inputs)) TO dest` (zstd), on a connection
    like the stages' (same memory cap): what a stage that reads and writes its rows once costs."""
    from otbuild import duck

    con = duck.connect()
    t0 = time.perf_counter()
    con.execute(
        f"COPY (SELECT * FROM read_parquet([{', '.join(duck.sql_literal(p) for p in inputs)}])) "
        f"TO {duck.sql_literal(dest)} (FORMAT parquet, COMPRESSION zstd)"
    )
    seconds = time.perf_counter() - t0
    dest.unlink()
    return seconds


def run_child(impl: str, data_dir: Path, work: Path) -> dict:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        impl,
        "--data-dir",
        str(data_dir),
        "--work",
        str(work),
    ]
    t0 = time.time()
    proc = subprocess.Popen(cmd)
    _, status, usage = os.wait4(proc.pid, 0)  # rusage of this child alone
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{impl} child failed with exit status {proc.returncode}")
    res = json.loads((work / "result.json").read_text())
    # wall: the child's launch (interpreter, imports) to both stages done, not its floor copies
    return res | {"impl": impl, "wall_s": res["done_at"] - t0, "rss_mb": usage.ru_maxrss / 1024}


# --------------------------------------------------------------------------------------------
# comparison and report


def compare(a: Path, b: Path) -> str | None:
    """None when parquet files a (DuckDB) and b (pandas) hold the same columns, values and order."""
    import pyarrow.parquet as pq

    sa, sb = pq.read_schema(a), pq.read_schema(b)
    if sa.names != sb.names:
        return f"columns differ: {sa.names} vs {sb.names}"
    ra, rb = pq.read_metadata(a).num_rows, pq.read_metadata(b).num_rows
    if ra != rb:
        return f"row counts differ: {ra} vs {rb}"
    for name in sa.names:
        ca = pq.read_table(a, columns=[name]).column(name).combine_chunks()
        cb = pq.read_table(b, columns=[name]).column(name).combine_chunks()
        if ca.type != cb.type:
            cb = cb.cast(ca.type)
        if not ca.equals(cb):
            ne = next(i for i, (x, y) in enumerate(zip(ca.to_pylist(), cb.to_pylist())) if x != y)
            return f"column {name!r} differs first at row {ne}: {ca[ne]!r} vs {cb[ne]!r}"
    return None


def multiset_note(a: Path, b: Path) -> str:
    from collections import Counter

    import pyarrow.parquet as pq

    ta = pq.read_table(a, columns=["task_id"]).column("task_id").to_pylist()
    tb = pq.read_table(b, columns=["task_id"]).column("task_id").to_pylist()
    return "task_id multiset equal (order differs)" if Counter(ta) == Counter(tb) else "task_id multiset differs"


def report(manifest: dict, rows_in: int, results: list[dict], mismatches: dict, out: Path) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover
        Console = None
    by = {r["impl"]: r for r in results}
    d, p = by["duckdb"], by["pandas"]
    for r in results:
        r["rows_s"] = rows_in / r["wall_s"]
    speedup = d["rows_s"] / p["rows_s"]
    rss_ratio = d["rss_mb"] / p["rss_mb"]
    header = ["implementation", "rows in", "wall s (best)", "mix s", "filter s", "rows/s", "peak RSS MB"]
    body = [
        [
            r["impl"],
            f"{rows_in:,}",
            f"{r['wall_s']:.2f}",
            f"{r['mix_s']:.2f}",
            f"{r['filter_s']:.2f}",
            f"{r['rows_s']:,.0f}",
            f"{r['rss_mb']:,.0f}",
        ]
        for r in results
    ]
    body.append(
        [
            "duckdb vs pandas",
            "",
            "",
            f"{p['mix_s'] / d['mix_s']:.2f}x",
            f"{p['filter_s'] / d['filter_s']:.2f}x",
            f"{speedup:.2f}x faster",
            f"{rss_ratio:.2f}x RSS",
        ]
    )
    srcs = ", ".join("{}={:,}".format(s["name"], s["rows"]) for s in manifest["sources"])
    print(f"data: {manifest['rows']:,} rows in {len(manifest['sources'])} sources ({srcs}) under {out}")
    print(
        f"mix reads the top {TOP_N} by rank: {rows_in:,} rows; rows/s = rows in / wall (the child's launch "
        f"to both stages done: interpreter start and imports included, the floors not); machine: {os.cpu_count()} CPUs, "
        f"OTBUILD_DUCKDB_MEMORY={os.environ.get('OTBUILD_DUCKDB_MEMORY', '1GB (default)')}"
    )
    if Console:
        t = Table(title="otbuild table stages: mix + task_filter")
        for h in header:
            t.add_column(h, justify="left" if h == "implementation" else "right")
        for row in body:
            t.add_row(*row)
        Console(width=140).print(t)
    else:
        print("  ".join(header))
        for row in body:
            print("  ".join(row))
    for name, why in mismatches.items():
        print(f"outputs {name}: {'MATCH' if why is None else 'DIFFER - ' + why}")
    ok_speed, ok_rss = speedup >= TARGET_SPEEDUP, d["rss_mb"] < TARGET_RSS_MB
    print(f"{'PASS' if ok_speed else 'FAIL'}: DuckDB rows/s {speedup:.2f}x pandas (target >= {TARGET_SPEEDUP:g}x)")
    print(f"{'PASS' if ok_rss else 'FAIL'}: DuckDB peak RSS {d['rss_mb']:,.0f} MB (target < {TARGET_RSS_MB:,.0f} MB)")
    for stage, key in (("mix", "mix"), ("task_filter", "filter")):
        x = d[f"{key}_s"] / d[f"{key}_floor_s"]
        print(
            f"{'PASS' if x <= TARGET_FLOOR_X else 'FAIL'}: {stage} {d[f'{key}_s']:.2f}s = {x:.2f}x its floor, "
            f"a bare DuckDB COPY of its input ({d[f'{key}_floor_s']:.2f}s; target <= {TARGET_FLOOR_X:g}x)"
        )


def main(argv: list[str] | None = None) -> int:
    from outdir import out_dir  # bench/outdir.py: --out is made, or refused (exit 2)

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000, help="synthetic task rows over all sources")
    ap.add_argument(
        "--out",
        type=out_dir,
        default=Path(tempfile.gettempdir()) / "otbuild-bench",
        help="data cache and outputs (default: a temp dir)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--repeat", type=int, default=2, help="runs per implementation; the table shows the fastest, RSS the highest"
    )
    ap.add_argument("--only", choices=["duckdb", "pandas"], help="run one implementation, no comparison")
    ap.add_argument("--child", choices=["duckdb", "pandas"], help=argparse.SUPPRESS)
    ap.add_argument("--data-dir", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.data_dir, args.work)
        return 0
    if args.rows < 200:
        ap.error("--rows must be at least 200")

    data_dir = args.out / f"data-r{args.rows}-s{args.seed}-v{GEN_VERSION}"
    t0 = time.perf_counter()
    manifest = generate(data_dir, args.rows, args.seed)
    print(f"data ready in {time.perf_counter() - t0:.1f}s")
    _, inputs, _ = pipeline_settings(manifest)
    rows_in = sum(s["rows"] for s in manifest["sources"] if s["path"] in inputs)

    impls = [args.only] if args.only else ["duckdb", "pandas"]
    best: dict[str, dict] = {}
    for rep in range(args.repeat):
        for impl in impls:
            os.sync()  # flush dirty pages (fresh data, the last run's outputs) outside the clock
            r = run_child(impl, data_dir, args.out / f"run-{impl}")
            print(
                f"{impl} run {rep + 1}/{args.repeat}: {r['wall_s']:.2f}s wall "
                f"(mix {r['mix_s']:.2f}s, filter {r['filter_s']:.2f}s), peak RSS {r['rss_mb']:,.0f} MB"
            )
            prev = best.get(impl)
            rss = max(r["rss_mb"], prev["rss_mb"] if prev else 0.0)
            best[impl] = (r if prev is None or r["wall_s"] < prev["wall_s"] else prev) | {"rss_mb": rss}
    results = [best[i] for i in impls]
    if args.only:
        return 0

    dd, pd_ = args.out / "run-duckdb", args.out / "run-pandas"
    mismatches = {}
    for name, rel in (
        ("mix tasks.parquet", "mix/tasks.parquet"),
        ("task_filter kept.parquet", "task_filter/kept.parquet"),
        ("task_filter rejected.parquet", "task_filter/rejected.parquet"),
    ):
        why = compare(dd / rel, pd_ / rel)
        if why is not None and "task_id" in pq_names(dd / rel):
            why += f"; {multiset_note(dd / rel, pd_ / rel)}"
        mismatches[name] = why
    report(manifest, rows_in, results, mismatches, args.out)
    same = all(v is None for v in mismatches.values())
    print(f"outputs: {'MATCH' if same else 'DIFFER'} (duckdb vs pandas)")
    return 0 if same else 1


def pq_names(path: Path) -> list[str]:
    import pyarrow.parquet as pq

    return pq.read_schema(path).names


if __name__ == "__main__":
    sys.exit(main())
