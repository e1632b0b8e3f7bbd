"""The recipe's shared models: the keys that are no stage's section (`RecipeKeys`, with the
`harness`, `decision` and `prices` they hold) and the sections or parts that several stages or
parts use, each with who shares it: the task sources (`Source`: the `sources` section and the
eval's `benchmarks`, read by otbuild/sources/), the bases a source and a trace import share
(`FileSource`, `AtPath`, `HubDataset`), the trace importers' options (otbuild/traces/imports/ and
the trace_import stage), the teacher (the rollout's section and the eval's `model`), the task
scorer (the task_score stage's settings and the task_filter section's `llm`), `Sample` (the task
and trace filters'), `RankBy` (the eval's, the ranking's and the search's metric) and the prompt
style (every stage that runs or renders harness turns). A section only one stage uses is
declared in its module (otbuild/stages/); the `Recipe` model is assembled from both in
otbuild/recipe/schema.py.

Unknown keys are errors everywhere (`extra="forbid"`); the loader turns pydantic's errors into
messages that name the file, the key path, what was found and what was expected.

Content ids (otbuild/settings/identity.py): fields made with `execution_only(...)` are never part of
an id; every other field is, but only when it differs from its default. So a new field must
come with a default that keeps today's behaviour, and a knob that does not change outputs is
declared `execution_only`.

A field that several sections have is declared once, in a small base they share (`Ranked`,
`AtPath`, `HubDataset`; `Sharded` in base.py), with its default, bounds and description. Field
order follows the bases; ids do not depend on it (canonical JSON sorts keys).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from otbuild.settings.base import (
    MAX_REPEATS,
    MAX_TASKS,
    Sharded,
    Strict,
    execution_only,
    external,
    plan_only,
    re2,
)
from otbuild.settings.engines import LLM
from otbuild.settings.trials import ShardedTrials

NAME_RE = r"^[A-Za-z_][A-Za-z0-9_]*$"
HF_REPO_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$"
FAMILIES = ("files", "text", "data", "archive", "python")
Name = Annotated[str, Field(pattern=NAME_RE)]  # a key the recipe names (a source, a trace import, a benchmark)


RankBy = Literal["pass_at_1", "partial_credit"]  # an eval score a ranking compares (eval, rank, decide)


class Ranked(Strict):
    """A task source: `mix` takes the Top-N sources by rank."""

    rank: int | None = plan_only(None, ge=1, description="position in the Top-N ranking used by `mix` (1 = best)")


class AtPath(Strict):
    """Read from the files at `path` (a file or a folder)."""

    path: str = external(min_length=1, description="relative to the project root, or absolute")


class HubDataset(Strict):
    """A dataset repository on the Hugging Face Hub (or in its local cache): the revision is
    resolved to a commit when planned (docs/sources.md)."""

    repo: str = external(pattern=HF_REPO_RE, description="ORG/NAME of a dataset repository")
    revision: str = external("main", min_length=1, description="a branch, tag or commit")
    split: str | None = external(
        None,
        pattern=NAME_RE,
        description="the split's files as `datasets` finds them "
        "(the card's configs, then its name in file or dir names)",
    )
    files: list[str] | None = external(None, min_length=1, description="glob patterns of repo files")


class SyntheticSource(Ranked):
    """Procedurally generated terminal tasks (the embedded default source)."""

    kind: Literal["synthetic"]
    count: int = Field(ge=1, le=MAX_TASKS)
    seed: int = 0
    families: list[Literal[FAMILIES]] | None = None  # type: ignore[valid-type]
    difficulties: list[Literal[1, 2, 3]] | None = None


class FileSource(Strict):
    """What everything read from files has (task sources, trace imports): one that yields no
    usable item fails its stage (naming the path and why its items were quarantined) unless
    it may be empty."""

    allow_empty: bool = execution_only(False, description="0 usable items is not an error")


class SourceSample(Strict):
    """A seeded sample of a source's tasks; with `stratify`, split over the values of that
    metadata key (or task column) in proportion to their sizes (largest remainder; docs/sources.md)."""

    n: int = Field(ge=1, le=MAX_TASKS)
    seed: int = 0
    stratify: str | None = Field(
        default=None, pattern=NAME_RE, description="a task metadata key (e.g. repo), or the column path or source"
    )
    pattern: str | None = re2(description="the stratum is its first group's match in the value")

    @model_validator(mode="after")
    def _pattern_needs_key(self):
        if self.pattern is not None and self.stratify is None:
            raise ValueError("pattern picks a stratum out of the `stratify` value: set stratify with it")
        return self


class TaskFileSource(FileSource, Ranked):
    """Tasks read from files or a dataset hub, optionally sampled after they are read."""

    sample: SourceSample | None = None


class PathSource(TaskFileSource, AtPath):
    """Tasks read from files: Harbor task dirs, an HF task parquet, or Terminal-Bench 1 dirs."""

    kind: Literal["harbor-dir", "harbor-parquet", "tb1-dir"]


class SweInstancesSource(TaskFileSource, AtPath):
    """SWE-bench / SWE-smith instances (JSON or JSONL): otbuild/sources/swe_instances.py."""

    kind: Literal["swe-instances"]
    patch_introduces_bug: bool | Literal["auto"] = Field(
        default="auto",
        description="SWE-smith convention (oracle = reverse patch); auto: by repo/image/id naming",
    )
    image_namespace: str | None = Field(default=None, min_length=1, description="prefixed to an image_name without one")


class StackExchangeSource(TaskFileSource, AtPath):
    """Stack Exchange Posts.xml dumps or CSV/JSONL exports: otbuild/sources/stackexchange.py."""

    kind: Literal["stackexchange"]
    site: str | None = Field(default=None, min_length=1, description="default: the row's site, or the dump's folder")


class Nl2BashSource(TaskFileSource, AtPath):
    """Natural-language/command pairs (all.nl + all.cm, or JSONL nl/cmd): otbuild/sources/nl2bash.py."""

    kind: Literal["nl2bash"]
    verifier: bool = Field(default=True, description="add tests where the command is safe and deterministic")


class TableColumns(Strict):
    instruction: str = Field(min_length=1)
    id: str | None = None
    solution: str | None = None
    tests: str | None = None
    metadata: list[str] = Field(default=[])


class TableSource(TaskFileSource, AtPath):
    """Any JSON/JSONL/CSV/parquet table with a column mapping: otbuild/sources/table.py."""

    kind: Literal["table"]
    columns: TableColumns
    image: str = Field(default="python:3.12-slim", min_length=1)
    docker_image: str | None = Field(default=None, min_length=1)


class HfDatasetSource(TaskFileSource, HubDataset):
    """An HF task parquet dataset (columns path, task_binary) on the Hugging Face Hub or in
    its local cache: the revision is resolved to a commit when planned (docs/sources.md)."""

    kind: Literal["hf-dataset"]


class HarborDatasetSource(TaskFileSource):
    """A benchmark as Harbor's registry lays it out once downloaded (terminal-bench@2.0,
    swebench-verified@1.0): read offline from Harbor's task cache (docs/sources.md)."""

    kind: Literal["harbor-dataset"]
    dataset: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*(@[A-Za-z0-9._-]+)?$", description="NAME or NAME@VERSION"
    )
    registry: str = external(min_length=1, description="a local copy of Harbor's registry.json (or its folder)")
    path: str | None = external(
        None,
        min_length=1,
        description="where Harbor downloaded the tasks: its "
        "cache (default ~/.cache/harbor/tasks) or an export dir (harbor datasets download -o)",
    )


# a task source: an entry of the `sources` section or of the eval's `benchmarks`
Source = Annotated[
    SyntheticSource
    | PathSource
    | HfDatasetSource
    | HarborDatasetSource
    | SweInstancesSource
    | StackExchangeSource
    | Nl2BashSource
    | TableSource,
    Field(discriminator="kind"),
]


class Sample(Strict):
    """Exactly `n` of what is left, a seeded choice: the task filter's and the trace filter's `sample`."""

    n: int = Field(ge=1, le=MAX_TASKS)
    seed: int = 0


class AgentModel(LLM, ShardedTrials):
    """A model acting as the agent of trials in the terminus-2 harness (engine `oracle` replays
    solve.sh): the `teacher` section (its rollouts), and an eval's named `model` (the model under
    test)."""

    # pydantic narrows a field by redeclaring it: LLM's engine and model, with the oracle (which needs no model)
    engine: Literal["oracle", "openai", "vllm", "transformers"]  # type: ignore[assignment]
    model: str | None = Field(default=None, description="not needed for the oracle")  # type: ignore[assignment]
    samples_per_task: int = Field(default=1, ge=1, le=MAX_REPEATS)
    verify: bool = Field(
        default=True,
        description="run each task's verifier after the agent; false skips it "
        "(OpenThoughts-Agent's trace generation, `verifier.disable`): the reward is unknown "
        "(outcome `unverified`), so trace_filter.min_reward cannot apply",
    )

    @model_validator(mode="after")
    def _model_needed(self):
        if self.engine != "oracle" and not self.model:
            raise ValueError(f"engine {self.engine!r} needs `model`")
        return self


class TaskScorer(LLM, Sharded):
    """An LLM score per task, into the `llm_score` column: `askllm` (a 1-100 rating of the
    task's value for training) or `response_length` (a small model answers the task; the
    score is its answer's length in tokens: longer answers mark harder tasks). The task_filter
    section's `llm`, and the task_score stage's settings."""

    kind: Literal["askllm", "response_length"]


class SweTrajectoryOptions(Strict):
    """What the SWE trajectory importers read beside the trajectories (otbuild/traces/imports/)."""

    labels: str | None = external(
        None,
        description="JSON/JSONL of {instance_id, resolved}: the reward "
        "(mini-swe-agent: labels.jsonl beside the trajectories when there is one)",
    )
    tasks: str | None = external(None, description="a task parquet to look task ids up in")
    instances: str | None = external(None, description="SWE instances, for an empty task message")
    run_id: str | None = Field(default=None, description="default: the trajectories' folder name")
    model: str | None = Field(default=None, description="default: the model the trajectory names")


class MiniSweAgentOptions(SweTrajectoryOptions):
    agent: str = Field(default="mini-swe-agent", min_length=1)


class SweAgentOptions(SweTrajectoryOptions):
    agent: str = Field(default="swe-agent", min_length=1)


class MessagesOptions(Strict):
    """What the messages-jsonl importer reads beside the rows."""

    tasks: str | None = external(None, description="a task parquet to look task ids up in")
    run_id: str | None = Field(default=None, description="default: the row's run_id, else the file stem")
    model: str | None = Field(default=None, description="default: the row's model")
    model_provider: str | None = Field(default=None, description="default: the model's ORG/ prefix")
    agent: str = Field(default="unknown", min_length=1, description="for rows that name no agent")


class HarborTracesOptions(Strict):
    """What the harbor-traces importer reads beside the rows."""

    episodes: Literal["last", "all"] = Field(default="last", description="each trial's last episode, or every row")
    tasks: str | None = external(None, description="a task parquet to look task ids up in")
    run_id: str | None = Field(default=None, description="default: the row's")
    model: str | None = Field(default=None, description="default: the row's")
    agent: str | None = Field(default=None, description="default: the row's")


# Each importer's options by the kind (or hf-dataset `format`) that names it.
IMPORT_OPTIONS: dict[str, type[Strict]] = {
    "mini-swe-agent": MiniSweAgentOptions, "swe-agent": SweAgentOptions, "messages-jsonl": MessagesOptions,
    "harbor-traces": HarborTracesOptions,
}  # fmt: skip


# the harness's prompt styles (otbuild/harness/protocol.py); the first is the default
PROMPTS = ("terminus2", "compact")
# how the harness and the model talk: terminus-2's JSON answers, or native tool calls
PROTOCOLS = ("terminus2", "tools")


class PromptStyle(Strict):
    """The harness's prompt style: what every stage that renders or runs harness turns
    (rollouts, SFT, RL, eval) is given beside its own section."""

    prompt: Literal[PROMPTS] = Field(  # type: ignore[valid-type]
        default=PROMPTS[0],
        description="terminus2: otbuild's words for terminus-2's protocol; "
        "compact: a short system text and compact JSON, for tiny students",
    )
    protocol: Literal[PROTOCOLS] = Field(  # type: ignore[valid-type]
        default=PROTOCOLS[0],
        description="terminus2: the model answers in terminus-2's JSON; tools: native tool "
        "calls (a `bash` tool and a `task_complete` tool offered in the request's `tools`). "
        "One per recipe (or per ablation candidate): teacher, SFT, RL and eval alike",
    )


class Harness(PromptStyle):
    """How otbuild's harness talks to the model, the same for rollouts, SFT, RL and eval."""

    constrained_decoding: bool = Field(
        default=False,
        description="eval of a served checkpoint: every answer is decoded inside the JSON "
        "frame (the request's structured_outputs.regex; otbuild serve and vLLM honour it)",
    )


class Price(Strict):
    """What a model's tokens cost, per million: the report's cost estimate (docs/reports.md)."""

    input_per_mtok: float = Field(default=0.0, ge=0, description="price of 1M input (prompt) tokens")
    output_per_mtok: float = Field(default=0.0, ge=0, description="price of 1M output (completion) tokens")


SettingPath = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$")]
# setting path -> the values to try (a mapping merges into a section, as `extends` merges)
Grid = dict[SettingPath, Annotated[list[Any], Field(min_length=1)]]


class Decision(Strict):
    """How each stage of a search picks its winner (docs/search.md): the recipe's `decision`
    key, which the decide stage reads."""

    min_trials: int = Field(
        default=150,
        ge=0,
        description="scored eval trials the top two candidates each need "
        "(OpenThoughts-Agent's eval guide: 150); fewer: the stage is undecided",
    )
    margin_se: float = Field(
        default=2.0,
        ge=0,
        description="the leader's score must exceed the runner-up's by "
        "more than this many standard errors of their difference; else undecided",
    )
    strict: bool = Field(
        default=False,
        description="an undecided stage stops the search (else it keeps the "
        "default: the recipe's own value where the grid has it, else the grid's first)",
    )


class RecipeKeys(Strict):
    """The recipe's keys that are no stage's section; the `Recipe` model adds each built-in stage's
    key (`StageDef.recipe_field`) to them (otbuild/recipe/schema.py)."""

    description: str = ""
    harness: Harness = Harness()
    # setting path -> values, e.g. {"mix.n": [1, 2, 4]} (a mapping merges into a section, e.g.
    # {"teacher": [{model: A}, {model: B, engine_args: {...}}]}): the grid's candidates share every
    # common upstream artifact and are ranked by their eval scores (cross-benchmark z-score)
    ablate: Grid = Field(default_factory=dict)
    # a stage-wise search: grids searched in order, each stage's winner fixed for the next
    # (docs/search.md); each stage is built and ranked as `ablate` is
    search: list[Annotated[Grid, Field(min_length=1)]] = Field(default_factory=list)
    decision: Decision = Decision()
    # the grid's size is checked before any candidate is made (each is validated and planned)
    max_candidates: int = execution_only(1000, ge=1, le=MAX_TASKS, description="a guard on the grid's size")
    # MODEL (or ENGINE:MODEL) -> price per million tokens: only the report uses them (its id
    # follows them; no other artifact's does)
    prices: dict[Annotated[str, Field(min_length=1)], Price] = Field(default_factory=dict)
    # the sections of stages that installed packages add (otbuild.stages entry points), each
    # validated by its stage's settings model; the loader moves them here from the top level
    added: dict[str, Any] = Field(default_factory=dict)
