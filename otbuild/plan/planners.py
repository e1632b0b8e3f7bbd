"""How the plan makes a stage's nodes: the planner its `StageDef.plan` names (PLANNERS), called
with what the stage is planned over (`StageDef.over`):

- a recipe's section (`over` ""): a `Wiring`, the data of each kind as the stages before it
  left it, and the stage's recipe section;
- a grid (`over` "grid"): a `Grid`, the candidates of an ablation or of a search's step, each
  one's last nodes, and what the grid's stages planned before it;
- the whole plan (`over` "plan"): a `Whole`, the recipe and every node planned.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, cast

from pydantic import BaseModel

from otbuild.errors import ConfigError
from otbuild.plan.node import Node, external_node, make_node, passed, section_node
from otbuild.plan.shape import section_key
from otbuild.recipe.load import LoadedRecipe
from otbuild.settings.identity import identity
from otbuild.settings.recipe import PromptStyle
from otbuild.settings.stages import ReportSettings
from otbuild.settings.trials import ShardedTrials
from otbuild.stages import STAGES, StageDef

BASE = "base/"  # `eval.base`: the labels of the untrained base's checkpoint and eval (base/sft, base/eval)


@dataclass
class Wiring:
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
        """What the plan adds to a stage that renders or runs harness turns: the prompt style
        and the protocol."""
        harness = self.loaded.recipe.harness
        return {"prompt": harness.prompt, "protocol": harness.protocol} if issubclass(d.settings, PromptStyle) else {}


@dataclass
class Grid:
    """The candidates of an ablation or of a search's step, each planned as a recipe."""

    loaded: LoadedRecipe  # the recipe that sets the grid
    where: str  # the label prefix of the grid's own nodes: "" (an ablation), "search/STEP/"
    candidates: dict[str, list[Node]]  # name -> its last nodes (a recipe with an eval ends in it)
    step: int = 0  # a search's step (1, 2, ...); 0: an ablation, nothing to decide
    default: str = ""  # a search step's default candidate
    values: dict[str, dict] = field(default_factory=dict)  # a search step's candidate -> its values
    nodes: list[Node] = field(default_factory=list)  # what the grid's stages planned so far


@dataclass
class Whole:
    """A recipe's plan so far: what a stage over all of it reads."""

    loaded: LoadedRecipe
    nodes: list[Node]  # topological order


Planner = Callable[[Any, StageDef, Any], list[Node]]


def _planned_section(w: Wiring, d: StageDef, section: BaseModel) -> list[Node]:
    """A stage whose settings are its recipe section, over the data it consumes; labelled by
    its section (by its own name where that is a subsection: task_filter.llm is task_score)."""
    key = section_key(d)
    return [section_node(d.name, d.name if "." in key else key, section, w.inputs(d), **w.extra(d))]


def _plan_named(w: Wiring, d: StageDef, entries: dict) -> list[Node]:
    """A section of named entries (sources, trace_imports), each reading data outside the
    project: one node each, labelled SECTION/NAME, in rank order (then by name)."""
    ranked = sorted(entries.items(), key=lambda kv: (getattr(kv[1], "rank", None) or 0, kv[0]))
    nodes = {name: external_node(w.loaded, d.name, f"{section_key(d)}/{name}", name, e) for name, e in ranked}
    w.named[cast(str, d.produces)] = nodes
    return list(nodes.values())


def _plan_per_source(w: Wiring, d: StageDef, section) -> list[Node]:
    """Per source (`section.sources`, else all), before the mix: the new set takes its place."""
    sources = w.named[cast(str, d.produces)]
    for name in section.sources or list(sources):
        sources[name] = section_node(d.name, f"{section_key(d)}/{name}", section, [sources[name]])
    return list(sources.values())


def _plan_top_n(w: Wiring, d: StageDef, section) -> list[Node]:
    """The Top-N sources by rank (`section.n`), their names in the settings."""
    sources = w.named[cast(str, d.produces)]
    top = list(sources)[: section.n]
    return [section_node(d.name, section_key(d), section, [sources[n] for n in top], sources=top)]


def _plan_decontaminating(w: Wiring, d: StageDef, section) -> list[Node]:
    """Its task input, then the held-out sets it checks against (input name `held_out`): those its
    section names at `StageDef.held_out`."""
    tasks, held_out = w.inputs(d), _held_out(w.loaded, d.held_out_names(section))
    node = section_node(d.name, section_key(d), section, [*tasks, *held_out])
    return [replace(node, roles=("tasks",) * len(tasks) + ("held_out",) * len(held_out))]


# the teacher's trial settings a section that runs tasks the teacher's way takes where it leaves
# them unset: where and how a trial runs, not how many turns an agent gets
TEACHER_TRIALS = (
    "sandbox",
    "limits",
    "timeout_multiplier",
    "timeout_cap_sec",
    "build_network",
    "host_env",
    "harbor",
    "infra_retries",
    "max_infra_failures",
)


def _plan_teacher_trials(w: Wiring, d: StageDef, section) -> list[Node]:
    """Its section, over the data it consumes, with the teacher's sandbox settings (TEACHER_TRIALS)
    where the section leaves them unset (task validation runs each task where the rollouts will)."""
    teacher = w.loaded.recipe.teacher
    inherited = {} if teacher is None else teacher.model_dump(include=set(TEACHER_TRIALS) - section.model_fields_set)
    return [make_node(d.name, section_key(d), {**passed(section), **inherited, **w.extra(d)}, w.inputs(d))]


def _plan_training(w: Wiring, d: StageDef, section) -> list[Node]:
    """A training section: its base model found in the project, else kept as a Hub id."""
    settings = passed(section)
    model = _local_model(w.loaded, settings["model"])
    return [make_node(d.name, section_key(d), {**settings, "model": model, **w.extra(d)}, w.inputs(d))]


def _plan_model_under_test(w: Wiring, d: StageDef, ev) -> list[Node]:
    """The model under test on the benchmarks: the section's `model`, else the recipe's last
    checkpoint, served; with `base`, the untrained base first (a recipe with an eval ends in it)."""
    checkpoint = w.data.get("checkpoint")
    base = [_evaluated(w, d, ev, _base_node(cast(Node, w.trained)), BASE)] if ev.base and ev.model is None else []
    return [*base, _evaluated(w, d, ev, checkpoint[0] if checkpoint else None)]


def _base_node(trained: Node) -> Node:
    """`eval.base`: the student's first training node with 0 steps: the same model, tokenizer
    (trained on the same data) and settings, saved untrained. Where the student trains 0 steps,
    they are one node."""
    return make_node(trained.stage, BASE + trained.label, {**trained.settings, "max_steps": 0}, trained.inputs)


def _evaluated(w: Wiring, d: StageDef, ev, checkpoint: Node | None, prefix: str = "") -> Node:
    """Eval trials run like rollouts: the model's engine settings plus the eval's trial settings.
    Without an explicit model, the checkpoint is served (transformers or vllm)."""
    loaded = w.loaded
    benchmarks = [_task_set(loaded, name, src, "benchmarks") for name, src in sorted(ev.benchmarks.items())]
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
    settings = {**model, **trials, "samples_per_task": ev.repeats, "model_label": served, **w.extra(d)}
    return make_node(d.name, prefix + section_key(d), settings, benchmarks)


def _plan_candidates(g: Grid, d: StageDef, section: None) -> list[Node]:
    """One node over the grid's candidates, each one's last node an input (its eval), compared
    by the recipe's `eval.rank_by`."""
    ev = g.loaded.recipe.eval
    metric = {"metric": ev.rank_by} if ev else {}
    lasts = [nodes[-1] for nodes in g.candidates.values()]
    return [make_node(d.name, g.where + "ranking", {"candidates": list(g.candidates), **metric}, lasts)]


def _plan_search_step(g: Grid, d: StageDef, section: None) -> list[Node]:
    """A search step's winner, by the recipe's `decision` rules, from the ranking planned before
    it and the evals that ranking read (stages/decide.py); an ablation's grid decides nothing."""
    if not g.step:
        return []
    ranked = next(n for n in reversed(g.nodes) if STAGES[n.stage].ranks)
    config = {
        **g.loaded.recipe.decision.model_dump(),
        "step": g.step,
        "default": g.default,
        "metric": ranked.config.metric,
        "candidates": [{"name": n, "values": v} for n, v in g.values.items()],
    }
    return [make_node(d.name, g.where + "decision", config, [ranked, *ranked.inputs])]


def _plan_every_node(p: Whole, d: StageDef, section: None) -> list[Node]:
    """One node over every node of the plan (the report: HTML + dataset card), with the recipe's
    token prices, its description and what it sets that makes its artifacts (defaults and
    execution settings left out, as in every id: a change to `shards` does not rebuild it)."""
    r = p.loaded.recipe
    prices = {m: price.model_dump() for m, price in r.prices.items()}
    resolved = json.loads(json.dumps(identity(r), default=str))
    return [report_node(p.loaded.name, p.nodes, prices, r.description or "", resolved, d.name)]


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
    recipe: str,
    nodes: list[Node],
    prices: dict | None = None,
    description: str = "",
    resolved: dict | None = None,
    stage: str | None = None,
) -> Node:
    """The report node of a plan: every node's main output is an input (one per id), so the
    report is rebuilt exactly when an artifact changes; its id follows from theirs (and from the
    prices, description and recipe text it shows)."""
    stage = stage or next(d.name for d in STAGES.values() if d.over == "plan")
    config = report_settings(recipe, nodes, prices, description, resolved)
    return Node(stage, stage, config, tuple({n.id: n for n in nodes}.values()))


# How the plan makes a stage's nodes, by the stage's `StageDef.plan` ("" = its settings are its
# recipe section, over the data it consumes)
PLANNERS: dict[str, Planner] = {
    "": _planned_section,
    "named": _plan_named,
    "per_source": _plan_per_source,
    "top_n": _plan_top_n,
    "decontaminating": _plan_decontaminating,
    "teacher_trials": _plan_teacher_trials,
    "training": _plan_training,
    "model_under_test": _plan_model_under_test,
    "candidates": _plan_candidates,
    "search_step": _plan_search_step,
    "every_node": _plan_every_node,
}
if unplanned := [n for n, d in STAGES.items() if d.plan not in PLANNERS]:
    raise ImportError(
        f"otbuild.plan: stage(s) {', '.join(unplanned)} name no planner (StageDef.plan: one of "
        f"{', '.join(map(repr, PLANNERS))})"
    )


def _held_out(loaded: LoadedRecipe, against: list[str]) -> list[Node]:
    """The task sets a stage holds out, in `against` order: an eval benchmark (the same node the
    eval reads) or else a source, as built."""
    r = loaded.recipe
    benchmarks = r.eval.benchmarks if r.eval else {}
    return [
        _task_set(loaded, name, benchmarks[name], "benchmarks")
        if name in benchmarks
        else _task_set(loaded, name, r.sources[name], "sources")
        for name in against
    ]


def _task_set(loaded: LoadedRecipe, name: str, src: BaseModel, group: str) -> Node:
    """A task set outside the project (a source, a benchmark), labelled GROUP/NAME: a node of the
    stage that brings tasks in."""
    brings = next(d.name for d in STAGES.values() if d.brings == "tasks")
    return external_node(loaded, brings, f"{group}/{name}", name, src)


def _local_model(loaded: LoadedRecipe, spec: dict) -> dict:
    """A pretrained model dir in the project is resolved; an HF id (in the local cache) is kept."""
    if spec["kind"] == "pretrained" and loaded.resolve(spec["path"]).exists():
        return {**spec, "path": str(loaded.resolve(spec["path"]).resolve())}
    return spec
