"""DuckDB in-process: a connection with bounded memory and SQL rendered from jinja2 templates."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import duckdb
import jinja2
import pyarrow.parquet as pq

from otbuild.fsio import atomic_path

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
    """Memory is capped (OTBUILD_DUCKDB_MEMORY, default 1GB); beyond it DuckDB spills to disk."""
    con = duckdb.connect()
    con.execute(f"SET memory_limit = '{memory_limit or os.environ.get('OTBUILD_DUCKDB_MEMORY', '1GB')}'")
    con.execute(f"SET temp_directory = '{tempfile.gettempdir()}/otbuild-duckdb'")
    return con


def render(template: str, **ctx) -> str:
    return _env.get_template(template).render(**ctx)


def run_template(con: duckdb.DuckDBPyConnection, template: str, **ctx) -> None:
    con.execute(render(template, **ctx))


def input_offsets(paths: list[Path]) -> list[int]:
    """Row offset of each input in their concatenation (for a stable order across files)."""
    sizes = [pq.ParquetFile(p).metadata.num_rows for p in paths]
    return [sum(sizes[:i]) for i in range(len(sizes))]


def write_split(con: duckdb.DuckDBPyConnection, prefix: str, outdir: Path) -> dict:
    """Write the views PREFIX_kept and PREFIX_rejected to kept.parquet and rejected.parquet;
    return row counts and rejections per reason (the text before the first ':')."""
    kept = copy_to_parquet(con, f"SELECT * FROM {prefix}_kept", outdir / "kept.parquet")
    rejected = copy_to_parquet(con, f"SELECT * FROM {prefix}_rejected", outdir / "rejected.parquet")
    reasons = con.execute(
        f"SELECT split_part(reason, ':', 1) AS r, count(*) FROM read_parquet({sql_literal(outdir / 'rejected.parquet')})"
        " GROUP BY r ORDER BY r"
    ).fetchall()
    return {"kept": kept, "rejected": rejected, "rejected_by_reason": dict(reasons)}


def copy_to_parquet(con: duckdb.DuckDBPyConnection, query: str, dest: Path) -> int:
    """Write a query's rows to `dest` (zstd parquet); returns the row count."""
    with atomic_path(dest) as tmp:
        con.execute(f"COPY ({query}) TO {sql_literal(tmp)} (FORMAT parquet, COMPRESSION zstd)")
        return con.execute(f"SELECT count(*) FROM read_parquet({sql_literal(tmp)})").fetchone()[0]
