"""Mix: Top-N sources, exact quotas, balanced upsampling of short sources, shuffle or round-robin."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from otbuild import duck
from otbuild.settings.base import MAX_TASKS, Strict
from otbuild.span import Span
from otbuild.stagekit import Inputs, StageDef, stage_run


class Mix(Strict):
    """The mix: the Top-N sources by rank, `total` tasks from them in exact quotas (paper: N = 4)."""

    n: int = Field(ge=1, description="Top-N sources by rank")
    total: int = Field(ge=1, le=MAX_TASKS, description="tasks in the mix; total/n from each source")
    order: Literal["shuffle", "round_robin"] = "shuffle"
    seed: int = 0


class MixSettings(Mix):
    """The mix section and the sources the plan took for it (its Top-N)."""

    sources: list[str] = Field(description="the Top-N sources, in input order")


class MixError(ValueError):
    pass


def quotas(total: int, n: int) -> list[int]:
    """Tasks from each of n sources in rank order: total // n each, the first total % n one more."""
    return [total // n + (i < total % n) for i in range(n)]


@stage_run
def run(cfg: MixSettings, inputs: Inputs, outdir: Path) -> None:
    con = duck.connect()
    quota = quotas(cfg.total, len(inputs))  # here, not in the SQL: a source without tasks has no row there
    duck.run_template(con, "mix.sql", inputs=[str(p) for p in inputs], quotas=quota, seed=cfg.seed, order=cfg.order)
    counts = dict(con.execute("SELECT _src, c FROM mix_quota").fetchall())
    for i, (name, path) in enumerate(zip(cfg.sources, inputs)):
        if quota[i] and not counts.get(i):
            raise MixError(f"mix: source {name!r} ({path}) has no tasks; cannot fill its quota of {quota[i]}")
    duck.copy_to_parquet(con, "SELECT * FROM mix_out", outdir / "tasks.parquet")


def estimate(m, n, e) -> None:
    """`total` tasks."""
    m.table(n, e)
    m.rows[n.id] = Span.of(n.config.total)
    e.counts["tasks"] = m.rows[n.id]


STAGE = StageDef(
    "mix",
    1,
    ("tasks.parquet",),
    __name__,
    MixSettings,
    plan="top_n",
    consumes=("tasks",),
    produces="tasks",
    tasks=True,
    counts={"tasks": "rows"},
    recipe_field=(Mix | None, None),
    estimate=estimate,
)
