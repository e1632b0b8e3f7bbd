"""Task filter (non-LLM kinds): dedup, length bounds, regexes, score top-k/weights, subsample.
Writes kept.parquet and rejected.parquet; every rejected row carries its reason."""

from __future__ import annotations

from pathlib import Path

from otbuild import duck
from otbuild.tasks.table import BATCH_ROWS


def score_expr(column: str) -> str:
    """`metadata.KEY` reads a number from the metadata JSON; anything else is a column.
    The recipe schema restricts `column` to identifiers, so this is safe to inline."""
    if column.startswith("metadata."):
        return f"json_extract(metadata, '$.{column.removeprefix('metadata.')}')"
    return f'"{column}"'


def run(settings: dict, inputs: list[Path], outdir: Path) -> dict:
    con = duck.connect()
    score = settings.get("score")
    duck.run_template(
        con, "task_filter.sql", inputs=[str(p) for p in inputs], offsets=duck.input_offsets(inputs), dedup=settings["dedup"],
        chars=settings.get("instruction_chars"), include_regex=settings.get("include_regex"),
        exclude_regex=settings.get("exclude_regex"), score=score, sample=settings.get("sample"),
        score_expr=score_expr(score["column"]) if score else None,
    )
    budget = (score or {}).get("budget")
    if budget:
        kept = con.execute("SELECT count(*) FROM tf_decided WHERE reason IS NULL").fetchall()[0][0]
        if budget < kept:
            raise ValueError(f"task_filter.score.budget: {budget} rollouts for {kept} kept tasks; "
                             "every task gets at least one, so the budget must be at least the task count")
    extra = ("score", "weight", "n_rollouts") if budget else ("score",) if score else ()
    return duck.stream_split(con, "tf_decided", inputs, outdir, rejected_by="task_filter", kept_columns=extra,
                             batch_rows=BATCH_ROWS)  # task rows are small: bigger batches, fewer row groups
