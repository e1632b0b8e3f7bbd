"""Mix: Top-N sources, exact quotas, balanced upsampling of short sources, shuffle or round-robin."""

from __future__ import annotations

from pathlib import Path

from otbuild import duck
from otbuild.settings.stages import MixSettings
from otbuild.stagekit import Inputs, stage_run


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
