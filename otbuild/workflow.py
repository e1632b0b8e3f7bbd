"""The glue the Snakefile uses: every recipe's plan, node lookup by id, and the results view."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from otbuild.errors import EXIT_USAGE, ConfigError
from otbuild.fsio import atomic_path
from otbuild.hashing import canonical_json
from otbuild.plan import RESULTS, Node, Plan, plan_recipe
from otbuild.provenance import read_record
from otbuild.recipe.load import LoadedRecipe, load_recipe
from otbuild.search import write_search

OTBUILD = f"{shlex.quote(sys.executable)} -m otbuild"
# The workflow a project's Snakefile includes (its rules/ beside it), or `otbuild build` runs.
SNAKEFILE = Path(__file__).with_name("Snakefile")


class Workflow:
    """All recipes under ROOT/recipes, planned. An invalid recipe blocks only its own target:
    asking for it ends the run with its error (exit 2) before anything runs; the others build,
    with a warning that names it."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.started = time.monotonic()  # the run's wall time, for its summary
        self.plans: dict[str, Plan] = {}
        self.nodes: dict[tuple[str, str], Node] = {}
        self.broken: dict[str, str] = {}  # recipe name -> its error
        self.checked: set[str] = set()  # targets whose warnings were printed
        for path in sorted((self.root / "recipes").glob("*.yaml")):
            try:
                plan = plan_recipe(load_recipe(path, self.root))
            except ConfigError as e:
                self.broken[path.stem] = str(e)
                continue
            except Exception as e:  # noqa: BLE001 (a bug must not block the other recipes either)
                self.broken[path.stem] = f"{path}: cannot be planned ({type(e).__name__}: {e}; a bug in otbuild)"
                continue
            self.plans[plan.recipe.name] = plan
            for n in plan.nodes:
                self.nodes[(n.stage, n.id)] = n

    @classmethod
    def load_or_exit(cls, root: Path) -> Workflow:
        """The workflow, after a warning naming each invalid recipe (their targets cannot build)."""
        wf = cls(root)
        for name, error in wf.broken.items():
            print(
                f"otbuild: warning: recipes/{name}.yaml is not valid, so target {name!r} cannot be "
                f"built (the others can): {error.splitlines()[0]}",
                file=sys.stderr,
            )
        return wf

    def refuse(self, name: str):
        """The input function of an invalid recipe's target: asked for, it ends the run with the
        recipe's errors (exit 2) while Snakemake builds its DAG, before any job or lock."""

        def fail(wildcards):
            print(f"otbuild: {self.broken[name]}", file=sys.stderr)
            sys.exit(EXIT_USAGE)

        return fail

    def target(self, name: str, dryrun: Callable[[], bool], decided: Callable[[Node], object]) -> Callable:
        """The input function of recipe NAME's target: every artifact of its plan. Asked for, it
        first prints validate's warnings; a path the recipe names that does not exist ends the
        run (exit 2) before any job or lock, naming the file and key (a dry run only warns).
        A search's are its files once every stage is decided (`settled_files`)."""

        def inputs(wildcards):
            plan = self.plans[name]
            if name not in self.checked:
                self.checked.add(name)
                said = preflight(plan)
                stop = [m for m, needed in said if needed and not dryrun()]
                for message in (m for m, _ in said if m not in stop):
                    print(f"otbuild: warning: {message}", file=sys.stderr)
                if stop:
                    print("\n".join(f"otbuild: error: {m}" for m in stop), file=sys.stderr)
                    print(
                        f"otbuild: target {name!r} cannot be built without it: fix the path or bring the data "
                        f"(`otbuild validate {name}` lists what is missing); nothing was run",
                        file=sys.stderr,
                    )
                    sys.exit(EXIT_USAGE)
            return self.settled_files(name, decided)

        return inputs

    def settled_files(self, name: str, decided: Callable[[Node], object]) -> list[str]:
        """Recipe NAME's artifact files. A search is planned again once its pending decision is
        built; while a stage is pending, `decided(NODE)` (its Snakemake checkpoint) raises until
        that decision is built, and Snakemake asks again: nothing past a pending stage (the report,
        the manifest) is built before the search has got there."""
        plan = self.plans[name]
        if (step := plan.pending) is not None and read_record(step.decide.dir) is not None:
            plan = self.replan(name)  # its pending decision is built now: plan what follows it
        if (step := plan.pending) is not None:
            decided(step.decide)
        return self.artifact_files(name)

    def artifact_files(self, name: str) -> list[str]:
        """Every output file and record of recipe NAME's artifacts."""
        return [str(p) for n in self.plans[name].nodes for p in (*n.outputs, n.provenance)]

    def replan(self, name: str) -> Plan:
        """Recipe NAME planned again (a search: as far as its decisions are built), its nodes known."""
        plan = self.plans[name] = plan_recipe(self.plans[name].recipe)
        self.nodes.update({(n.stage, n.id): n for n in plan.nodes})
        return plan

    def node(self, stage: str, id: str) -> Node:
        return self.nodes[(stage, id)]

    def describe_log(self, log: str, targets: tuple[str, ...] = ()) -> str:
        """A job named by its recipe label from its log path (`teacher, shard 1 of 2`): its label
        in the first of `targets` (the recipes being built) that plans it, else in any recipe (an
        artifact two recipes share has one id and a label in each)."""
        from otbuild.progress import describe_log

        wanted = {
            (n.stage, n.id): n for name in reversed(targets) if name in self.plans for n in self.plans[name].nodes
        }
        return describe_log(
            log, lambda stage, id: n.label if (n := wanted.get((stage, id)) or self.nodes.get((stage, id))) else None
        )

    def watch(self, out, targets: list[str]) -> None:
        """When the run starts: show the running jobs' progress on its console (otbuild/progress.py),
        each job by its label in the recipes asked for."""
        from otbuild.progress import Watcher

        self.watcher = Watcher(self.root, lambda log: self.describe_log(log, tuple(targets)), out).start()

    def summaries(self, targets) -> list[str]:
        """When the run succeeded: what it made, for each recipe it was asked for (otbuild/summary.py)."""
        from otbuild.summary import summary

        if getattr(self, "watcher", None):
            self.watcher.stop()
        out = []
        for name in (t for t in targets if t in self.plans):
            try:
                out.append(summary(self.plans[name], self.root, time.monotonic() - self.started))
            except Exception as e:  # noqa: BLE001 (the build succeeded: a summary never fails it)
                out.append(f"otbuild: {name} is built; no summary ({type(e).__name__}: {e})")
        return out

    def shard_inputs(self, stage: str, id: str) -> list[str]:
        """What a merge job reads. A built artifact names the shards it was built from, so a
        changed `shards` (not part of the id) neither reruns nor mixes layouts, and one built
        before its stage had shards reads what that job read: it stays built."""
        node = self.node(stage, id)
        record = read_record(node.dir)
        if record and "shards" not in record.get("settings", {}):  # built as one job, before
            return [str(n.main_output) for n in node.inputs]  # the stage had shards: as then
        built = record["settings"]["shards"] if record else None
        return [str(p) for p in node.shard_outputs(built)]

    def spec_arg(self, stage: str, id: str) -> str:
        return shlex.quote(canonical_json(self.node(stage, id).spec()))

    def add_outside_recipe(self, path: str | Path | None) -> None:
        """Plan a recipe file outside ROOT/recipes too (`otbuild build PATH` names it in the
        config, RECIPE_KEY): its target is its file's stem. Invalid: exit 2 with its error."""
        if not path:
            return
        try:
            loaded = load_recipe(Path(path), self.root)
            plan = plan_recipe(loaded) if outside_recipe(loaded, self.root) else None
        except ConfigError as e:
            print(f"otbuild: {e}", file=sys.stderr)
            sys.exit(2)
        if plan is not None:
            self.plans[plan.recipe.name] = plan
            self.nodes.update({(n.stage, n.id): n for n in plan.nodes})


# The Snakemake config key naming a recipe file outside ROOT/recipes (`otbuild build PATH`).
RECIPE_KEY = "otbuild_recipe"


def outside_recipe(loaded: LoadedRecipe, root: Path) -> Path | None:
    """The recipe's file when it is not ROOT/recipes/NAME.yaml, for Snakemake's config
    (RECIPE_KEY); None when it is. A file elsewhere whose stem names another recipe is refused."""
    own = Path(root) / "recipes" / f"{loaded.name}.yaml"
    if not own.exists():
        return loaded.path.resolve()
    if own.resolve() != loaded.path.resolve():
        raise ConfigError(f"{loaded.path}: its target name {loaded.name!r} is taken by {own}; rename the file")
    return None


def preflight(plan: Plan) -> list[tuple[str, bool]]:
    """What `validate` warns about in a recipe, each once (with how many of an ablation's
    candidates it concerns): data the recipe names that is not there, sampling settings a
    reasoning model is not sent. True beside a message: a build cannot run without it (a path
    that does not exist; a dataset on the Hub is fetched by its job)."""
    from otbuild.engines.request_policy import not_sent
    from otbuild.settings.recipe import LLM

    found: dict[tuple[str, bool], int] = {}
    for m in plan.missing:
        said = (f"{m}; the build needs it" if m.needed else str(m), m.needed)
        found[said] = found.get(said, 0) + 1
    for node in plan.nodes:
        cfg = node.config
        if (
            isinstance(cfg, LLM)
            and cfg.engine in ("openai", "vllm", "transformers")
            and cfg.model
            and (keys := not_sent(cfg.request_params, cfg.model, node.identity))
        ):
            label = node.label.split("/", 2)[2] if node.label.startswith("candidates/") else node.label
            message = (
                f"{label}: {cfg.model} is a reasoning model: {', '.join(keys)} not sent "
                "(only its default is accepted; docs/engines.md)"
            )
            found[(message, False)] = found.get((message, False), 0) + 1
    return [(message + (f" ({n} candidates)" if n > 1 else ""), needed) for (message, needed), n in found.items()]


def write_results(plan: Plan, log: str | Path | None = None) -> Path:
    """Write results/<recipe>/ whole: the view (write_view) and manifest.json (write_manifest,
    which leaves an unchanged manifest as it is)."""
    write_manifest(plan)
    out = write_view(plan)
    searched = [p.name for p in write_search(plan, out)] if plan.search else []
    _say(
        log,
        f"{out}/: {len(plan.nodes)} links by label, recipe.resolved.yaml, manifest.json"
        + "".join(f", {f}" for f in searched),
    )
    return out


def write_view(plan: Plan) -> Path:
    """Write results/<recipe>/'s view: a link per node (its label) and recipe.resolved.yaml."""
    out = RESULTS / plan.recipe.name
    out.mkdir(parents=True, exist_ok=True)
    labels = set()
    for n in plan.nodes:
        link = out / n.label
        labels.add(link)
        link.parent.mkdir(parents=True, exist_ok=True)
        target = os.path.relpath(n.dir, link.parent)
        if link.is_symlink() and os.readlink(link) == target:
            continue
        with atomic_path(link) as tmp:
            tmp.symlink_to(target)
    for stale in [p for p in out.rglob("*") if p.is_symlink() and p not in labels]:
        stale.unlink()
    with atomic_path(out / "recipe.resolved.yaml") as tmp:
        tmp.write_text(yaml.safe_dump(plan.recipe.data, sort_keys=False))
    return out


def write_manifest(plan: Plan, log: str | Path | None = None) -> Path:
    """Write results/<recipe>/manifest.json, naming every artifact with its id, outputs, row
    counts and sha256 (from the provenance records) and the recipe file's sha256."""
    path = RESULTS / plan.recipe.name / "manifest.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    manifest = {
        "recipe": plan.recipe.name,
        "recipe_file": str(plan.recipe.path),
        "recipe_sha256": hashlib.sha256(plan.recipe.path.read_bytes()).hexdigest(),
        "artifacts": [
            {
                "label": n.label,
                "stage": n.stage,
                "id": n.id,
                "dir": str(n.dir),
                "inputs": [i.id for i in n.inputs],
                "outputs": (read_record(n.dir) or {}).get("outputs", []),
            }
            for n in plan.nodes
        ],
    }
    text = json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n"  # as write_json writes it
    if not path.is_file() or path.read_text() != text:
        with atomic_path(path) as tmp:  # unchanged, it stays as it is (its mtime too)
            tmp.write_text(text)
    _say(log, f"{path}: {len(plan.nodes)} artifacts")
    return path


def _say(log: str | Path | None, line: str) -> None:
    if log is not None:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        Path(log).write_text(line + "\n")
