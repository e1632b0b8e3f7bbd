"""The glue the Snakefile uses: every recipe's plan, node lookup by id, and the results view."""

from __future__ import annotations

import hashlib
import os
import shlex
import sys
from pathlib import Path

import yaml

from otbuild.errors import ConfigError
from otbuild.fsio import atomic_path, write_json
from otbuild.hashing import canonical_json
from otbuild.plan import RESULTS, Node, Plan, plan_recipe
from otbuild.provenance import read_record
from otbuild.recipe.load import load_recipe

OTBUILD = f"{shlex.quote(sys.executable)} -m otbuild"
# The workflow a project's Snakefile includes (its rules/ beside it), or `otbuild build` runs.
SNAKEFILE = Path(__file__).with_name("Snakefile")


class Workflow:
    """All recipes under ROOT/recipes, planned. Any invalid recipe stops the build (exit 2)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.plans: dict[str, Plan] = {}
        self.nodes: dict[tuple[str, str], Node] = {}
        for path in sorted((self.root / "recipes").glob("*.yaml")):
            plan = plan_recipe(load_recipe(path, self.root))
            self.plans[plan.recipe.name] = plan
            for n in plan.nodes:
                self.nodes[(n.stage, n.id)] = n

    @classmethod
    def load_or_exit(cls, root: Path) -> Workflow:
        try:
            return cls(root)
        except ConfigError as e:
            print(f"otbuild: {e}", file=sys.stderr)
            sys.exit(2)

    def node(self, stage: str, id: str) -> Node:
        return self.nodes[(stage, id)]

    def shard_inputs(self, stage: str, id: str) -> list[str]:
        """What a merge job reads. A built artifact names the shards it was built from, so a
        changed `shards` (not part of the id) neither reruns nor mixes layouts."""
        node = self.node(stage, id)
        built = (read_record(node.dir) or {}).get("settings", {}).get("shards")
        return [str(p) for p in node.shard_outputs(built)]

    def spec_arg(self, stage: str, id: str) -> str:
        return shlex.quote(canonical_json(self.node(stage, id).spec()))


def publish(plan: Plan) -> Path:
    """Write results/<recipe>/: a link per node (its label) and manifest.json naming every
    artifact with its id, outputs, row counts and sha256 (from the provenance records)."""
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
    recipe_bytes = plan.recipe.path.read_bytes()
    with atomic_path(out / "recipe.resolved.yaml") as tmp:
        tmp.write_text(yaml.safe_dump(plan.recipe.data, sort_keys=False))
    write_json(out / "manifest.json", {
        "recipe": plan.recipe.name,
        "recipe_file": str(plan.recipe.path),
        "recipe_sha256": hashlib.sha256(recipe_bytes).hexdigest(),
        "artifacts": [
            {"label": n.label, "stage": n.stage, "id": n.id, "dir": str(n.dir),
             "inputs": [i.id for i in n.inputs],
             "outputs": (read_record(n.dir) or {}).get("outputs", [])}
            for n in plan.nodes
        ],
    })
    return out
