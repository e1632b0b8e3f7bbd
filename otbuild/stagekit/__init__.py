"""What the stages are built from: the contract of a stage's job (its `Inputs`, its `run` and
`run_shard`, where a shard writes), and the machinery several stages share (trials in shards,
LLM requests in shards, partial files, failure counts, training launches). A stage added by
a package builds on it as the built-in ones do; no stage imports another."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, TypeVar


class Inputs(list[Path]):
    """A job's inputs: the main outputs of the nodes it reads, in plan order (what a stage that
    reads one kind of table iterates), each under the name the plan gives it: the kind it is
    (tasks, traces, checkpoint), or its role where a stage reads one kind twice (the task
    filter's `held_out`)."""

    def __init__(self, paths=(), names: tuple[str, ...] | list[str] | None = None):
        super().__init__(Path(p) for p in paths)
        self.names = tuple(names) if names is not None else ("",) * len(self)
        if len(self.names) != len(self):
            raise ValueError(f"{len(self)} input paths, {len(self.names)} names")

    @classmethod
    def of(cls, **named: list[Path]) -> Inputs:
        """Inputs by name, in the order given (tests and callers outside a plan)."""
        return cls([p for ps in named.values() for p in ps], [n for n, ps in named.items() for _ in ps])

    def named(self, name: str) -> list[Path]:
        return [p for p, n in zip(self, self.names, strict=True) if n == name]


def shard_path(outdir: Path, shards: int, shard: int) -> Path:
    """Where shard K of N of a sharded stage writes its rows (the merge job reads them all)."""
    return Path(outdir) / "shards" / f"{shard}-of-{shards}.parquet"


Cfg_contra = TypeVar("Cfg_contra", contravariant=True)


class Run(Protocol[Cfg_contra]):
    """A stage's `run`: its typed settings, its inputs by name and its artifact dir -> the stats
    its provenance records (or None)."""

    def __call__(self, cfg: Cfg_contra, inputs: Inputs, outdir: Path, /) -> dict | None: ...


class RunShard(Protocol[Cfg_contra]):
    """A sharded stage's `run_shard`: shard K's rows into `shard_path(outdir, N, K)`."""

    def __call__(self, cfg: Cfg_contra, inputs: Inputs, outdir: Path, shard: int, /) -> None: ...


def stage_run(fn: Run[Cfg_contra]) -> Run[Cfg_contra]:
    """Marks a stage's `run`; the type checker verifies it is one (tests/settings/test_settings.py checks
    that every stage's is marked)."""
    fn.stage_entry = "run"  # type: ignore[attr-defined]  # a marker the registry test reads
    return fn


def stage_run_shard(fn: RunShard[Cfg_contra]) -> RunShard[Cfg_contra]:
    """Marks a sharded stage's `run_shard`, verified as `stage_run`'s."""
    fn.stage_entry = "run_shard"  # type: ignore[attr-defined]
    return fn
