"""Recipe -> DAG of content-addressed stage nodes.

A node carries the typed settings its stage receives (`StageDef.settings`). Its id hashes its
stage, the stage's implementation version, the identity of those settings and the ids of its
inputs, so an edit changes exactly the edited stage and what lies downstream, and recipes
sharing a prefix share artifacts. Artifacts live at artifacts/<stage>/<id>/. Identity follows
one rule (otbuild/settings/identity.py): execution-only fields are left out, the others count
only when they differ from their default, and data outside the project counts by what the plan
found there (otbuild/plan/external.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, cast

from pydantic import BaseModel

from otbuild.artifact import PROVENANCE
from otbuild.errors import ConfigError, StageError
from otbuild.hashing import settings_hash
from otbuild.plan.external import find
from otbuild.plan.shape import gaps, planned, section_key
from otbuild.recipe.load import LoadedRecipe
from otbuild.settings.base import PLAN_ONLY, fields_with
from otbuild.settings.identity import identity
from otbuild.settings.recipe import PromptStyle
from otbuild.settings.stages import ReportSettings
from otbuild.settings.trials import ShardedTrials
from otbuild.stagekit import shard_path
from otbuild.stages import STAGES, StageDef, input_name

ARTIFACTS = Path("artifacts")
RESULTS = Path("results")
BASE = "base/"  # `eval.base`: the labels of the untrained base's checkpoint and eval (base/sft, base/eval)


@dataclass(frozen=True)
class Missing:
    """Data a recipe names that is not there (yet): a file path, or a dataset not downloaded."""

    file: Path  # the recipe file that set the key (itself or one it extends)
    key: str  # the recipe key, e.g. sources.mine.path
    what: str  # the path, or what of the dataset is not there
    needed: bool = True  # False: the job may still fetch it (a dataset on the Hub)

    def __str__(self) -> str:
        what = f"{self.what} does not exist" if Path(self.what).is_absolute() else f"not there yet: {self.what}"
        return f"{self.file}: {self.key}: {what}"


@dataclass(frozen=True)
class Node:
    stage: str
    label: str  # the node's name within its recipe, e.g. "sources/synth", "mix"
    config: Any  # the stage's typed settings (StageDef.settings), what its job receives
    inputs: tuple[Node, ...] = ()
    missing: tuple[Missing, ...] = ()  # external data the recipe names that is not there (yet)
    found: dict = field(default_factory=dict)  # what the plan found for the external fields
    roles: tuple[str, ...] = ()  # each input's name for its stage where not its kind (`Inputs`)

    @property
    def input_names(self) -> tuple[str, ...]:
        return self.roles or tuple(input_name(n.stage) for n in self.inputs)

    @cached_property
    def identity(self) -> dict:
        """What is hashed: the settings' identity, data outside the project by what was found."""
        return identity(self.config, self.found)

    @cached_property
    def settings(self) -> dict:
        """The settings as the spec carries them (the runner validates them back into `config`)."""
        return self.config.model_dump(mode="json")

    @cached_property
    def id(self) -> str:
        d = STAGES[self.stage]
        return settings_hash(
            {
                "stage": self.stage,
                "version": d.version,
                "settings": self.identity,
                "inputs": [n.id for n in self.inputs],
            }
        )

    @property
    def dir(self) -> Path:
        return ARTIFACTS / self.stage / self.id

    @property
    def outputs(self) -> list[Path]:
        return [self.dir / o for o in STAGES[self.stage].outputs]

    @property
    def provenance(self) -> Path:
        return self.dir / PROVENANCE

    @property
    def main_output(self) -> Path:
        return self.outputs[0]

    def shard_outputs(self, shards: int | None = None) -> list[Path]:
        """Sharded stages run as one job per shard, then a merge job. `shards` (an execution
        knob) defaults to the recipe's; a built artifact keeps the layout it was built with."""
        if shards is None:
            shards = self.config.shards if STAGES[self.stage].sharded else 0
        return [shard_path(self.dir, shards, k) for k in range(shards)]

    def spec(self) -> dict:
        """Everything `otbuild stage STAGE --spec JSON` needs, as plain JSON."""
        return {
            "stage": self.stage,
            "id": self.id,
            "settings": self.settings,
            "inputs": [
                {"id": n.id, "stage": n.stage, "path": str(n.main_output), "name": name}
                for n, name in zip(self.inputs, self.input_names, strict=True)
            ],
            "outdir": str(self.dir),
        }


@dataclass
class Plan:
    recipe: LoadedRecipe
    nodes: list[Node] = field(default_factory=list)  # topological order
    search: list[SearchStep] = field(default_factory=list)  # a search's stages planned so far

    @property
    def pending(self) -> SearchStep | None:
        """A search's stage whose decision is not built yet: what the plan waits for."""
        return next((s for s in self.search if s.decision is None), None)

    @property
    def missing(self) -> list[Missing]:
        """What the recipe names that is not there, once per node label (a node an ablation's
        candidates share is listed under each of their labels)."""
        return [m for n in self.nodes for m in n.missing]

    @property
    def final(self) -> list[Node]:
        """Nodes nothing else in the plan consumes: what the recipe target asks for."""
        used = {i.id for n in self.nodes for i in n.inputs}
        return [n for n in self.nodes if n.id not in used]


def plan_recipe(loaded: LoadedRecipe, assume_defaults: bool = False) -> Plan:
    """The recipe's DAG; an ablation grid's candidates share nodes by id and feed a ranking; a
    search's stages are planned as far as their decisions are built (`assume_defaults`: every
    stage, an undecided one as if its default won: what `plan --estimate` estimates)."""
    if loaded.recipe.search:
        return _plan_search(loaded, assume_defaults)
    if not loaded.recipe.ablate:
        return _with_report(loaded, topological(_finals(loaded)))
    from otbuild.recipe.ablate import candidates

    finals, rank = _ranked(loaded, candidates(loaded), "candidates/", "ranking")
    return _with_report(loaded, topological([*finals, rank]))


def _ranked(
    loaded: LoadedRecipe, cands: list[tuple[str, LoadedRecipe]], prefix: str, label: str
) -> tuple[list[Node], Node]:
    """Each candidate's nodes (labels under PREFIX/NAME/) and the ranking of their evals."""
    evals, finals = [], []
    for name, cand in cands:
        nodes = _finals(cand, prefix=f"{prefix}{name}/")
        evals.append(nodes[-1])  # a recipe with an eval ends in it
        finals += nodes
    metric = {"metric": loaded.recipe.eval.rank_by} if loaded.recipe.eval else {}
    return finals, _node("rank", label, {"candidates": [name for name, _ in cands], **metric}, evals)


@dataclass(frozen=True)
class SearchStep:
    """One stage of a search as planned: its candidates, ranking and decision node, and the
    decision once that is built (None: pending; the stages after it are not planned yet)."""

    step: int
    grid: dict
    candidates: list[str]
    default: str
    decide: Node
    decision: dict | None


def _plan_search(loaded: LoadedRecipe, assume_defaults: bool = False) -> Plan:
    """Each stage's candidates, with the winning values of the stages before it set, built and
    ranked as an ablation is, then decided (stages/decide.py); planned up to the first stage
    whose decision is not built yet: its checkpoint replans the rest (otbuild/workflow.py)."""
    from otbuild.recipe.ablate import search_stage
    from otbuild.stages.decide import read_decision

    finals: list[Node] = []
    steps: list[SearchStep] = []
    fixed: dict = {}
    rules = loaded.recipe.decision.model_dump()
    for step in range(1, len(loaded.recipe.search) + 1):
        cands, default = search_stage(loaded, step, fixed)
        nodes, rank = _ranked(loaded, [(n, c) for n, _, c in cands], f"search/{step}/", f"search/{step}/ranking")
        config = {
            **rules,
            "step": step,
            "default": default,
            "metric": rank.config.metric,
            "candidates": [{"name": n, "values": v} for n, v, _ in cands],
        }
        decide = _node("decide", f"search/{step}/decision", config, [rank, *rank.inputs])
        finals += [*nodes, decide]
        decision = read_decision(loaded.root / decide.dir)
        steps.append(
            SearchStep(step, loaded.recipe.search[step - 1], [n for n, _, _ in cands], default, decide, decision)
        )
        if decision is None and not assume_defaults:
            break
        fixed |= decision["values"] if decision else dict(next(v for n, v, _ in cands if n == default))
    plan = _with_report(loaded, topological(finals))
    plan.search = steps
    return plan


def _with_report(loaded: LoadedRecipe, nodes: list[Node]) -> Plan:
    """Every recipe ends in its report (HTML + dataset card) over all of its artifacts."""
    prices = {m: p.model_dump() for m, p in loaded.recipe.prices.items()}
    # what the recipe sets that makes its artifacts (defaults and execution settings left out, as
    # in every id): a change to `shards` or `concurrency` does not rebuild the report
    resolved = json.loads(json.dumps(identity(loaded.recipe), default=str))
    return Plan(loaded, [*nodes, report_node(loaded.name, nodes, prices, loaded.recipe.description or "", resolved)])


def report_settings(
    recipe: str, nodes: list[Node], prices: dict | None = None, description: str = "", resolved: dict | None = None
) -> ReportSettings:
    """The report stage's settings for a plan's nodes (topological order), the recipe's token
    prices, description and resolved document (recipe.resolved.yaml's), each only when set."""
    return ReportSettings(
        recipe=recipe,
        description=description,
        prices=prices or None,
        resolved=resolved or {},
        nodes=[{"label": n.label, "stage": n.stage, "id": n.id, "dir": str(n.dir)} for n in nodes],
    )


def report_node(
    recipe: str, nodes: list[Node], prices: dict | None = None, description: str = "", resolved: dict | None = None
) -> Node:
    """The `report` node of a plan: every node's main output is an input (one per id), so the
    report is rebuilt exactly when an artifact changes; its id follows from theirs (and from the
    prices, description and recipe text it shows)."""
    config = report_settings(recipe, nodes, prices, description, resolved)
    return Node("report", "report", config, tuple({n.id: n for n in nodes}.values()))


def _finals(loaded: LoadedRecipe, prefix: str = "") -> list[Node]:
    """The last nodes of one recipe (labels under `prefix`); their inputs hold the rest. The
    recipe's stages are wired by the pipeline's shape (otbuild/plan/shape.py): each takes the
    data of the kinds it consumes as the stages before it left them."""
    if gap := next(iter(gaps(loaded.recipe)), None):
        where = f"{loaded.file_for(gap.key)}: {gap.key}: " if gap.key else f"{loaded.path}: "
        raise ConfigError(where + gap.why)
    w = _Wiring(loaded)
    for d, section in planned(loaded.recipe):
        nodes = PLANNERS[d.plan](w, d, section)
        kind = cast(str, d.produces)  # planned() yields the stages that produce data
        # a stage that consumes its own kind (a filter, the mix) takes its place; else it adds to it
        w.data[kind] = nodes if kind in d.consumes else [*w.data.get(kind, []), *nodes]
        if d.training and kind not in d.consumes and w.trained is None:
            w.trained = nodes[0]
        w.last = kind
    finals = w.data[w.last]
    if ev := loaded.recipe.eval:
        checkpoint = w.data.get("checkpoint")
        if ev.base and ev.model is None:  # the untrained base first: a recipe's eval is its last node
            finals = [*finals, _eval_node(loaded, ev, _base_node(cast(Node, w.trained)), label=BASE + "eval")]
        finals = [*finals, _eval_node(loaded, ev, checkpoint[0] if checkpoint else None)]
    return [_relabel(n, prefix) for n in finals] if prefix else finals


def _base_node(sft: Node) -> Node:
    """`eval.base`: the student's SFT node with 0 steps: the same model, tokenizer (trained on the
    same traces) and settings, saved untrained. Where the student trains 0 steps, they are one node."""
    return _node(sft.stage, BASE + sft.label, {**sft.settings, "max_steps": 0}, sft.inputs)


@dataclass
class _Wiring:
    """The data of each kind (tasks, traces, checkpoint) as the stages planned so far left it."""

    loaded: LoadedRecipe
    data: dict[str, list[Node]] = field(default_factory=dict)
    # kind -> its nodes by name, of a section of named entries (sources): augmented in place
    named: dict[str, dict[str, Node]] = field(default_factory=dict)
    trained: Node | None = None  # the first checkpoint trained from data (SFT): `eval.base` trains it 0 steps
    last: str = ""

    def inputs(self, d: StageDef) -> list[Node]:
        return [n for kind in d.consumes for n in self.data.get(kind, [])]

    def extra(self, d: StageDef) -> dict:
        """What the plan adds to a stage that renders or runs harness turns: the prompt style."""
        return {"prompt": self.loaded.recipe.harness.prompt} if issubclass(d.settings, PromptStyle) else {}


def _planned_section(w: _Wiring, d: StageDef, section: BaseModel) -> list[Node]:
    """A stage whose settings are its recipe section, over the data it consumes; labelled by
    its section (by its own name where that is a subsection: task_filter.llm is task_score)."""
    key = section_key(d)
    return [_section_node(d.name, d.name if "." in key else key, section, w.inputs(d), **w.extra(d))]


def _plan_named(w: _Wiring, d: StageDef, entries: dict) -> list[Node]:
    """A section of named entries (sources, trace_imports), each reading data outside the
    project: one node each, labelled SECTION/NAME, in rank order (then by name)."""
    ranked = sorted(entries.items(), key=lambda kv: (getattr(kv[1], "rank", None) or 0, kv[0]))
    nodes = {name: _external_node(w.loaded, d.name, f"{section_key(d)}/{name}", name, e) for name, e in ranked}
    w.named[cast(str, d.produces)] = nodes
    return list(nodes.values())


def _plan_per_source(w: _Wiring, d: StageDef, section) -> list[Node]:
    """Per source (`section.sources`, else all), before the mix: the new set takes its place."""
    sources = w.named[cast(str, d.produces)]
    for name in section.sources or list(sources):
        sources[name] = _section_node(d.name, f"{section_key(d)}/{name}", section, [sources[name]])
    return list(sources.values())


def _plan_top_n(w: _Wiring, d: StageDef, section) -> list[Node]:
    """The Top-N sources by rank (`section.n`), their names in the settings."""
    sources = w.named[cast(str, d.produces)]
    top = list(sources)[: section.n]
    return [_section_node(d.name, section_key(d), section, [sources[n] for n in top], sources=top)]


def _plan_decontaminating(w: _Wiring, d: StageDef, section) -> list[Node]:
    """Its task input, then the held-out sets it checks against (input name `held_out`): those
    of a task filter's `decontaminate.against`, or of a section's own `against` (near_dedup)."""
    tasks, held_out = w.inputs(d), _held_out(w.loaded, getattr(section, "decontaminate", section))
    node = _section_node(d.name, section_key(d), section, [*tasks, *held_out])
    return [replace(node, roles=("tasks",) * len(tasks) + ("held_out",) * len(held_out))]


def _plan_training(w: _Wiring, d: StageDef, section) -> list[Node]:
    """A training section: its base model found in the project, else kept as a Hub id."""
    settings = _passed(section)
    model = _local_model(w.loaded, settings["model"])
    return [_node(d.name, section_key(d), {**settings, "model": model, **w.extra(d)}, w.inputs(d))]


# How the plan makes a stage's nodes, by the stage's `StageDef.plan` ("" = its settings are its
# recipe section, over the data it consumes)
PLANNERS: dict[str, Callable[[_Wiring, StageDef, Any], list[Node]]] = {
    "": _planned_section,
    "named": _plan_named,
    "per_source": _plan_per_source,
    "top_n": _plan_top_n,
    "decontaminating": _plan_decontaminating,
    "training": _plan_training,
}
if unplanned := [n for n, d in STAGES.items() if d.plan not in PLANNERS]:
    raise ImportError(
        f"otbuild.plan: stage(s) {', '.join(unplanned)} name no planner (StageDef.plan: one of "
        f"{', '.join(map(repr, PLANNERS))})"
    )


def _held_out(loaded: LoadedRecipe, decontaminate) -> list[Node]:
    """The task sets a task filter decontaminates against, in `against` order, after its task
    input: an eval benchmark (the same node the eval reads) or else a source, as built."""
    r = loaded.recipe
    benchmarks = r.eval.benchmarks if r.eval else {}
    return [
        _source_node(loaded, name, benchmarks[name], group="benchmarks")
        if name in benchmarks
        else _source_node(loaded, name, r.sources[name])
        for name in (decontaminate.against if decontaminate else [])
    ]


def _local_model(loaded: LoadedRecipe, spec: dict) -> dict:
    """A pretrained model dir in the project is resolved; an HF id (in the local cache) is kept."""
    if spec["kind"] == "pretrained" and loaded.resolve(spec["path"]).exists():
        return {**spec, "path": str(loaded.resolve(spec["path"]).resolve())}
    return spec


def _relabel(node: Node, prefix: str) -> Node:
    """The same node (same id) under a candidate's label prefix, inputs included."""
    return Node(
        node.stage,
        prefix + node.label,
        node.config,
        tuple(_relabel(i, prefix) for i in node.inputs),
        node.missing,
        node.found,
        node.roles,
    )


def _eval_node(loaded: LoadedRecipe, ev, checkpoint: Node | None, label: str = "eval") -> Node:
    """Eval trials run like rollouts: the model's engine settings plus the eval's trial settings.
    Without an explicit model, the recipe's last checkpoint is served (transformers or vllm)."""
    benchmarks = [_source_node(loaded, name, src, group="benchmarks") for name, src in sorted(ev.benchmarks.items())]
    trials = ev.model_dump(include=set(ShardedTrials.model_fields) | {"concurrency"})  # the eval's, whoever answers
    if ev.model is not None:
        model = ev.model.model_dump()
    elif checkpoint is None:  # recipe/checks.py refuses this: an eval without a model trains none
        raise ConfigError(f"{loaded.path}: eval.model: required key is missing (the recipe trains no model)")
    else:  # the checkpoint is an input: its id is in this node's id
        model = {
            "engine": ev.serve_with,
            "model": str(checkpoint.dir),
            "temperature": ev.temperature,
            "max_tokens": ev.max_tokens,
            "engine_args": ev.engine_args,
            "serves_checkpoint": True,
        }
        if loaded.recipe.harness.constrained_decoding:
            from otbuild.harness.protocol import ANSWER_REGEX

            model["extra_body"] = {"structured_outputs": {"regex": ANSWER_REGEX}}
        benchmarks.append(checkpoint)
    served = f"{model['engine']}:{model.get('model') or model['engine']}"
    return _node(
        "eval",
        label,
        {
            **model,
            **trials,
            "samples_per_task": ev.repeats,
            "model_label": served,
            "prompt": loaded.recipe.harness.prompt,
        },
        benchmarks,
    )


def _node(stage: str, label: str, settings: dict, inputs=()) -> Node:
    """A node of `stage` with these settings, typed by its model (a plan that does not fit its
    stage fails here, not in the job)."""
    return Node(stage, label, STAGES[stage].config(settings), tuple(inputs))


def _passed(section: BaseModel) -> dict:
    """What of a recipe section its stage receives: all but what the plan reads itself."""
    return section.model_dump(exclude=fields_with(type(section), PLAN_ONLY))


def _section_node(stage: str, label: str, section: BaseModel, inputs: list[Node], **extra) -> Node:
    """A node whose settings are a recipe section plus what the plan adds (`extra`)."""
    return _node(stage, label, {**_passed(section), **extra}, inputs)


def _source_node(loaded: LoadedRecipe, name: str, src, group: str = "sources") -> Node:
    return _external_node(loaded, "source", f"{group}/{name}", name, src)


def _external_node(loaded: LoadedRecipe, stage: str, label: str, name: str, section: BaseModel) -> Node:
    """A node reading data outside the project (files, a dataset by id): addressed by what the
    plan finds there (otbuild/plan/external.py), not by where it lies."""
    config = STAGES[stage].config({"name": name, **_passed(section)})
    try:
        config, found, missing = find(config, loaded.resolve)
    except StageError as e:
        raise ConfigError(f"{loaded.path}: {label.replace('/', '.')}: {e}") from e
    return Node(stage, label, config, missing=tuple(_missing(loaded, label, *m) for m in missing), found=found)


def _missing(loaded: LoadedRecipe, label: str, key: str | None, what: str, needed: bool = True) -> Missing:
    """`label`'s recipe key (eval's benchmarks are under eval.benchmarks), and `key` in it."""
    section = ("eval." if label.startswith("benchmarks/") else "") + label.replace("/", ".")
    dotted = f"{section}.{key}" if key else section
    return Missing(loaded.file_for(dotted), dotted, what, needed)


def topological(finals: list[Node]) -> list[Node]:
    """Inputs before their users. A node shared under several labels (an ablation's common
    prefix) is listed under each: same id, one artifact."""
    out: dict[tuple[str, str], Node] = {}

    def visit(n: Node) -> None:
        for i in n.inputs:
            visit(i)
        out.setdefault((n.id, n.label), n)

    for n in finals:
        visit(n)
    return list(out.values())
