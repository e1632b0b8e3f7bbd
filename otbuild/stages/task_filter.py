"""Task filter (non-LLM kinds): dedup, length bounds, regexes, decontamination against benchmarks,
score top-k/weights, subsample.
Writes kept.parquet and rejected.parquet; every rejected row carries its reason."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from otbuild import duck
from otbuild.settings.base import MAX_TASKS, Strict, plan_only, re2
from otbuild.settings.recipe import NAME_RE, Sample, TaskScorer
from otbuild.span import ZERO, Span
from otbuild.stagekit import DefaultRate, Inputs, StageDef, stage_run
from otbuild.tasks.table import BATCH_ROWS

SCORE_COLUMN_RE = r"^(metadata\.)?[A-Za-z_][A-Za-z0-9_]*$"  # a task column, or metadata.KEY


class Bounds(Strict):
    min: int | None = Field(default=None, ge=0)
    max: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _ordered(self):
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) must not exceed max ({self.max})")
        return self


class Score(Strict):
    """Use a score: keep the `top_k` best, or spread a rollout `budget` by score (every task
    at least one rollout; see docs/task-filter.md for the exact formula)."""

    column: str = Field(pattern=SCORE_COLUMN_RE, description="a task column or metadata.KEY")
    top_k: int | None = Field(default=None, ge=1, le=MAX_TASKS)
    budget: int | None = Field(default=None, ge=1, le=MAX_TASKS, description="total rollouts: sets n_rollouts per task")
    keep_rate: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="the trace filter's measured keep rate: the "
        "budget counts kept traces and ceil(budget / keep_rate) rollouts are planned",
    )

    @model_validator(mode="after")
    def _one_mode(self):
        if (self.top_k is None) == (self.budget is None):
            raise ValueError("set exactly one of top_k (keep the k best) or budget (rollouts by score)")
        if self.keep_rate != 1.0 and self.budget is None:
            raise ValueError("keep_rate scales a rollout budget: set budget with it")
        return self


class Decontaminate(Strict):
    """Reject tasks whose instruction overlaps a benchmark's: the same normalised text, at
    least `min_shared` shared word n-grams, or (with `fuzzy`) a rapidfuzz ratio or partial
    ratio of at least `fuzzy` among the pairs the pre-filter keeps (docs/task-filter.md)."""

    against: list[Annotated[str, Field(pattern=NAME_RE)]] = Field(
        min_length=1, description="names in eval.benchmarks (or sources): their instructions are held out"
    )
    ngram: int = Field(default=13, ge=1, le=64, description="words per n-gram (13: GPT-3's decontamination)")
    min_shared: int = Field(default=1, ge=1, description="distinct n-grams shared with one benchmark task")
    fuzzy: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description=(
            "also reject a task whose rapidfuzz ratio or partial_ratio / 100 with a benchmark task is at least this "
            "(OpenThoughts-Agent: 0.8); only pairs the pre-filter keeps are scored"
        ),
    )
    fuzzy_ngram: int = Field(default=5, ge=1, le=64, description="pre-filter: words per n-gram a pair must share")
    fuzzy_min_shared: int = Field(
        default=2, ge=1, description="pre-filter: distinct fuzzy_ngram-grams a pair must share"
    )

    @model_validator(mode="after")
    def _fuzzy_knobs(self):
        if self.fuzzy is None and (self.fuzzy_ngram != 5 or self.fuzzy_min_shared != 2):
            raise ValueError("fuzzy_ngram and fuzzy_min_shared tune the fuzzy pass: set fuzzy with them")
        return self

    @field_validator("against")
    @classmethod
    def _unique(cls, v):
        if len(set(v)) < len(v):
            raise ValueError(f"names a benchmark twice: {v}")
        return v


class Draw(Strict):
    """A seeded draw of `total` tasks by the values of a column (a difficulty band, a skill):
    each value its share of the total (largest remainder), drawn in a seeded order within
    the value; a value with fewer tasks than its quota gives all it has and its shortfall is
    not spread over the others (the shares stay what the recipe says; the stats name the
    shortfall). A row whose value has no share, is NULL, or is over its quota is rejected
    with its reason (docs/task-filter.md)."""

    column: str = Field(pattern=SCORE_COLUMN_RE, description="a task column or metadata.KEY")
    shares: dict[str, Annotated[float, Field(gt=0, le=1)]] | Literal["equal"] = Field(
        description="value -> its share of `total` (they sum to 1), or `equal`: every value present an equal share"
    )
    total: int = Field(ge=1, le=MAX_TASKS, description="tasks to draw")
    seed: int = 0

    @field_validator("shares")
    @classmethod
    def _sum_to_one(cls, v):
        if isinstance(v, dict) and (not v or abs(sum(v.values()) - 1) > 1e-6):
            raise ValueError(f"the shares sum to {sum(v.values()):g}, not 1: {v}")
        return v


class TaskFilter(Strict):
    llm: TaskScorer | None = plan_only(None, description="scores every task first (a stage of its own: task_score)")
    decontaminate: Decontaminate | None = None  # n-gram overlap with eval benchmarks
    dedup: bool = True
    instruction_chars: Bounds | None = None
    include_regex: str | None = re2()
    exclude_regex: str | None = re2()
    score: Score | None = None
    draw: Draw | None = None
    sample: Sample | None = None


def score_expr(column: str, text: bool = False) -> str:
    """`metadata.KEY` reads a number (`text`: a string) from the metadata JSON; anything else is
    a column. The recipe schema restricts `column` to identifiers, so this is safe to inline."""
    if column.startswith("metadata."):
        read = "json_extract_string" if text else "json_extract"
        return f"{read}(metadata, '$.{column.removeprefix('metadata.')}')"
    return f'"{column}"'


def planned_rollouts(score) -> int | None:
    """The rollouts a budget plans: `budget` kept traces at the trace filter's measured keep rate."""
    if not score or not score.budget:
        return None
    return math.ceil(score.budget / score.keep_rate - 1e-9)


@stage_run
def run(cfg: TaskFilter, inputs: Inputs, outdir: Path) -> dict:
    """`inputs`: the task tables (`tasks`) and, with `decontaminate`, one per name in its
    `against` (`held_out`)."""
    con = duck.connect()
    tasks, refs = inputs.named("tasks"), inputs.named("held_out")
    if cfg.decontaminate:
        duck.run_template(
            con,
            "decontaminate.sql",
            inputs=[str(p) for p in tasks],
            offsets=duck.input_offsets(tasks),
            refs=[str(p) for p in refs],
            **cfg.decontaminate.model_dump(),
        )
        if cfg.decontaminate.fuzzy:
            add_fuzzy_hits(con, cfg.decontaminate.fuzzy)
    if cfg.draw:
        check_draw_column(cfg.draw.column, tasks)
    budget = planned_rollouts(cfg.score)
    t = cfg.model_dump()  # the template's view
    duck.run_template(
        con,
        "task_filter.sql",
        inputs=[str(p) for p in tasks],
        offsets=duck.input_offsets(tasks),
        dedup=cfg.dedup,
        decontaminate=t["decontaminate"],
        chars=t["instruction_chars"],
        include_regex=cfg.include_regex,
        exclude_regex=cfg.exclude_regex,
        score=t["score"],
        sample=t["sample"],
        score_expr=score_expr(cfg.score.column) if cfg.score else None,
        rollouts=budget,
        draw=draw_context(cfg.draw),
    )
    if budget:
        kept = con.execute("SELECT count(*) FROM task_decided WHERE reason IS NULL").fetchall()[0][0]
        if budget < kept:
            raise ValueError(
                f"task_filter.score.budget: {budget} rollouts for {kept} kept tasks; "
                "every task gets at least one, so the budget must be at least the task count"
            )
    extra = ("score", "weight", "n_rollouts") if budget else ("score",) if cfg.score else ()
    stats = duck.stream_split(
        con, "task_decided", tasks, outdir, rejected_by="task_filter", kept_columns=extra, batch_rows=BATCH_ROWS
    )  # task rows are small: bigger batches, fewer row groups
    check_not_emptied(stats)
    if cfg.decontaminate:
        stats["contaminated"] = contaminated_counts(con, cfg.decontaminate.against)
    if cfg.draw:
        stats["draw"] = draw_counts(con, cfg.draw)
    return {**stats, "rollouts_planned": budget} if budget else stats


def fuzzy_match(words: str, ref_words: str, threshold: float) -> tuple[str, float] | None:
    """OpenThoughts-Agent's fuzzy rule (data/commons.py): rapidfuzz `ratio` or `partial_ratio`
    over 100 at least `threshold`; here on both normalised texts. Returns (scorer, score)."""
    from rapidfuzz import fuzz

    cut = round(threshold * 100, 9)
    for name, scorer in (("ratio", fuzz.ratio), ("partial_ratio", fuzz.partial_ratio)):  # ratio is the cheap one
        if score := scorer(words, ref_words, score_cutoff=cut):
            return name, score / 100
    return None


def add_fuzzy_hits(con, threshold: float, batch_rows: int = 4096) -> None:
    """Score decontaminate.sql's candidate pairs (dc_fuzzy_pairs, in _ord order) and add one hit
    per row to dc_hits: the best score, then the benchmark's place, then the task path. Pairs
    stream in batches; only the hits are held."""
    import pyarrow as pa

    hits: dict[int, tuple] = {}
    reader = con.sql("SELECT _ord, benchmark, path, words, ref_words FROM dc_fuzzy_pairs").to_arrow_reader(batch_rows)
    for batch in reader:
        b = batch.to_pydict()
        rows = zip(b["_ord"], b["benchmark"], b["path"], b["words"], b["ref_words"], strict=True)
        for ord_, bench, path, words, ref_words in rows:
            if (m := fuzzy_match(words, ref_words, threshold)) and (ord_ not in hits or m[1] > hits[ord_][2]):
                hits[ord_] = (bench, m[0], m[1], path)
    found = pa.table(
        {
            "_ord": pa.array(list(hits), pa.int64()),
            "benchmark": [h[0] for h in hits.values()],
            "contamination": [
                f"contaminated by {bench}: fuzzy {name} {score:.2f} with task {path}"
                for bench, name, score, path in hits.values()
            ],
        }
    )
    con.register("dc_fuzzy_found", found)
    con.execute("INSERT INTO dc_hits SELECT _ord, benchmark, contamination FROM dc_fuzzy_found")
    con.unregister("dc_fuzzy_found")


def draw_context(draw: Draw | None) -> dict | None:
    """What task_filter.sql's draw step gets: the column's expression and the shares (None: equal)."""
    if not draw:
        return None
    shares = None if draw.shares == "equal" else list(draw.shares.items())
    return {
        "expr": score_expr(draw.column, text=True),
        "column": draw.column,
        "shares": shares,
        **draw.model_dump(include={"total", "seed"}),
    }


def check_draw_column(column: str, tasks: list[Path]) -> None:
    """A draw by a column the task tables lack fails naming it (a metadata key may be absent:
    its rows are NULL)."""
    import pyarrow.parquet as pq

    name = column.split(".", 1)[0] if column.startswith("metadata.") else column
    for path in tasks:
        if name not in (names := pq.read_schema(path).names):
            raise ValueError(
                f"task_filter.draw.column: the task table {path} has no column {name!r} (it has {', '.join(names)})"
                + ("; `band` is the difficulty stage's: add a `difficulty` section" if name == "band" else "")
            )


def draw_counts(con, draw: Draw) -> dict:
    """Per value: the tasks it had after the steps before the draw, its quota and what was
    drawn; `short`: the values that had fewer than their quota, by how many."""
    rows = con.execute(
        "SELECT value, share, available, quota, least(available, quota) FROM draw_quotas ORDER BY value"
    ).fetchall()
    per = {v: {"share": s, "available": a, "quota": q, "drawn": d} for v, s, a, q, d in rows}
    short = {v: c["quota"] - c["drawn"] for v, c in per.items() if c["drawn"] < c["quota"]}
    drawn = sum(c["drawn"] for c in per.values())
    if short:
        print(f"task_filter.draw: {drawn} of {draw.total} drawn; short of their quota: {short}", flush=True)
    return {"column": draw.column, "total": draw.total, "drawn": drawn, "values": per, "short": short}


# the decontamination rules, by how their reasons read after `contaminated by B: `
RULES = (("exact", "same instruction as task "), ("ngram", "% shared %-grams with task "), ("fuzzy", "fuzzy "))


def contaminated_counts(con, against: list[str]) -> dict[str, dict[str, int]]:
    """The rows the decontamination rejected, per benchmark (in `against` order) and rule."""
    rule = " ".join(f"WHEN rest LIKE '{like}%' THEN '{name}'" for name, like in RULES)
    rows = con.execute(f"""
        SELECT bench, CASE {rule} END AS rule, count(*) FROM (
            SELECT split_part(substr(reason, 17), ': ', 1) AS bench,
                   substr(reason, 17 + length(split_part(substr(reason, 17), ': ', 1)) + 2) AS rest
            FROM task_decided WHERE starts_with(reason, 'contaminated by '))
        GROUP BY ALL""").fetchall()
    out = {b: {name: 0 for name, _ in RULES} for b in against}
    for bench, name, n in rows:
        out[bench][name] = n
    return out


# The steps in the order they run, with the reasons (the text before ':', or how it starts) they
# reject with.
STEPS = (
    ("instruction present", ("empty_instruction",)),
    ("instruction_chars", ("too_short", "too_long")),
    ("include_regex", ("include_regex",)),
    ("exclude_regex", ("exclude_regex",)),
    ("decontaminate", ("contaminated by ",)),
    ("score", ("score",)),
    ("dedup", ("duplicate",)),
    ("score.top_k", ("below_top_k",)),
    ("draw", ("draw",)),
    ("sample", ("not_sampled",)),
)


def check_not_emptied(stats: dict) -> None:
    """Fail, naming the step, when the filter keeps nothing of a non-empty input (a scorer that
    scored nothing, a regex that matches nothing): no build goes on with 0 tasks."""
    total = stats["kept"] + stats["rejected"]
    if stats["kept"] or not total:
        return
    by_reason, left = stats["rejected_by_reason"], total
    for step, reasons in STEPS:
        dropped = {r: n for r, n in by_reason.items() if n and _rejects_with(reasons, r)}
        left -= sum(dropped.values())
        if not left:
            raise RuntimeError(
                f"task_filter: step {step} left 0 of the {total} tasks "
                f"({', '.join(f'{r}: {n}' for r, n in dropped.items())}; all rejections: {by_reason}); "
                "see rejected.parquet for each task's reason"
            )


def _rejects_with(reasons: tuple[str, ...], reason: str) -> bool:
    """A reason is a step's when it is one of its names, or starts with one ending in a space."""
    return any(reason == r or (r.endswith(" ") and reason.startswith(r)) for r in reasons)


def estimate(m, n, e) -> None:
    """Tasks in (the held-out benchmarks apart) x the keep rate, at most `top_k` and `sample.n`;
    the rollouts a score budget plans."""
    cfg = n.config
    held = len(cfg.decontaminate.against) if cfg.decontaminate else 0
    tasks_in = sum((m.rows.get(i.id, ZERO) for i in n.inputs[: len(n.inputs) - held]), ZERO)
    kept = (tasks_in * m.rate(e, n, "keep_rate")).ceil()
    if cfg.score and cfg.score.top_k:
        kept = kept.cap(cfg.score.top_k)
    if cfg.draw:
        kept = kept.cap(cfg.draw.total)
    if cfg.sample:
        kept = kept.cap(cfg.sample.n)
    m.table(n, e)
    m.rows[n.id] = kept
    e.counts.update(tasks_in=tasks_in, tasks_kept=kept)
    if (budget := planned_rollouts(cfg.score)) is not None:
        m.rollouts[n.id] = Span.of(budget)
        e.counts["rollouts_planned"] = Span.of(budget)


STAGE = StageDef(
    "task_filter",
    2,
    ("kept.parquet", "rejected.parquet"),
    __name__,
    TaskFilter,
    plan="decontaminating",
    keep_rate_reasons={"not_sampled": "kept", "below_top_k": "kept", "draw": "kept"},  # caps at the pilot's size
    held_out="decontaminate.against",
    consumes=("tasks",),
    produces="tasks",
    tasks=True,
    filter=True,
    counts={"tasks_kept": "rows"},
    recipe_field=(TaskFilter | None, None),
    estimate=estimate,
    rates={
        "keep_rate": DefaultRate(Span(1.0, 0.9, 1.0), "kept / in (before sample)", "dedup and bounds drop few tasks"),
    },
)
