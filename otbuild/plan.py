"""Recipe -> DAG of content-addressed stage nodes.

A node's id hashes its stage, the stage's implementation version, the identity of its own
settings and the ids of its inputs, so an edit changes exactly the edited stage and what lies
downstream, and recipes sharing a prefix share artifacts. Artifacts live at
artifacts/<stage>/<id>/. The identity of a recipe section follows one rule
(otbuild/settings/identity.py): execution-only fields are left out, the others count only when they
differ from their default.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from otbuild.hashing import content_digest, settings_hash
from otbuild.settings.identity import identity
from otbuild.recipe.load import LoadedRecipe
from otbuild.settings.trials import ShardedTrials
from otbuild.stages import PROVENANCE, STAGES, shard_path
from otbuild.settings.stages import config

# Settings naming files outside the project's artifacts: hashed by content.
FILE_KEYS = {"path", "labels", "tasks", "instances"}
ARTIFACTS = Path("artifacts")
RESULTS = Path("results")


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
    settings: dict  # the spec's settings: the stage's settings model as JSON (otbuild/settings/stages.py)
    identity: dict  # what is hashed (settings with external paths replaced by their digests)
    inputs: tuple[Node, ...] = ()
    missing: tuple[Missing, ...] = ()  # external data the recipe names that is not there (yet)

    @cached_property
    def id(self) -> str:
        d = STAGES[self.stage]
        return settings_hash(
            {"stage": self.stage, "version": d.version, "settings": self.identity,
             "inputs": [n.id for n in self.inputs]}
        )

    @cached_property
    def config(self):
        """The typed settings the stage's job will receive (its model's defaults filled in)."""
        return config(self.stage, self.settings)

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
            "inputs": [{"id": n.id, "stage": n.stage, "path": str(n.main_output)} for n in self.inputs],
            "outdir": str(self.dir),
        }


@dataclass
class Plan:
    recipe: LoadedRecipe
    nodes: list[Node] = field(default_factory=list)  # topological order

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


def plan_recipe(loaded: LoadedRecipe) -> Plan:
    """The recipe's DAG; an ablation grid's candidates share nodes by id and feed a ranking."""
    if not loaded.recipe.ablate:
        return _with_report(loaded, _topo(_finals(loaded)))
    from otbuild.recipe.ablate import candidates

    evals, finals = [], []
    for name, cand in candidates(loaded):
        nodes = _finals(cand, prefix=f"candidates/{name}/")
        evals.append(next(n for n in nodes if n.stage == "eval"))
        finals += nodes
    settings = {"candidates": [e.label.split("/")[1] for e in evals]}
    if loaded.recipe.eval and loaded.recipe.eval.rank_by != "pass_at_1":  # the default keeps ids
        settings["metric"] = loaded.recipe.eval.rank_by
    finals.append(Node("rank", "ranking", settings, settings, tuple(evals)))
    return _with_report(loaded, _topo(finals))


def _with_report(loaded: LoadedRecipe, nodes: list[Node]) -> Plan:
    """Every recipe ends in its report (HTML + dataset card) over all of its artifacts."""
    prices = {m: p.model_dump() for m, p in loaded.recipe.prices.items()}
    # what the recipe sets that makes its artifacts (defaults and execution settings left out, as
    # in every id): a change to `shards` or `concurrency` does not rebuild the report
    resolved = json.loads(json.dumps(identity(loaded.recipe), default=str))
    nodes = [*nodes, report_node(loaded.name, nodes, prices, loaded.recipe.description or "", resolved)]
    for n in nodes:
        n.config  # noqa: B018 - every job's settings fit its stage's model, checked when planned
    return Plan(loaded, nodes)


def report_settings(recipe: str, nodes: list[Node], prices: dict | None = None, description: str = "",
                    resolved: dict | None = None) -> dict:
    """The report stage's settings for a plan's nodes (topological order), the recipe's token
    prices, description and resolved document (recipe.resolved.yaml's), each only when set."""
    settings = {"recipe": recipe,
                "nodes": [{"label": n.label, "stage": n.stage, "id": n.id, "dir": str(n.dir)} for n in nodes]}
    extra = {"prices": prices, "description": description, "resolved": resolved}
    return {**settings, **{k: v for k, v in extra.items() if v}}


def report_node(recipe: str, nodes: list[Node], prices: dict | None = None, description: str = "",
                resolved: dict | None = None) -> Node:
    """The `report` node of a plan: every node's main output is an input (one per id), so the
    report is rebuilt exactly when an artifact changes; its id follows from theirs (and from the
    prices, description and recipe text it shows)."""
    settings = report_settings(recipe, nodes, prices, description, resolved)
    inputs = tuple({n.id: n for n in nodes}.values())
    return Node("report", "report", settings, settings, inputs)


def _finals(loaded: LoadedRecipe, prefix: str = "") -> list[Node]:
    """The last nodes of one recipe (labels under `prefix`); their inputs hold the rest."""
    r = loaded.recipe
    ranked = sorted(r.sources.items(), key=lambda kv: (kv[1].rank or 0, kv[0]))
    sources = {name: _source_node(loaded, name, src) for name, src in ranked}
    if r.augment:  # per source, before the mix: the augmented set takes the source's place
        for name in r.augment.sources or list(sources):
            sources[name] = _section_node("augment", f"augment/{name}", r.augment, [sources[name]],
                                          exclude={"sources"})
    tasks: list[Node] = list(sources.values())
    if r.mix:
        top = [name for name, _ in ranked[: r.mix.n]]
        tasks = [_section_node("mix", "mix", r.mix, [sources[n] for n in top], extra={"sources": top})]
    if r.task_filter:
        if r.task_filter.llm:
            tasks = [_section_node("task_score", "task_score", r.task_filter.llm, tasks)]
        held_out = _held_out(loaded, r.task_filter.decontaminate)
        tasks = [_section_node("task_filter", "task_filter", r.task_filter, [*tasks, *held_out], exclude={"llm"})]
    traces: list[Node] = []
    if r.teacher:
        traces.append(_section_node("rollout", "teacher", r.teacher, tasks, extra=_harness(r)))
    for name, imp in sorted(r.trace_imports.items()):
        traces.append(_file_node(loaded, "trace_import", f"trace_imports/{name}",
                                 {"name": name, **imp.model_dump(exclude_none=True)},
                                 {"name": name, **identity(imp)}))
    finals = traces or tasks
    if r.trace_filter:
        finals = [_section_node("trace_filter", "trace_filter", r.trace_filter, traces)]
    model = None
    if r.sft:
        node = _section_node("sft", "sft", r.sft, finals, extra=_harness(r))
        for d in (node.settings, node.identity):
            _resolve_model(loaded, d["model"])
        model = finals = [node]
        if r.rl:
            model = finals = [_section_node("rl", "rl", r.rl, [*model, *tasks], extra=_harness(r))]
    if r.eval:
        finals = [*finals, _eval_node(loaded, r.eval, model[0] if model else None)]
    return [_relabel(n, prefix) for n in finals] if prefix else finals


def _held_out(loaded: LoadedRecipe, decontaminate) -> list[Node]:
    """The task sets a task filter decontaminates against, in `against` order, after its task
    input: an eval benchmark (the same node the eval reads) or else a source, as built."""
    r = loaded.recipe
    benchmarks = r.eval.benchmarks if r.eval else {}
    return [_source_node(loaded, name, benchmarks[name], group="benchmarks") if name in benchmarks
            else _source_node(loaded, name, r.sources[name]) for name in (decontaminate.against if decontaminate else [])]


def _harness(recipe) -> dict:
    """What a stage that renders or runs harness turns adds to its settings and id: the prompt
    style, when not the default (the id rule)."""
    return identity(recipe.harness, exclude={"constrained_decoding"})


def _resolve_model(loaded: LoadedRecipe, spec: dict) -> None:
    """A pretrained model dir in the project is resolved; an HF id (in the local cache) is kept."""
    if spec["kind"] == "pretrained" and loaded.resolve(spec["path"]).exists():
        spec["path"] = str(loaded.resolve(spec["path"]).resolve())


def _relabel(node: Node, prefix: str) -> Node:
    """The same node (same id) under a candidate's label prefix, inputs included."""
    return Node(node.stage, prefix + node.label, node.settings, node.identity,
                tuple(_relabel(i, prefix) for i in node.inputs), node.missing)


def _eval_node(loaded: LoadedRecipe, ev, checkpoint: Node | None) -> Node:
    """Eval trials run like rollouts: the model's engine settings plus the eval's trial settings.
    Without an explicit model, the recipe's last checkpoint is served (transformers or vllm)."""
    benchmarks = [_source_node(loaded, name, src, group="benchmarks") for name, src in sorted(ev.benchmarks.items())]
    trial = {*ShardedTrials.model_fields, "concurrency"}  # the eval's, whichever model answers
    checkpoint_serving = {"serve_with", "engine_args", "temperature", "max_tokens"}
    if ev.model is not None:
        model = ev.model.model_dump()
        ident = {**identity(ev, exclude={"benchmarks", "rank_by", "model", *checkpoint_serving}),
                 "model": identity(ev.model, exclude={*trial, "samples_per_task"})}
    else:  # the checkpoint is an input: its id is in this node's id
        model = {"engine": ev.serve_with, "model": str(checkpoint.dir), "temperature": ev.temperature,
                 "max_tokens": ev.max_tokens, "engine_args": ev.engine_args}
        ident = identity(ev, exclude={"benchmarks", "rank_by"})  # rank_by: the ranking's
        if loaded.recipe.harness.constrained_decoding:
            from otbuild.harness.protocol import ANSWER_REGEX

            model["extra_body"] = ident["extra_body"] = {"structured_outputs": {"regex": ANSWER_REGEX}}
        benchmarks.append(checkpoint)
    settings = {**model, **ev.model_dump(include=trial), "samples_per_task": ev.repeats,
                "model_label": f"{model['engine']}:{model.get('model') or model['engine']}"}
    harness = _harness(loaded.recipe)
    return Node("eval", "eval", {**settings, **harness}, {**ident, **harness}, tuple(benchmarks))


def _section_node(stage: str, label: str, section, inputs: list[Node], exclude: set[str] = frozenset(),
                  extra: dict | None = None) -> Node:
    """A node whose settings are a recipe section (less `exclude`, plus `extra`); its identity
    follows the section's id rule (otbuild/settings/identity.py)."""
    extra = extra or {}
    return Node(stage, label, {**section.model_dump(exclude=exclude), **extra},
                {**identity(section, exclude=exclude), **extra}, tuple(inputs))


def _source_node(loaded: LoadedRecipe, name: str, src, group: str = "sources") -> Node:
    return _file_node(loaded, "source", f"{group}/{name}", {"name": name, **src.model_dump(exclude={"rank"})},
                      {"name": name, **identity(src, exclude={"rank"})})


def _file_node(loaded: LoadedRecipe, stage: str, label: str, settings: dict, ident: dict) -> Node:
    """A node reading external files (FILE_KEYS). It is addressed by their content, not by
    where they lie. Data not there yet (to be fetched before the build) still plans, under
    an id that changes once it arrives."""
    if settings.get("kind") in ("hf-dataset", "harbor-dataset"):  # otbuild.sources.DATASET_KINDS
        return _dataset_node(loaded, stage, label, settings, ident)
    ident, missing = dict(ident), []
    for key in FILE_KEYS & settings.keys():
        if settings[key] is None:
            continue
        path = loaded.resolve(settings[key])
        settings[key] = str(path.resolve())
        if path.exists():
            ident[key] = {"sha256": content_digest(path)}
        else:
            ident[key] = {"missing": settings[key]}
            missing.append(_missing(loaded, label, key, str(path)))
    return Node(stage, label, settings, ident, missing=tuple(missing))


def _missing(loaded: LoadedRecipe, label: str, key: str | None, what: str, needed: bool = True) -> Missing:
    """`label`'s recipe key (eval's benchmarks are under eval.benchmarks), and `key` in it."""
    section = ("eval." if label.startswith("benchmarks/") else "") + label.replace("/", ".")
    dotted = f"{section}.{key}" if key else section
    return Missing(loaded.file_for(dotted), dotted, what, needed)


def _dataset_node(loaded: LoadedRecipe, stage: str, label: str, settings: dict, ident: dict) -> Node:
    """A node reading a dataset named by id (the Hub, Harbor's registry): addressed by the
    commit or version it resolves to and its files' content (otbuild/sources/__init__.py)."""
    from otbuild.errors import ConfigError, StageError
    from otbuild.sources import resolve_dataset
    from otbuild.traces.imports import PATH_FORMS

    forms = (".parquet",) if stage == "source" else PATH_FORMS[settings["format"]]
    try:
        settings, ident, missing = resolve_dataset(stage, settings, ident, loaded.resolve, forms)
    except StageError as e:
        raise ConfigError(f"{loaded.path}: {label.replace('/', '.')}: {e}") from e
    hub = settings["kind"] == "hf-dataset"  # the job may reach the Hub; a Harbor dataset is downloaded first
    return Node(stage, label, settings, ident, missing=tuple(_missing(loaded, label, None, m, needed=not hub)
                                                             for m in missing))


def _topo(finals: list[Node]) -> list[Node]:
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
