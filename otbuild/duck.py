"""DuckDB in-process: a connection with bounded memory and SQL rendered from jinja2 templates."""

from __future__ import annotations

from collections import deque
from pathlib import Path

import duckdb
import jinja2
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from otbuild import jobs
from otbuild.fsio import atomic_path, parquet_batches

SQL_DIR = Path(__file__).parent / "sql"
_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(SQL_DIR), undefined=jinja2.StrictUndefined, keep_trailing_newline=True
)


def sql_literal(value) -> str:
    return "'" + str(value).replace("'", "''") + "'"


_env.filters["sql"] = sql_literal


def regex_error(pattern: str) -> str | None:
    """Why DuckDB's regexp functions (RE2 syntax: no lookaround, no backreferences) refuse
    `pattern`, or None: the check a filter's SQL will face, made before anything runs."""
    with duckdb.connect() as con:
        try:
            con.execute(f"SELECT regexp_matches('', {sql_literal(pattern)})")
        except duckdb.Error as e:
            return str(e).removeprefix("Invalid Input Error: ")
    return None


def connect(memory_limit: str | None = None) -> duckdb.DuckDBPyConnection:
    """Memory is capped and spills go to the job's scratch (otbuild.jobs: OTBUILD_DUCKDB_MEMORY
    or 3/4 of the job's mem_mb, default 1GB; OTBUILD_DUCKDB_TEMP, $SLURM_TMPDIR or $TMPDIR)."""
    con = duckdb.connect()
    con.execute(f"SET memory_limit = {sql_literal(memory_limit or jobs.duckdb_memory())}")
    con.execute(f"SET temp_directory = {sql_literal(jobs.spill_dir())}")
    return con


def render(template: str, **ctx) -> str:
    return _env.get_template(template).render(**ctx)


def run_template(con: duckdb.DuckDBPyConnection, template: str, **ctx) -> None:
    con.execute(render(template, **ctx))


def input_offsets(paths: list[Path]) -> list[int]:
    """Row offset of each input in their concatenation (for a stable order across files)."""
    sizes = [pq.ParquetFile(p).metadata.num_rows for p in paths]
    return [sum(sizes[:i]) for i in range(len(sizes))]


def copy_to_parquet(con: duckdb.DuckDBPyConnection, query: str, dest: Path) -> int:
    """Write a query's rows to `dest` (zstd parquet); returns the row count."""
    with atomic_path(dest) as tmp:
        con.execute(f"COPY ({query}) TO {sql_literal(tmp)} (FORMAT parquet, COMPRESSION zstd)")
        (rows,) = con.execute(f"SELECT count(*) FROM read_parquet({sql_literal(tmp)})").fetchall()[0]
        return rows


# Rows of the wide input per batch of stream_split (one parquet row group of each output; with
# the writes in flight, up to 3 batches are held).
SPLIT_ROWS = 256


def stream_split(
    con: duckdb.DuckDBPyConnection,
    decided: str,
    inputs: list[Path],
    outdir: Path,
    *,
    rejected_by: str,
    kept_columns: tuple[str, ...] = (),
    rejected_columns: tuple[str, ...] = (),
    batch_rows: int = SPLIT_ROWS,
) -> dict:
    """Write kept.parquet and rejected.parquet from the inputs, read once, `batch_rows` rows at
    a time, in input order (each output encoded on its own thread while the next batch is
    read: _OrderedWrites): the table `decided` (_ord, reason; one row per input row, _ord as
    union_inputs numbers them) says which rows go where; its `kept_columns` are appended to the
    kept rows, its `rejected_columns` to the rejected ones (held one batch at a time). Only
    the narrow columns are held whole. Rejected rows get `reason` and `rejected_by`. Returns
    the row counts and the rejections per reason (the text before the first ':')."""
    narrow = con.sql(f"SELECT reason{''.join(', ' + c for c in kept_columns)} FROM {decided} ORDER BY _ord")
    narrow = narrow.to_arrow_table()
    reasons = narrow.column(0)
    schemas = [pq.read_schema(p) for p in inputs]
    schema = pa.unify_schemas(schemas, promote_options="permissive") if schemas else pa.schema([])
    kept_schema = pa.schema([*schema, *(narrow.schema.field(c) for c in kept_columns)])
    rejected_schema = schema.append(pa.field("reason", pa.string())).append(pa.field("rejected_by", pa.string()))
    more = None
    if rejected_columns:  # streamed beside the inputs (the reader ends before `con` is asked again)
        more = con.sql(f"SELECT {', '.join(rejected_columns)} FROM {decided} ORDER BY _ord").to_arrow_reader(batch_rows)
        for f in more.schema:
            rejected_schema = rejected_schema.append(f)
    pending: pa.Table | None = None  # rejected_columns' rows read ahead of the inputs'
    at = 0
    with (
        atomic_path(outdir / "kept.parquet") as kept_tmp,
        atomic_path(outdir / "rejected.parquet") as rej_tmp,
        pq.ParquetWriter(kept_tmp, kept_schema, compression="zstd") as kept,
        pq.ParquetWriter(rej_tmp, rejected_schema, compression="zstd") as rejected,
        _OrderedWrites(kept.write_table, rejected.write_table) as write,
    ):
        for path in inputs:
            for batch in parquet_batches(path, batch_rows):
                table = _conform(pa.Table.from_batches([batch]), schema)
                why = reasons.slice(at, table.num_rows)
                extra = [narrow.column(c).slice(at, table.num_rows) for c in kept_columns]
                at += table.num_rows
                wide = pa.Table.from_arrays([*table.columns, *extra], schema=kept_schema) if extra else table
                out = table.append_column("reason", why).append_column(
                    "rejected_by", pa.repeat(pa.scalar(rejected_by), table.num_rows)
                )
                if more is not None:
                    pending = _take_rows(more, pending, table.num_rows)
                    for name, col in zip(pending.column_names, pending.columns, strict=True):
                        out = out.append_column(name, col.slice(0, table.num_rows))
                    pending = pending.slice(table.num_rows)
                write(wide.filter(pc.is_null(why)), out.filter(pc.is_valid(why)))
    if more is not None:
        more.close()  # `con` answers the next query
    if at != len(reasons):
        raise RuntimeError(f"{decided}: {len(reasons)} decisions for {at} input rows")
    by_reason = con.execute(
        f"SELECT split_part(reason, ':', 1) AS r, count(*) FROM {decided}"
        " WHERE reason IS NOT NULL GROUP BY r ORDER BY r"
    ).fetchall()
    n_rejected = sum(n for _, n in by_reason)
    return {"kept": at - n_rejected, "rejected": n_rejected, "rejected_by_reason": dict(by_reason)}


def _take_rows(reader, pending, n: int):
    """`pending` with batches of `reader` added until it holds at least `n` rows."""
    parts = [pending] if pending is not None else []
    have = pending.num_rows if pending is not None else 0
    while have < n:
        batch = reader.read_next_batch()
        parts.append(pa.Table.from_batches([batch]))
        have += batch.num_rows
    return pa.concat_tables(parts).combine_chunks() if len(parts) > 1 else parts[0]


class _OrderedWrites:
    """`write(a, b, ...)` hands each table to its own writer function, each on its own thread
    (pyarrow encodes and compresses without the GIL), in call order per writer, so reading the
    next batch and writing both outputs overlap; the files are byte for byte the ones written
    in line. At most `depth` calls are in flight (memory: that many batches), and a writer's
    error is raised by the next call or on leaving the `with`."""

    def __init__(self, *writers, depth: int = 2):
        from concurrent.futures import ThreadPoolExecutor

        self._writers, self._depth = writers, depth
        self._threads = [ThreadPoolExecutor(1) for _ in writers]
        self._pending: deque = deque()

    def __enter__(self):
        return self

    def __call__(self, *tables) -> None:
        self._pending.append([t.submit(w, x) for t, w, x in zip(self._threads, self._writers, tables, strict=True)])
        while len(self._pending) > self._depth:
            self._drain_one()

    def _drain_one(self) -> None:
        for f in self._pending.popleft():
            f.result()

    def __exit__(self, kind, *_) -> None:
        try:
            while self._pending and kind is None:
                self._drain_one()
        finally:
            for t in self._threads:
                t.shutdown(wait=True, cancel_futures=True)


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`table` with exactly `schema`'s columns (missing ones null), as UNION ALL BY NAME would."""
    cols = [
        table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(cols, schema=schema)
