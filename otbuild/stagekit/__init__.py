"""What the stages are built from: the contract of a stage's job (its `StageDef`, its `Inputs`,
its `run` and `run_shard`, where a shard writes), and the machinery several stages share (trials in shards,
LLM requests in shards, partial files, failure counts, a run's health, training launches). A stage added by
a package builds on it as the built-in ones do; no stage imports another."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pydantic import TypeAdapter

from otbuild.span import Span


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


@dataclass(frozen=True)
class DefaultRate:
    """A rate `plan --estimate` assumes for a stage's work where no pilot measured it: its value
    (estimate, low, high), its unit, and where the figure comes from (docs/estimate.md)."""

    value: Span
    unit: str
    source: str


@dataclass(frozen=True)
class StageDef:
    name: str
    version: int
    outputs: tuple[str, ...]  # files in the artifact dir; the first feeds downstream stages
    module: str  # defines `run` (a `Run`) and, sharded, `run_shard` (a `RunShard`)
    settings: Any  # the model of `cfg`: its recipe section's, or one that says what the plan adds
    sharded: bool = False  # run_shard(cfg, inputs, outdir, shard) per shard job, then run() merges
    gpu: bool = False  # may serve a model or train: a GPU job on a cluster (profiles/slurm)
    trials: bool = False  # runs agent trials in a sandbox; its settings are (or hold) the trial settings
    llm: bool = False  # asks an LLM: records `llm_usage` (requests, tokens) in its stats
    tasks: bool = False  # its main output is a task table: a step of the report's funnel
    traces: bool = False  # its main output is a trace table: a step of the report's funnel
    filter: bool = False  # keeps some of its input rows and records why it dropped the others
    # a filter's reasons that a pilot's keep rate does not count as drops: caps at a size the target
    # sets anew (`sample`, `top_k`), or drops that follow from an earlier stage (duplicates of a
    # teacher's samples) and leave the rate apart (reason -> "kept" or "apart")
    keep_rate_reasons: Mapping[str, str] = field(default_factory=dict)
    training: bool = False  # trains a checkpoint
    checkpoint: bool = False  # what it writes decides what the plan builds next (a Snakemake checkpoint)
    ranks: bool = False  # its main output ranks a grid's candidates (`rank`, `candidate`): the report's ranking
    local: bool = False  # cheap, reads what other jobs built: runs in Snakemake's own process, not as a job
    curve: tuple[str, ...] = ()  # training: the log keys the report plots, the first one logged
    # `audit --rebuild`: output file pattern -> its fields (parquet columns, `column.key` of a JSON
    # column, top-level JSON keys) that measure the run (docs/reproducibility.md)
    volatile: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # the estimate's counts a build's record holds, checked in the report: name -> "rows" (of the
    # main output) or a dotted path into the record's stats
    counts: Mapping[str, str] = field(default_factory=dict)
    # the pipeline's shape (otbuild/plan/shape.py): the recipe section that plans it (a dotted key
    # for a subsection; "" = the stage's name), the kinds of data it consumes (in the order its
    # inputs are given) and the kind its main output is
    section: str = ""
    # a built-in stage's top-level recipe key (the section above): its annotation and default, as
    # pydantic's create_model takes a field; the Recipe model (otbuild/recipe/schema.py) is made of
    # them. None: the stage has no key of its own (a subsection, planned from other keys, or added:
    # an added stage's section is validated by its `settings`)
    recipe_field: tuple[Any, Any] | None = None
    # the dotted key, within its section, of the names of the task sets it holds out (eval benchmarks or
    # sources: task_filter's `decontaminate.against`, near_dedup's `against`): the plan gives it their
    # tables after its own input (input name `held_out`), the recipe's checks that each is known
    held_out: str = ""
    plan: str = ""  # how the plan makes its nodes (otbuild/plan/, PLANNERS): "" = from its section alone
    # what the plan makes its nodes over: "" = its recipe section and the data the stages before it
    # left; "grid" = an ablation's or a search step's candidates (each one's last nodes), once per
    # grid; "plan" = every node of the plan, once, last
    over: str = ""
    consumes: tuple[str, ...] = ()
    produces: str | None = None
    # outputs flagged for `snakemake --report`, each with its category there (captions:
    # otbuild/report/captions/STAGE.FILE.rst); not part of any id
    reported: tuple[tuple[str, str], ...] = ()
    # how `plan --estimate` counts its work: the stage's own hook, `estimate(m, n, e)` (m: the
    # estimate's Model, otbuild/estimate/model.py, whose public helpers it calls; n: the plan node;
    # e: its StageEstimate), or the name of a generic one (`table`: rows in, rows out)
    estimate: str | Callable[[Any, Any, Any], None] = ""
    # the rates its estimate assumes where no pilot measured them (name -> DefaultRate), beside the
    # shared ones of its kind of work (trials, LLM requests, jobs: otbuild/estimate/rates.py)
    rates: Mapping[str, DefaultRate] = field(default_factory=dict)
    # a stage added outside otbuild (the `otbuild.stages` entry points): the stage it follows in
    # pipeline order
    after: str = ""

    @property
    def brings(self) -> str | None:
        """The kind of data it brings into the pipeline from outside (sources: tasks), if any."""
        return self.produces if self.produces and self.produces not in self.consumes and not self.consumes else None

    @cached_property
    def _adapter(self) -> TypeAdapter:
        return TypeAdapter(self.settings)

    def held_out_names(self, section: Any) -> list[str]:
        """The names in `section` at `held_out` (none where it is not set)."""
        value = section if self.held_out else None
        for part in self.held_out.split(".") if self.held_out else ():
            value = getattr(value, part, None)
        return list(value or [])

    def config(self, settings: dict) -> Any:
        """The typed settings from a spec's plain settings (a ValidationError names the field when a
        spec does not fit: a plan and its stage out of step)."""
        return self._adapter.validate_python(settings)


def section_key(d: StageDef) -> str:
    """The recipe key that plans stage `d` (dotted for a subsection, e.g. task_filter.llm)."""
    return d.section or d.name


def section_of(recipe: Any, key: str) -> Any:
    """The recipe's section at dotted `key` (an added stage's: under `added`); None when it is
    not set (or an empty mapping)."""
    if key in getattr(recipe, "added", {}):
        return recipe.added[key]
    value = recipe
    for part in key.split("."):
        value = getattr(value, part, None)
        if value is None:
            return None
    return value or None


# the categories of `snakemake --report` (docs/reports.md); the results' manifest is in RESULTS too
RESULTS, EVALUATION, TRAINING = "Results", "Evaluation", "Training"
