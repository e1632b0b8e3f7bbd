"""Benchmark the merge of the sharded LLM task stages (task_score) against a whole-table merge.

    python bench/llm_stages.py [--rows 50000] [--shards 8] [--binary-bytes 4096] [--out DIR]

Generates (seeded, under --out) a task parquet of --rows rows with --binary-bytes random
`task_binary` blobs and the answers of --shards shard jobs (shards/K-of-N.parquet, as the
shard jobs write them), then merges them into tasks.parquet, each way in its own fresh
subprocess:

- **stream**: the real merge, `otbuild.stages.task_score.run` (DuckDB sorts the answers,
  pyarrow streams the input in batches);
- **whole-table** (the baseline: task_score before shards): the whole input table and every
  answer as Python objects, then one table written.

Prints wall time, rows/s and peak RSS (each child's own wait4 rusage) with the ratios stream /
whole-table, and checks both wrote the same table. Exit 0 when they match, 1 when not.
"""

from __future__ import annotations

import argparse
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


def generate(out: Path, rows: int, shards: int, binary_bytes: int) -> Path:
    import random

    import pyarrow as pa
    import pyarrow.parquet as pq

    from otbuild.stagekit import shard_path
    from otbuild.stagekit.llm_requests import ANSWER_SCHEMA
    from otbuild.tasks.table import TASK_SCHEMA

    rng = random.Random(0)
    src = out / "in.parquet"
    with pq.ParquetWriter(src, TASK_SCHEMA) as w:
        for start in range(0, rows, 5000):
            n = min(5000, rows - start)
            w.write_table(
                pa.Table.from_pylist(
                    [
                        {
                            "path": f"t{i}",
                            "task_binary": rng.randbytes(binary_bytes),
                            "task_id": f"{i:012x}",
                            "source": "s",
                            "instruction": f"Task {i}: " + "do the thing " * rng.randint(5, 80),
                            "has_solution": True,
                            "has_tests": True,
                            "runnable_locally": True,
                            "metadata": "{}",
                        }
                        for i in range(start, start + n)
                    ],
                    TASK_SCHEMA,
                )
            )
    for k in range(shards):
        mine = range(k, rows, shards)
        dest = shard_path(out / "art", shards, k)
        dest.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(
            pa.Table.from_pydict(
                {
                    "request": list(mine),
                    "text": [f"Rating: {1 + i % 100}. " + "because " * 40 for i in mine],
                    "error": [None] * len(mine),
                    "n_output_tokens": [50] * len(mine),
                    "usage_reported": [True] * len(mine),
                    "n_input_tokens": [200] * len(mine),
                },
                ANSWER_SCHEMA,
            ),
            dest,
        )
    return src


def merge_stream(src: Path, art: Path, shards: int) -> None:
    from otbuild.settings.recipe import TaskScorer
    from otbuild.stages import task_score

    task_score.run(
        TaskScorer(kind="askllm", shards=shards, engine="openai", model="m", base_url="http://127.0.0.1:1/v1"),
        [src],
        art,
    )


def merge_whole(src: Path, art: Path, shards: int) -> None:
    """The baseline: what task_score did before shards, with the answers read from the shards."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from otbuild.stagekit import shard_path
    from otbuild.stages.task_score import score

    table = pq.read_table(src)
    answers = sorted(
        (a for k in range(shards) for a in pq.read_table(shard_path(art, shards, k)).to_pylist()),
        key=lambda a: a["request"],
    )
    rows = table.to_pylist()  # the whole table as Python objects, as before
    scores = [score("askllm", a) for a in answers]
    out = (
        pa.Table.from_pylist(rows, table.schema)
        .append_column("llm_score", pa.array(scores, pa.float64()))
        .append_column("llm_response", pa.array([a["text"][:2000] for a in answers], pa.string()))
    )
    pq.write_table(out, art / "tasks.parquet", compression="zstd")


def child(way: str, src: Path, art: Path, shards: int) -> tuple[float, float]:
    """(wall seconds, peak RSS MB) of one merge in a fresh process."""
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, __file__, "--child", way, str(src), str(art), str(shards)])
    _, status, usage = os.wait4(proc.pid, 0)
    if status:
        sys.exit(f"{way} merge failed ({status})")
    return time.monotonic() - start, usage.ru_maxrss / 1024


def main() -> int:
    from outdir import out_dir  # bench/outdir.py: --out is made, or refused (exit 2)

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--binary-bytes", type=int, default=4096)
    ap.add_argument("--out", type=out_dir, default=None)
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        way, src, art, shards = args.child
        (merge_stream if way == "stream" else merge_whole)(Path(src), Path(art), int(shards))
        return 0
    import pyarrow.parquet as pq

    out = args.out or Path(tempfile.mkdtemp(prefix="otbuild-bench-llm-"))
    out.mkdir(parents=True, exist_ok=True)
    try:
        src = generate(out, args.rows, args.shards, args.binary_bytes)
        results = {}
        for way in ("stream", "whole-table"):
            art = out / "art"
            (art / "tasks.parquet").unlink(missing_ok=True)
            results[way] = child(way, src, art, args.shards)
            shutil.copy(art / "tasks.parquet", out / f"{way}.parquet")
        same = pq.read_table(out / "stream.parquet").equals(pq.read_table(out / "whole-table.parquet"))
        mb = src.stat().st_size / 2**20
        print(f"task_score merge: {args.rows} rows ({mb:.0f} MB parquet), {args.shards} shards\n")
        print(f"{'way':<14}{'wall s':>9}{'rows/s':>11}{'peak RSS MB':>13}")
        for way, (wall, rss) in results.items():
            print(f"{way:<14}{wall:>9.2f}{args.rows / wall:>11.0f}{rss:>13.0f}")
        (ws, rs), (ww, rw) = results["stream"], results["whole-table"]
        print(f"{'ratio':<14}{ws / ww:>9.2f}{ww / ws:>11.2f}{rs / rw:>13.2f}   (stream / whole-table)")
        print("outputs identical" if same else "OUTPUTS DIFFER")
        return 0 if same else 1
    finally:
        if args.out is None:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
