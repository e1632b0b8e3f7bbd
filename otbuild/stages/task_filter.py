"""Task filter (non-LLM kinds): dedup, length bounds, regexes, decontamination against benchmarks,
score top-k/weights, subsample.
Writes kept.parquet and rejected.parquet; every rejected row carries its reason."""

from __future__ import annotations

import math
from pathlib import Path

from otbuild import duck
from otbuild.settings.stages import TaskFilterSettings
from otbuild.stagekit import Inputs, stage_run
from otbuild.tasks.table import BATCH_ROWS


def score_expr(column: str) -> str:
    """`metadata.KEY` reads a number from the metadata JSON; anything else is a column.
    The recipe schema restricts `column` to identifiers, so this is safe to inline."""
    if column.startswith("metadata."):
        return f"json_extract(metadata, '$.{column.removeprefix('metadata.')}')"
    return f'"{column}"'


def planned_rollouts(score) -> int | None:
    """The rollouts a budget plans: `budget` kept traces at the trace filter's measured keep rate."""
    if not score or not score.budget:
        return None
    return math.ceil(score.budget / score.keep_rate - 1e-9)


@stage_run
def run(cfg: TaskFilterSettings, inputs: Inputs, outdir: Path) -> dict:
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
