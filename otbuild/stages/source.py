"""Source: one task parquet per recipe source, plus the items it had to quarantine; with
`sample`, a seeded (optionally stratified) sample of what was read (otbuild/sql/source_sample.sql)."""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, cast

from pydantic import Field

from otbuild.errors import StageError
from otbuild.settings.recipe import Name, Source, SourceSample, TaskFileSource
from otbuild.settings.stages import named_union
from otbuild.sources import hub_files, read_source, where
from otbuild.span import Span
from otbuild.stagekit import DefaultRate, Inputs, StageDef, stage_run
from otbuild.tasks.table import (
    Quarantined,
    TaskRecord,
    check_not_empty,
    write_quarantine,
    write_tasks,
)

# a source's section, as the recipe names it (`sources.NAME`, `eval.benchmarks.NAME`), with its
# name and what the plan resolves: a Hub dataset's commit and files, a Harbor dataset's task dirs
if TYPE_CHECKING:  # made at run time (pydantic's create_model): Any to the type checker
    SourceSettings: TypeAlias = Any
else:
    SourceSettings = named_union(Source)


@stage_run
def run(cfg: SourceSettings, inputs: Inputs, outdir: Path) -> dict:
    name = cfg.name
    quarantined: list[Quarantined] = []

    def tasks() -> Iterator[TaskRecord]:
        for item in read_source(cfg):
            if isinstance(item, Quarantined):
                quarantined.append(item)
            else:
                yield item

    stats = {"hub": hub_files(cfg, (".parquet",)).identity()} if cfg.kind == "hf-dataset" else {}
    sample = cfg.sample if isinstance(cfg, TaskFileSource) else None  # generated sources set their count
    dest = outdir / "tasks.parquet"
    outdir.mkdir(parents=True, exist_ok=True)
    for stale in outdir.glob(".read-*"):  # what a killed run left
        shutil.rmtree(stale)
    with tempfile.TemporaryDirectory(dir=outdir, prefix=".read-") as tmp:
        read = Path(tmp) / "tasks.parquet" if sample else dest
        n = write_tasks(read, tasks(), source=name)
        if cfg.kind != "synthetic":
            check_not_empty(f"source {name!r}", where(cfg), n, quarantined, cfg.allow_empty)
        if sample:
            try:
                stats["sample"] = sample_tasks(read, dest, sample)
            except StageError as e:
                raise StageError(f"source {name!r}: {e}") from e
            n = stats["sample"]["kept"]
    return {
        "tasks": n,
        "quarantined": write_quarantine(outdir / "quarantine.parquet", quarantined, name),
        "quarantined_by_reason": dict(Counter(q.reason for q in quarantined)),
        **stats,
    }


STRATIFY_COLUMNS = ("path", "source")  # task columns `stratify` may name; any other name is a metadata key


def sample_tasks(src: Path, dest: Path, sample: SourceSample) -> dict:
    """Copy a seeded sample of `sample.n` tasks of `src` to `dest` (all of them when there are no
    more); returns the counts, per stratum: [tasks read, tasks kept]. Raises StageError when no
    task has a value to stratify by."""
    from otbuild import duck
    from otbuild.duck import sql_literal

    n, seed, stratify, pattern = sample.n, sample.seed, sample.stratify, sample.pattern
    con = duck.connect()
    duck.run_template(
        con,
        "source_sample.sql",
        tasks=str(src),
        n=n,
        seed=seed,
        stratify=stratify,
        pattern=pattern,
        columns=STRATIFY_COLUMNS,
    )
    all_blank = "SELECT count(*) > 0 AND bool_and(stratum = '') FROM sample_keys"  # an aggregate: one row
    if stratify and cast(tuple, con.execute(all_blank).fetchone())[0]:
        what = f"{stratify} matching {pattern!r}" if pattern else stratify
        raise StageError(
            f"sample.stratify: no task has a value for {what} "
            f"({'a column' if stratify in STRATIFY_COLUMNS else 'a metadata key'}); "
            "a sample stratified by nothing is not what was asked"
        )
    kept = duck.copy_to_parquet(
        con,
        f"SELECT * EXCLUDE (file_row_number) FROM read_parquet({sql_literal(src)}, file_row_number = true) "
        "WHERE file_row_number IN (SELECT _row FROM sample_rows) ORDER BY file_row_number",
        dest,
    )
    strata = {
        s: [size, quota]
        for s, size, quota in con.execute("SELECT stratum, size, quota FROM sample_strata ORDER BY stratum").fetchall()
    }
    return {
        "read": sum(v[0] for v in strata.values()),
        "kept": kept,
        "seed": seed,
        **({"stratify": stratify, "strata": strata} if stratify else {}),
    }


def estimate(m, n, e) -> None:
    """The tasks its settings or its data say (a synthetic count, a parquet's rows, Harbor task
    dirs: at most `sample.n`), else the default of a source's (or a benchmark's) tasks."""
    e.counts["tasks"] = m.brought(n, e, ("benchmark" if "benchmarks/" in n.label else "source", "tasks"))


STAGE = StageDef(
    "source",
    2,
    ("tasks.parquet", "quarantine.parquet"),
    __name__,
    SourceSettings,
    section="sources",
    plan="named",
    produces="tasks",
    tasks=True,
    counts={"tasks": "rows"},
    recipe_field=(dict[Name, Source], Field(default_factory=dict)),
    estimate=estimate,
    rates={"tasks": DefaultRate(Span(1_000, 500, 2_000), "tasks", "the data is not there to count")},
)
