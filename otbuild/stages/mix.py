"""Mix: Top-N sources, exact quotas, balanced upsampling of short sources, shuffle or round-robin."""

from __future__ import annotations

from pathlib import Path

from otbuild import duck


class MixError(ValueError):
    pass


def run(cfg, inputs: list[Path], outdir: Path) -> None:
    con = duck.connect()
    duck.run_template(con, "mix.sql", inputs=[str(p) for p in inputs], total=cfg.total, seed=cfg.seed, order=cfg.order)
    counts = dict(con.execute("SELECT _src, c FROM mix_quota").fetchall())
    n, total = len(inputs), cfg.total
    for i, (name, path) in enumerate(zip(cfg.sources, inputs)):
        quota = total // n + (i < total % n)
        if quota and not counts.get(i):
            raise MixError(f"mix: source {name!r} ({path}) has no tasks; cannot fill its quota of {quota}")
    duck.copy_to_parquet(con, "SELECT * FROM mix_out", outdir / "tasks.parquet")
