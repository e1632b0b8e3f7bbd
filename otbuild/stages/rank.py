"""Rank: an ablation's candidates by the paper's cross-benchmark z-score (otbuild/sql/rank.sql)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
from pydantic import Field

from otbuild import duck
from otbuild.settings.base import Strict
from otbuild.settings.recipe import RankBy
from otbuild.stagekit import EVALUATION, Inputs, StageDef, stage_run
from otbuild.stagekit.metrics import METRICS


class RankSettings(Strict):
    """An ablation's candidates (in the order of its eval inputs) and the score they are ranked by."""

    candidates: list[str] = Field(min_length=1)
    metric: RankBy = "pass_at_1"


@stage_run
def run(cfg: RankSettings, inputs: Inputs, outdir: Path) -> dict:
    con = duck.connect()
    metric = cfg.metric
    column, error = METRICS[metric]
    errors = [error if error in pq.ParquetFile(p).schema_arrow.names else "NULL" for p in inputs]
    duck.run_template(
        con, "rank.sql", inputs=[str(p) for p in inputs], candidates=cfg.candidates, column=column, errors=errors
    )
    duck.copy_to_parquet(con, "SELECT * FROM rk_ranking", outdir / "ranking.parquet")
    duck.copy_to_parquet(con, "SELECT * FROM rk_z", outdir / "zscores.parquet")
    top = con.execute("SELECT candidate, mean_z FROM rk_ranking WHERE rank = 1").fetchall()
    incomplete = con.execute("SELECT candidate FROM rk_ranking WHERE NOT complete").fetchall()
    return {"best": [c for c, _ in top], "incomplete": [c for (c,) in incomplete], "metric": metric}


STAGE = StageDef(
    "rank",
    2,
    ("ranking.parquet", "zscores.parquet"),
    __name__,
    RankSettings,
    plan="candidates",
    over="grid",
    ranks=True,
    reported=(("ranking.parquet", EVALUATION),),
    estimate="table",
)
