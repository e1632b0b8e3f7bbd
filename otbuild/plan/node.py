"""A node of the plan: one artifact of one stage, with its typed settings and its inputs, and how
the planners (otbuild/plan/planners.py) make one from a recipe section or from data outside
the project."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from otbuild.artifact import PROVENANCE
from otbuild.errors import ConfigError, StageError
from otbuild.hashing import settings_hash
from otbuild.plan.external import find
from otbuild.recipe.load import LoadedRecipe
from otbuild.settings.base import PLAN_ONLY, fields_with
from otbuild.settings.identity import identity
from otbuild.stagekit import shard_path
from otbuild.stages import STAGES, input_name

ARTIFACTS = Path("artifacts")


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


def make_node(stage: str, label: str, settings: dict, inputs=()) -> Node:
    """A node of `stage` with these settings, typed by its model (a plan that does not fit its
    stage fails here, not in the job)."""
    return Node(stage, label, STAGES[stage].config(settings), tuple(inputs))


def passed(section: BaseModel) -> dict:
    """What of a recipe section its stage receives: all but what the plan reads itself."""
    return section.model_dump(exclude=fields_with(type(section), PLAN_ONLY))


def section_node(stage: str, label: str, section: BaseModel, inputs: list[Node], **extra) -> Node:
    """A node whose settings are a recipe section plus what the plan adds (`extra`)."""
    return make_node(stage, label, {**passed(section), **extra}, inputs)


def external_node(loaded: LoadedRecipe, stage: str, label: str, name: str, section: BaseModel) -> Node:
    """A node reading data outside the project (files, a dataset by id): addressed by what the
    plan finds there (otbuild/plan/external.py), not by where it lies."""
    config = STAGES[stage].config({"name": name, **passed(section)})
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


def relabel(node: Node, prefix: str) -> Node:
    """The same node (same id) under a candidate's label prefix, inputs included."""
    return Node(
        node.stage,
        prefix + node.label,
        node.config,
        tuple(relabel(i, prefix) for i in node.inputs),
        node.missing,
        node.found,
        node.roles,
    )


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
