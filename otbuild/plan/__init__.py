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

from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from otbuild.errors import ConfigError
from otbuild.plan.node import ARTIFACTS, Missing, Node, relabel, topological
from otbuild.plan.planners import BASE, PLANNERS, Grid, Whole, Wiring, report_node, report_settings
from otbuild.plan.shape import gaps, planned, section_key, section_of
from otbuild.recipe.load import LoadedRecipe
from otbuild.stages import STAGES

__all__ = [
    "ARTIFACTS",
    "BASE",
    "RESULTS",
    "Missing",
    "Node",
    "Plan",
    "SearchStep",
    "plan_recipe",
    "report_node",
    "report_settings",
    "topological",
]

RESULTS = Path("results")


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
        return _whole(loaded, _finals(loaded))
    from otbuild.recipe.ablate import candidates

    grid = _grid(Grid(loaded, "", {name: _finals(c, f"candidates/{name}/") for name, c in candidates(loaded)}))
    return _whole(loaded, [*_candidates_nodes(grid), *grid.nodes])


def _grid(g: Grid) -> Grid:
    """The stages planned over a grid (`StageDef.over` "grid": its ranking, a search step's
    decision), in pipeline order, each seeing what those before it planned."""
    for d in STAGES.values():
        if d.over == "grid":
            g.nodes += PLANNERS[d.plan](g, d, None)
    return g


def _candidates_nodes(g: Grid) -> list[Node]:
    return [n for nodes in g.candidates.values() for n in nodes]


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
    ranked as an ablation is, then decided (the grid's checkpoint stage); planned up to the first
    stage whose decision is not built yet: its checkpoint replans the rest (otbuild/workflow.py)."""
    from otbuild.recipe.ablate import search_stage
    from otbuild.stages.decide import read_decision

    finals: list[Node] = []
    steps: list[SearchStep] = []
    fixed: dict = {}
    for step in range(1, len(loaded.recipe.search) + 1):
        cands, default = search_stage(loaded, step, fixed)
        where = f"search/{step}/"
        lasts = {n: _finals(c, f"{where}{n}/") for n, _, c in cands}
        g = _grid(Grid(loaded, where, lasts, step, default, {n: v for n, v, _ in cands}))
        decide = next(n for n in g.nodes if STAGES[n.stage].checkpoint)
        finals += [*_candidates_nodes(g), *g.nodes]
        decision = read_decision(loaded.root / decide.dir)
        steps.append(SearchStep(step, loaded.recipe.search[step - 1], list(lasts), default, decide, decision))
        if decision is None and not assume_defaults:
            break
        fixed |= decision["values"] if decision else dict(g.values[default])
    plan = _whole(loaded, finals)
    plan.search = steps
    return plan


def _whole(loaded: LoadedRecipe, finals: list[Node]) -> Plan:
    """The plan's nodes, inputs first, then the stages over all of them (`StageDef.over`
    "plan"): every recipe ends in its report (HTML + dataset card) over all of its artifacts."""
    nodes = topological(finals)
    for d in STAGES.values():
        if d.over == "plan":
            nodes += PLANNERS[d.plan](Whole(loaded, list(nodes)), d, None)
    return Plan(loaded, nodes)


def _finals(loaded: LoadedRecipe, prefix: str = "") -> list[Node]:
    """The last nodes of one recipe (labels under `prefix`); their inputs hold the rest. The
    recipe's stages are wired by the pipeline's shape (otbuild/plan/shape.py): each takes the
    data of the kinds it consumes as the stages before it left them; then the stages it sets
    that make no data (its eval: a recipe with one ends in it) over what they left."""
    if gap := next(iter(gaps(loaded.recipe)), None):
        where = f"{loaded.file_for(gap.key)}: {gap.key}: " if gap.key else f"{loaded.path}: "
        raise ConfigError(where + gap.why)
    w = Wiring(loaded)
    for d, section in planned(loaded.recipe):
        nodes = PLANNERS[d.plan](w, d, section)
        kind = cast(str, d.produces)  # planned() yields the stages that produce data
        # a stage that consumes its own kind (a filter, the mix) takes its place; else it adds to it
        w.data[kind] = nodes if kind in d.consumes else [*w.data.get(kind, []), *nodes]
        if d.training and kind not in d.consumes and w.trained is None:
            w.trained = nodes[0]
        w.last = kind
    finals = w.data[w.last]
    for d in STAGES.values():
        if not d.over and not d.produces and (section := section_of(loaded.recipe, section_key(d))) is not None:
            finals = [*finals, *PLANNERS[d.plan](w, d, section)]
    return [relabel(n, prefix) for n in finals] if prefix else finals
