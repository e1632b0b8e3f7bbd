"""Near-duplicate removal: MinHash LSH over normalised instructions (OpenThoughts-Agent's
mixing hypotheses: 128 permutations, 5-character shingles, Jaccard >= 0.8), within and across
the task tables it reads and against the eval benchmarks it names. Writes kept.parquet and
rejected.parquet; each dropped row names its kept twin and their similarity.

How, in bounded memory (the batch and DuckDB's memory limit, not the task count):
1. Instructions are normalised (lower case, each whitespace run one space, trimmed) and cut
   into character shingles; datasketch's MinHash gives each a signature, a batch at a time
   (`MinHash.bulk`). The LSH banding is datasketch's (`MinHashLSH(threshold, num_perm)`: `b`
   bands of `r` rows minimising false positives plus false negatives); each band's hash goes
   into a DuckDB table (which spills past its memory limit). The bands favour recall
   (`false_negative_weight`): a candidate is checked anyway.
2. DuckDB joins the bands on (band, hash): the candidate pairs (each row with the earliest
   `bucket_leaders` rows of each bucket it falls in).
3. Each candidate pair is checked exactly: the Jaccard similarity of the two shingle sets,
   streamed in batches; a pair at or above `threshold` is similar. LSH only proposes pairs, so
   its estimate never merges two tasks.
4. In key order (benchmark tasks first, then the tasks in input order: the plan's source rank
   and the mix's order), a task is dropped when an earlier similar task was kept, naming it
   (a benchmark task first: `near_benchmark`, else the most similar: `near_duplicate`); it is
   kept otherwise. So each kept task is no twin of an earlier kept one, each dropped task is
   at least `threshold` similar to the kept task it names, and a chain A~B~C with A and C apart
   keeps A and C. DuckDB decides this in rounds over the similar pairs.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Annotated

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Field, field_validator

from otbuild import duck
from otbuild.settings.base import Strict, execution_only
from otbuild.settings.recipe import NAME_RE
from otbuild.span import ZERO, Span
from otbuild.stagekit import DefaultRate, Inputs, StageDef, stage_run
from otbuild.tasks.table import BATCH_ROWS

# rows per batch of signatures (each: `num_perm` 64-bit values) and of candidate pairs checked
SIGNATURE_ROWS = 4096
PAIR_ROWS = 8192
EDGES = pa.schema([("a", pa.int64()), ("b", pa.int64()), ("sim", pa.float64())])


class NearDedup(Strict):
    """Drop near-duplicate tasks: MinHash LSH over normalised instructions (lower case, whitespace
    collapsed), candidates checked exactly; one task kept per group (the earliest in input order),
    each dropped one naming its kept twin and their Jaccard similarity (docs/task-filter.md)."""

    threshold: float = Field(
        default=0.8, gt=0, le=1, description="Jaccard similarity of the shingle sets at which two tasks are twins"
    )
    num_perm: int = Field(default=128, ge=8, le=1024, description="MinHash permutations (the LSH's bands x rows)")
    shingle: int = Field(default=5, ge=1, le=64, description="characters per shingle")
    seed: int = Field(default=1, ge=0, description="MinHash permutations' seed")
    false_negative_weight: float = Field(
        default=0.9,
        gt=0,
        lt=1,
        description="the LSH's weight of a missed twin against a false candidate (datasketch picks its bands "
        "and rows by it; 0.9: 14 x 9, 87% of pairs at 0.8 found, 97% at 0.85); candidates are checked exactly, so "
        "a false one costs only time (OpenThoughts-Agent: datasketch's 0.5, 9 x 13, 40% at 0.8)",
    )
    against: list[Annotated[str, Field(pattern=NAME_RE)]] = Field(
        default_factory=list,
        description="names in eval.benchmarks (or sources): a task that is a twin of one of their tasks is dropped",
    )
    bucket_leaders: int = Field(
        default=16,
        ge=1,
        le=10_000,
        description="each task is compared with at most this many earliest tasks of each LSH bucket it falls in "
        "(bounds the pairs a big group of twins makes)",
    )
    max_dropped_fraction: float = execution_only(
        0.5,
        ge=0,
        le=1,
        description="fail when more of the tasks are dropped (a pool of augmented surface forms may need more)",
    )

    @field_validator("against")
    @classmethod
    def _unique(cls, v):
        if len(set(v)) < len(v):
            raise ValueError(f"names a benchmark twice: {v}")
        return v


def normalise(text: str | None) -> str:
    """Lower case, each whitespace run one space, trimmed."""
    return " ".join((text or "").lower().split())


def shingles(text: str | None, k: int) -> set[str]:
    """The normalised text's `k`-character shingles; a shorter text is one shingle, an empty one none."""
    t = normalise(text)
    return {t[i : i + k] for i in range(len(t) - k + 1)} if len(t) >= k else {t} if t else set()


def jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 0.0


def bands(cfg: NearDedup) -> tuple[int, int]:
    """datasketch's LSH parameters for the threshold: (bands, rows per band)."""
    from datasketch import MinHashLSH

    w = cfg.false_negative_weight
    lsh = MinHashLSH(threshold=cfg.threshold, num_perm=cfg.num_perm, weights=(1 - w, w))
    return lsh.b, lsh.r


def _add_bands(con, cfg: NearDedup, keys: list[int], texts: list[str | None], b: int, r: int) -> None:
    """The band hashes of a batch's rows (those with a shingle) into nd_bands."""
    import numpy as np
    from datasketch import MinHash

    sets = [shingles(t, cfg.shingle) for t in texts]
    keep = [i for i, s in enumerate(sets) if s]
    if not keep:
        return
    # crc32: a fast, stable 32-bit hash of each shingle; datasketch's permutations make it min-wise
    sigs = MinHash.bulk(
        ([s.encode() for s in sets[i]] for i in keep), num_perm=cfg.num_perm, seed=cfg.seed, hashfunc=zlib.crc32
    )
    values = np.stack([m.hashvalues for m in sigs]).astype(np.uint32)[:, : b * r]  # (rows, b * r)
    n = len(keep)
    table = pa.table(
        {
            "_key": pa.array(np.repeat(np.asarray(keys, dtype=np.int64)[keep], b)),
            "band": pa.array(np.tile(np.arange(b, dtype=np.int16), n)),
            "v": pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), r),
        }
    )
    con.register("nd_batch", table)
    con.execute("INSERT INTO nd_bands SELECT _key, band, hash(v) FROM nd_batch")
    con.unregister("nd_batch")


def _signatures(con, cfg: NearDedup, b: int, r: int) -> None:
    """Every row of nd_text (tasks and benchmark tasks), a batch at a time, into nd_bands."""
    reader = con.sql("SELECT _key, instruction FROM nd_text").to_arrow_reader(SIGNATURE_ROWS)
    with con.cursor() as writer:  # a connection of its own, while `con` streams
        for batch in reader:
            cols = batch.to_pydict()
            _add_bands(writer, cfg, cols["_key"], cols["instruction"], b, r)


def _check_pairs(con, cfg: NearDedup) -> int:
    """The candidate pairs' exact similarity, streamed; those at or above the threshold into nd_edges.
    Returns the candidates checked."""
    reader = con.sql(duck.render("near_dedup.sql", step="pairs")).to_arrow_reader(PAIR_ROWS)
    checked, last_a, set_a = 0, None, set()
    writer = con.cursor()  # a connection of its own, while `con` streams
    for batch in reader:
        cols = batch.to_pydict()
        found: dict[str, list] = {"a": [], "b": [], "sim": []}
        for a, b, text_a, text_b in zip(cols["a"], cols["b"], cols["text_a"], cols["text_b"], strict=True):
            if a != last_a:
                last_a, set_a = a, shingles(text_a, cfg.shingle)
            sim = jaccard(set_a, shingles(text_b, cfg.shingle))
            if sim >= cfg.threshold:
                found["a"].append(a)
                found["b"].append(b)
                found["sim"].append(sim)
        checked += batch.num_rows
        writer.register("nd_found", pa.table(found, schema=EDGES))
        writer.execute("INSERT INTO nd_edges SELECT a, b, sim FROM nd_found")
        writer.unregister("nd_found")
    writer.close()
    return checked


def _decide(con) -> int:
    """Each row's fate (nd_fate), in rounds; returns the rounds taken."""
    duck.run_template(con, "near_dedup.sql", step="start")
    rounds = 0
    while True:
        (added,) = con.execute(duck.render("near_dedup.sql", step="round")).fetchone() or (0,)
        rounds += 1
        if not added:
            return rounds


@stage_run
def run(cfg: NearDedup, inputs: Inputs, outdir: Path) -> dict:
    """`inputs`: the task tables (`tasks`) and, with `against`, one per name in it (`held_out`)."""
    tasks, refs = inputs.named("tasks"), inputs.named("held_out")
    if len(refs) != len(cfg.against):
        raise ValueError(f"near_dedup: {len(refs)} held-out tables for against={cfg.against}")
    con = duck.connect()
    starts, total_refs = duck.input_offsets(refs), sum(pq.ParquetFile(p).metadata.num_rows for p in refs)
    duck.run_template(
        con,
        "near_dedup.sql",
        step="setup",
        inputs=[str(p) for p in tasks],
        offsets=duck.input_offsets(tasks),
        refs=[str(p) for p in refs],
        ref_offsets=[s - total_refs for s in starts],  # benchmark keys: -total_refs .. -1
        against=cfg.against,
    )
    b, r = bands(cfg)
    _signatures(con, cfg, b, r)
    duck.run_template(con, "near_dedup.sql", step="candidates", leaders=cfg.bucket_leaders)
    checked = _check_pairs(con, cfg)
    rounds = _decide(con)
    duck.run_template(con, "near_dedup.sql", step="decided")
    check_dropped(con, cfg)
    stats = duck.stream_split(con, "nd_decided", tasks, outdir, rejected_by="near_dedup", batch_rows=BATCH_ROWS)
    (similar,) = con.execute("SELECT count(*) FROM nd_edges").fetchone() or (0,)
    stats["lsh"] = {
        "bands": b,
        "rows_per_band": r,
        "candidate_pairs": checked,
        "similar_pairs": similar,
        "rounds": rounds,
    }
    if cfg.against:
        stats["near_benchmark"] = near_benchmark_counts(con, cfg.against)
    return stats


def near_benchmark_counts(con, against: list[str]) -> dict[str, int]:
    """The rows dropped as a benchmark task's twin, per benchmark (in `against` order)."""
    rows = dict(
        con.execute(
            "SELECT split_part(split_part(reason, ' with ', 2), ' task ', 1), count(*) FROM nd_decided "
            "WHERE starts_with(reason, 'near_benchmark:') GROUP BY ALL"
        ).fetchall()
    )
    return {name: rows.get(name, 0) for name in against}


def check_dropped(con, cfg: NearDedup) -> None:
    """Fail, before writing, when more than `max_dropped_fraction` of the tasks would be dropped,
    naming the counts and the kept tasks with the most twins."""
    (total, dropped), *_ = con.execute("SELECT count(*), count(reason) FROM nd_decided").fetchall()
    if not total or dropped <= cfg.max_dropped_fraction * total:
        return
    reasons = con.execute(
        "SELECT split_part(reason, ':', 1) AS r, count(*) FROM nd_decided "
        "WHERE reason IS NOT NULL GROUP BY r ORDER BY r"
    ).fetchall()
    top = con.execute(
        "SELECT any_value(split_part(reason, ' with ', 2)), count(*) AS n FROM nd_decided WHERE reason IS NOT NULL "
        "GROUP BY twin ORDER BY n DESC, twin LIMIT 3"
    ).fetchall()
    raise RuntimeError(
        f"near_dedup: {dropped} of the {total} tasks ({dropped / total:.1%}) are near-duplicates, more than "
        f"max_dropped_fraction {cfg.max_dropped_fraction} ({', '.join(f'{k}: {n}' for k, n in reasons)}; "
        f"most twins: {'; '.join(f'{who}: {n}' for who, n in top)}). Raise threshold if these are not "
        "duplicates, or max_dropped_fraction if the pool is meant to lose them (augmented surface forms)"
    )


def estimate(m, n, e) -> None:
    """Tasks in (the held-out benchmarks apart) x the keep rate (a pilot's, else assumed)."""
    held = len(n.config.against)
    tasks_in = sum((m.rows.get(i.id, ZERO) for i in n.inputs[: len(n.inputs) - held]), ZERO)
    m.table(n, e)
    m.kept_at_rate(n, e, tasks_in)


STAGE = StageDef(
    "near_dedup",
    1,
    ("kept.parquet", "rejected.parquet"),
    __name__,
    NearDedup,
    plan="decontaminating",  # its tasks, then the benchmarks in `against` (`held_out`)
    held_out="against",
    consumes=("tasks",),
    produces="tasks",
    tasks=True,
    filter=True,
    counts={"tasks_kept": "rows"},
    recipe_field=(NearDedup | None, None),
    estimate=estimate,
    rates={
        "keep_rate": DefaultRate(
            Span(0.95, 0.7, 1.0),
            "kept / in",
            "a mixed pool keeps most of its tasks; one of augmented surface forms loses more",
        )
    },
)
