"""Recipe -> DAG of content-addressed stage nodes.

A node's id hashes its stage, the stage's implementation version, its own settings and the
ids of its inputs, so an edit changes exactly the edited stage and what lies downstream, and
recipes sharing a prefix share artifacts. Artifacts live at artifacts/<stage>/<id>/.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from otbuild.hashing import content_digest, settings_hash
from otbuild.recipe.load import LoadedRecipe
from otbuild.stages import PROVENANCE, STAGES

# Settings that change how a stage runs, not what it produces: not part of its id.
EXECUTION_ONLY = {"concurrency", "save_steps", "save_total_limit", "keep_checkpoints", "launcher",
                  "gpus_per_node", "master_port"}
# Settings naming files outside the project's artifacts: hashed by content.
FILE_KEYS = {"path", "labels", "tasks", "instances"}
ARTIFACTS = Path("artifacts")
RESULTS = Path("results")


@dataclass(frozen=True)
class Node:
    stage: str
    label: str  # the node's name within its recipe, e.g. "sources/synth", "mix"
    settings: dict  # what the stage function receives
    identity: dict  # what is hashed (settings with external paths replaced by their digests)
    inputs: tuple[Node, ...] = ()
    missing: tuple[str, ...] = ()  # external paths the recipe names that do not exist (yet)

    @cached_property
    def id(self) -> str:
        d = STAGES[self.stage]
        return settings_hash(
            {"stage": self.stage, "version": d.version, "settings": self.identity,
             "inputs": [n.id for n in self.inputs]}
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

    @property
    def shard_outputs(self) -> list[Path]:
        """Sharded stages run as one job per shard, then a merge job."""
        return [self.dir / "shards" / f"{k}.parquet" for k in range(self.settings.get("shards", 0))]

    def spec(self) -> dict:
        """Everything `otbuild stage run` needs, as plain JSON."""
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
    def missing(self) -> list[tuple[Node, str]]:
        return [(n, m) for n in self.nodes for m in n.missing]

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
    from otbuild.report import report_node

    return Plan(loaded, [*nodes, report_node(loaded.name, nodes)])


def _finals(loaded: LoadedRecipe, prefix: str = "") -> list[Node]:
    """The last nodes of one recipe (labels under `prefix`); their inputs hold the rest."""
    r = loaded.recipe
    ranked = sorted(r.sources.items(), key=lambda kv: (kv[1].rank or 0, kv[0]))
    sources = {name: _source_node(loaded, name, src) for name, src in ranked}
    if r.augment:  # per source, before the mix: the augmented set takes the source's place
        settings = r.augment.model_dump(exclude={"sources"})
        for name in r.augment.sources or list(sources):
            sources[name] = _llm_node("augment", f"augment/{name}", settings, [sources[name]])
    tasks: list[Node] = list(sources.values())
    if r.mix:
        top = [name for name, _ in ranked[: r.mix.n]]
        settings = {**r.mix.model_dump(), "sources": top}
        tasks = [Node("mix", "mix", settings, settings, tuple(sources[n] for n in top))]
    if r.task_filter:
        if r.task_filter.llm:
            tasks = [_llm_node("task_score", "task_score", r.task_filter.llm.model_dump(), tasks)]
        settings = r.task_filter.model_dump(exclude={"llm"})
        tasks = [Node("task_filter", "task_filter", settings, settings, tuple(tasks))]
    traces: list[Node] = []
    if r.teacher:
        traces.append(_llm_node("rollout", "teacher", _harness(r, r.teacher.model_dump()), tasks))
    for name, imp in sorted(r.trace_imports.items()):
        traces.append(_file_node(loaded, "trace_import", f"trace_imports/{name}",
                                 {"name": name, **imp.model_dump(exclude_none=True)}))
    finals = traces or tasks
    if r.trace_filter:
        settings = r.trace_filter.model_dump()
        finals = [Node("trace_filter", "trace_filter", settings, settings, tuple(traces))]
    model = None
    if r.sft:
        model = finals = [_llm_node("sft", "sft", _harness(r, _model_settings(loaded, r.sft.model_dump())), finals)]
        if r.rl:
            model = finals = [_llm_node("rl", "rl", _harness(r, r.rl.model_dump()), [*model, *tasks])]
    if r.eval:
        finals = [*finals, _eval_node(loaded, r.eval, model[0] if model else None)]
    return [_relabel(n, prefix) for n in finals] if prefix else finals


def _harness(recipe, settings: dict) -> dict:
    """A stage that renders or runs harness turns gets the prompt style; the default is left
    out, so recipes that do not set it keep their ids."""
    if recipe.harness.prompt != "terminus2":
        settings["prompt"] = recipe.harness.prompt
    return settings


def _model_settings(loaded: LoadedRecipe, settings: dict) -> dict:
    """A pretrained model dir in the project is resolved; an HF id (in the local cache) is kept."""
    spec = settings["model"]
    if spec["kind"] == "pretrained" and loaded.resolve(spec["path"]).exists():
        spec["path"] = str(loaded.resolve(spec["path"]).resolve())
    return settings


def _relabel(node: Node, prefix: str) -> Node:
    """The same node (same id) under a candidate's label prefix, inputs included."""
    return Node(node.stage, prefix + node.label, node.settings, node.identity,
                tuple(_relabel(i, prefix) for i in node.inputs), node.missing)


def _eval_node(loaded: LoadedRecipe, ev, checkpoint: Node | None) -> Node:
    """Eval trials run like rollouts: the model's engine settings plus the eval's trial settings.
    Without an explicit model, the recipe's last checkpoint is served (transformers or vllm)."""
    benchmarks = [_source_node(loaded, name, src, group="benchmarks") for name, src in sorted(ev.benchmarks.items())]
    if ev.model is not None:
        model = ev.model.model_dump()
    else:
        model = {"engine": ev.serve_with, "model": str(checkpoint.dir), "temperature": ev.temperature,
                 "max_tokens": ev.max_tokens, "engine_args": ev.engine_args}
        if loaded.recipe.harness.constrained_decoding:  # the default keeps ids
            from otbuild.harness.protocol import ANSWER_REGEX

            model["extra_body"] = {"guided_regex": ANSWER_REGEX}
        benchmarks.append(checkpoint)
    trial = ev.model_dump(include={"timeout_multiplier", "timeout_cap_sec", "max_episodes", "shards",
                                   "concurrency", "sandbox", "limits", "harbor"})
    settings = {**model, **trial, "samples_per_task": ev.repeats, "agent_timeout_sec": None,
                "model_label": f"{model['engine']}:{model.get('model') or model['engine']}"}
    return _llm_node("eval", "eval", _harness(loaded.recipe, settings), benchmarks)


def _llm_node(stage: str, label: str, settings: dict, inputs: list[Node]) -> Node:
    identity = {k: v for k, v in settings.items() if k not in EXECUTION_ONLY}
    return Node(stage, label, settings, identity, tuple(inputs))


def _source_node(loaded: LoadedRecipe, name: str, src, group: str = "sources") -> Node:
    return _file_node(loaded, "source", f"{group}/{name}", {"name": name, **src.model_dump(exclude={"rank"})})


def _file_node(loaded: LoadedRecipe, stage: str, label: str, settings: dict) -> Node:
    """A node reading external files (FILE_KEYS). It is addressed by their content, not by
    where they lie. Data not there yet (to be fetched before the build) still plans, under
    an id that changes once it arrives."""
    identity, missing = dict(settings), []
    for key in FILE_KEYS & settings.keys():
        if settings[key] is None:
            continue
        path = loaded.resolve(settings[key])
        settings[key] = str(path.resolve())
        if path.exists():
            identity[key] = {"sha256": content_digest(path)}
        else:
            identity[key] = {"missing": settings[key]}
            missing.append(str(path))
    return Node(stage, label, settings, identity, missing=tuple(missing))


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
