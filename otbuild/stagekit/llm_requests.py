"""Many independent LLM requests (augment, task_score) in shards that resume, as rollouts do.

A stage numbers its requests 0..M-1 in input order. Request r belongs to shard r mod N
(`shards`, an execution knob: not part of the id). Shard K of N appends each answer to
shards/K-of-N.partial.jsonl (flushed and fsynced); a killed job that runs again drops a torn
last line and skips every request answered in any shard's partial file or finished shard, so
no request is sent twice for an answer already kept, even after a restart with another N. When
all of its requests are answered the shard writes shards/K-of-N.parquet (atomically, one row
per request, sorted). The merge job streams the answers of every shard in request order (DuckDB sorts,
spilling to disk) beside the input rows.

The first request a job sends is sent alone: a 4xx answer to it (a model name the endpoint
does not know, a field the model refuses) fails the job at once with the API's message
instead of leaving every row with the same error. Later failures (after the engine's retries)
are answers with `error` set: the stage decides what they mean for its row. They do not count
as answered: a shard job run again (after a kill, or by hand after an outage) asks them again.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from otbuild import duck, usage
from otbuild.engines import EngineError, open_engine
from otbuild.engines.endpoint import refused
from otbuild.fsio import atomic_path, parquet_batches
from otbuild.hashing import file_sha256
from otbuild.progress import JobProgress
from otbuild.settings.engines import concurrency
from otbuild.stagekit import shard_path
from otbuild.stagekit.partials import append, drop_torn_tail, partial_files

# (request number, messages, body overrides such as a seed)
Request = tuple[int, list[dict], dict]
ANSWER_COLUMNS = {
    "request": "BIGINT",
    "text": "VARCHAR",
    "error": "VARCHAR",
    "n_output_tokens": "BIGINT",
    "usage_reported": "BOOLEAN",
    "n_input_tokens": "BIGINT",
}
ANSWER_SCHEMA = pa.schema(
    [
        ("request", pa.int64()),
        ("text", pa.string()),
        ("error", pa.string()),
        ("n_output_tokens", pa.int64()),
        ("usage_reported", pa.bool_()),
        ("n_input_tokens", pa.int64()),
    ]
)


class RefusedRequest(RuntimeError):
    """The endpoint refused the first request (a 4xx): every other would fail the same way."""


def run_shard(
    stage: str,
    cfg,
    requests: Callable[[Callable[[int], bool]], Iterable[Request]],
    total: int,
    outdir: Path,
    shard: int,
) -> None:
    """Answer shard K's requests (those not answered yet) and write its parquet. `requests(wanted)`
    yields the stage's requests whose numbers `wanted` accepts, in order, built as they go;
    `total`: how many the stage has (all shards), for the run's console (otbuild/progress.py)."""
    n = cfg.shards
    dest = shard_path(outdir, n, shard)
    partial = dest.with_suffix(".partial.jsonl")
    partial.parent.mkdir(parents=True, exist_ok=True)
    drop_torn_tail(partial)
    done = {
        r
        for (r,) in duck.connect()
        .execute(f"SELECT request FROM ({_answers_sql(outdir)}) WHERE error IS NULL")
        .fetchall()
    }
    todo = iter(requests(lambda r: r % n == shard and r not in done))
    print(f"{stage} shard {shard} of {n}: {len(done)} requests already answered (all shards)", flush=True)
    mine = len(range(shard, total, n))
    progress = JobProgress("requests", mine, sum(1 for r in done if r % n == shard))
    try:
        sent = asyncio.run(_answer(stage, cfg, todo, partial, progress))
    finally:
        progress.finish()
    print(f"{stage} shard {shard} of {n}: {sent} requests sent", flush=True)
    _write_shard(outdir, n, shard, dest)
    partial.unlink(missing_ok=True)


def one_per_task(
    inputs: list[Path], prompt: Callable[[str], str]
) -> Callable[[Callable[[int], bool]], Iterator[Request]]:
    """`requests(wanted)` for run_shard, for a stage that asks one question per task (task_score,
    skills): request r is task r in input order, `prompt(instruction)` its one user message."""

    def wanted_requests(wanted: Callable[[int], bool]) -> Iterator[Request]:
        number = 0
        for batch in input_batches(inputs, ["instruction"]):
            for instruction in batch.column(0).to_pylist():
                if wanted(number):
                    yield number, [{"role": "user", "content": prompt((instruction or "").strip())}], {}
                number += 1

    return wanted_requests


def input_rows(inputs: list[Path]) -> int:
    """Rows of the input tables, from their parquet footers."""
    return sum(pq.ParquetFile(p).metadata.num_rows for p in inputs)


async def _answer(stage: str, cfg, todo: Iterator[Request], partial: Path, progress: JobProgress) -> int:
    first = next(todo, None)
    if first is None:
        return 0
    engine = await open_engine(cfg)
    window = asyncio.Semaphore(2 * concurrency(cfg))  # requests built ahead, not all
    tally: Counter[bool] = Counter()  # answered (True) and failed (False) in this run
    try:
        with open(partial, "a") as out:  # noqa: ASYNC230 (appends are small and fsynced)

            async def one(request: Request) -> None:
                number, messages, overrides = request
                try:
                    c = await engine.complete(messages, **overrides)
                    rec = {
                        "request": number,
                        "text": c.text,
                        "error": None,
                        "n_output_tokens": c.n_output_tokens,
                        "usage_reported": c.usage_reported,
                        "n_input_tokens": c.n_input_tokens,
                    }
                except EngineError as e:
                    if request is first and refused(e):
                        raise RefusedRequest(
                            f"{stage}: the endpoint refused the first request, so it would refuse them all: {e}"
                        ) from None
                    rec = {
                        "request": number,
                        "text": None,
                        "error": f"[{type(e).__name__}] {e}",
                        "n_output_tokens": None,
                        "usage_reported": None,
                        "n_input_tokens": None,
                    }
                append(out, rec)
                tally[rec["error"] is None] += 1
                progress.update(progress.first + tally.total(), f"{tally[False]} failed" if tally[False] else "")

            await one(first)
            sent = 1
            async with asyncio.TaskGroup() as tg:
                for request in todo:
                    await window.acquire()
                    tg.create_task(one(request)).add_done_callback(lambda _: window.release())
                    sent += 1
            return sent
    finally:
        await engine.aclose()


def _write_shard(outdir: Path, n: int, shard: int, dest: Path) -> None:
    """The shard's answers, one per request, sorted, from the partial files (any shard's: a
    restart with another N keeps the answers it had)."""
    con = duck.connect()
    with atomic_path(dest) as tmp:
        con.execute(f"""COPY (SELECT {", ".join(ANSWER_COLUMNS)} FROM ({_answers_sql(outdir)})
                              WHERE request % {n} = {shard} ORDER BY request)
                        TO {duck.sql_literal(tmp)} (FORMAT parquet, COMPRESSION zstd)""")


def _answers_sql(outdir: Path) -> str:
    """Every answer kept so far, once per request: the partial files and the shard parquets of
    any layout (a restart with another `shards` keeps what a finished shard of the old one had)."""
    columns = ", ".join(ANSWER_COLUMNS)
    parts = []
    if partials := partial_files(outdir):
        types = "{" + ", ".join(f"'{c}': '{t}'" for c, t in ANSWER_COLUMNS.items()) + "}"
        parts.append(f"""SELECT {columns} FROM read_json({_list(partials)}, format='newline_delimited',
                         ignore_errors=true, columns={types}) WHERE request IS NOT NULL""")
    if finished := sorted((Path(outdir) / "shards").glob("*-of-*.parquet")):
        src = f"read_parquet({_list(finished)}, union_by_name = true)"
        have = {r[0] for r in duck.connect().execute(f"DESCRIBE SELECT * FROM {src}").fetchall()}
        # shards written before input tokens were kept have no such column: NULL there
        parts.append(
            "SELECT "
            + ", ".join(c if c in have else f"NULL::{t} AS {c}" for c, t in ANSWER_COLUMNS.items())
            + f" FROM {src}"
        )
    if not parts:
        return "SELECT " + ", ".join(f"NULL::{t} AS {c}" for c, t in ANSWER_COLUMNS.items()) + " WHERE false"
    return f"SELECT DISTINCT ON (request) * FROM ({' UNION ALL '.join(parts)}) ORDER BY request, error IS NOT NULL"


def answers(outdir: Path, shards: int, expected: int, batch_rows: int = 1024) -> Iterator[dict]:
    """Every shard's answers in request order (streamed); each request 0..expected-1 exactly once."""
    files = [shard_path(outdir, shards, k) for k in range(shards)]
    con = duck.connect()
    reader = con.sql(
        f"SELECT * FROM read_parquet({_list(files)}, union_by_name = true) ORDER BY request"
    ).to_arrow_reader(batch_rows)
    want = 0
    for batch in reader:
        for row in batch.to_pylist():
            if want >= expected:
                raise RuntimeError(f"shards of {outdir}: more answers than the {expected} requests")
            if row["request"] != want:
                raise RuntimeError(
                    f"shards of {outdir}: expected the answer to request {want}, found request "
                    f"{row['request']} (a shard lost or repeated answers)"
                )
            want += 1
            yield row
    if want != expected:
        raise RuntimeError(f"shards of {outdir}: {want} answers for {expected} requests")


def shard_records(outdir: Path, shards: int) -> list[dict]:
    """The shards a merge read (path, sha256), for its stats; what a run with another shard
    count left (partial files, shards) is removed: its answers are in these shards."""
    current = [shard_path(outdir, shards, k) for k in range(shards)]
    for stale in set((Path(outdir) / "shards").glob("*-of-*")) - set(current):
        stale.unlink()
    return [{"path": str(p), "sha256": file_sha256(p)} for p in current]


def llm_usage(cfg, outdir: Path) -> dict:
    """Requests, errors and tokens of the answers the merge read (otbuild/usage.py)."""
    files = [shard_path(outdir, cfg.shards, k) for k in range(cfg.shards)]
    return usage.of_answers(files, f"{cfg.engine}:{cfg.model}")


def input_batches(inputs: list[Path], columns: list[str] | None = None, rows: int = 1024) -> Iterator[pa.RecordBatch]:
    """The inputs' rows in order, in batches of bounded memory (`fsio.parquet_batches`)."""
    for path in inputs:
        yield from parquet_batches(path, rows, columns)


def write_answered(
    inputs: list[Path], outdir: Path, shards: int, fields: list[pa.Field], columns: Callable[[list[dict]], list[list]]
) -> int:
    """The merge of a stage that asks one question per task: the input rows, streamed, each with
    the columns `columns` makes of a batch's answers (one list per field of `fields`), into
    outdir/tasks.parquet (a column only some inputs have is null in the others'). Returns the
    row count; raises unless there is exactly one answer per row."""
    total = input_rows(inputs)
    answered = answers(outdir, shards, total)
    schema = pa.unify_schemas([pq.ParquetFile(p).schema_arrow for p in inputs]) if inputs else pa.schema([])
    out_schema = pa.schema([*schema, *fields])
    with atomic_path(outdir / "tasks.parquet") as tmp, pq.ParquetWriter(tmp, out_schema, compression="zstd") as w:
        for path in inputs:
            present = [c for c in schema.names if c in pq.ParquetFile(path).schema_arrow.names]
            for batch in input_batches([path], present):
                got = [next(answered) for _ in range(batch.num_rows)]
                arrays = [
                    batch.column(n) if n in present else pa.nulls(batch.num_rows, f.type)
                    for n, f in zip(schema.names, schema)
                ]
                arrays = [a.cast(f.type) for a, f in zip(arrays, schema)]
                made = [pa.array(values, f.type) for values, f in zip(columns(got), fields, strict=True)]
                w.write_table(pa.Table.from_arrays(arrays + made, schema=out_schema))
    next(answered, None)  # runs the answers' own check: exactly one per task
    return total


def _list(paths: list[Path]) -> str:
    return "[" + ", ".join(duck.sql_literal(p) for p in paths) + "]"
