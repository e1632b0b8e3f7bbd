"""Load a recipe: its YAML and `extends:` chain (recipe/read.py), the schema, then the checks
around it (recipe/checks.py); every error names the file that set the key (recipe/messages.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from otbuild.errors import ConfigError
from otbuild.recipe.checks import Checker
from otbuild.recipe.messages import file_for, format_error, suggest
from otbuild.recipe.read import read_chain
from otbuild.recipe.schema import Recipe
from otbuild.settings.added import added_sections
from otbuild.settings.recipe import NAME_RE


@dataclass(frozen=True)
class LoadedRecipe:
    name: str
    path: Path  # the recipe file
    root: Path  # project root: relative paths in the recipe resolve against it
    data: dict  # merged, pre-validation document (for the results view)
    recipe: Recipe
    origin: dict = field(default_factory=dict, compare=False)  # key path -> the file that set it (extends)

    def resolve(self, p: str) -> Path:
        path = Path(p)
        return path if path.is_absolute() else (self.root / path)

    def file_for(self, key: str) -> Path:
        """The recipe file that set `key` (dotted: `sources.mine.path`), this one or one it extends."""
        return file_for(tuple(key.split(".")), self.origin, self.path)


def recipe_path(name_or_path: str | Path, root: Path) -> Path:
    """`smoke` -> ROOT/recipes/smoke.yaml; a path to a .yaml file is taken as is."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return p
    return root / "recipes" / f"{name_or_path}.yaml"


def load_recipe(name_or_path: str | Path, root: Path | None = None) -> LoadedRecipe:
    root = Path(root or Path.cwd())
    path = recipe_path(name_or_path, root)
    if not path.is_file():
        known = sorted(q.stem for q in (root / "recipes").glob("*.yaml"))
        raise ConfigError(f"{path}: no such recipe" + suggest(str(name_or_path), known, "recipes"))
    name = path.stem
    if not re.match(NAME_RE, name):
        raise ConfigError(f"{path}: recipe names must be identifiers ([A-Za-z_][A-Za-z0-9_]*), found {name!r}")
    data, origin = read_chain(path, [])
    return LoadedRecipe(name, path, path.resolve().parent.parent, data, validate(data, origin, path), origin)


def validate(data: dict, origin: dict, path: Path, context: str = "") -> Recipe:
    """The schema, then the checks across keys; errors name the file that set each key."""
    check = Checker(origin, path)
    try:
        check.finite(data)
        check.credentials(data)
        recipe = Recipe.model_validate(_with_added(data, origin, path))
        check.regexes(recipe)
        check.sections(recipe)
    except ValidationError as e:
        raise ConfigError("\n".join(context + format_error(err, origin, path) for err in e.errors())) from None
    except ConfigError as e:
        raise ConfigError(context + str(e)) from None
    return recipe


def _with_added(data: dict, origin: dict, path: Path) -> dict:
    """The document with the sections of stages added by installed packages (a StageDef outside
    otbuild's own, no field of Recipe) moved under `added`, each validated by its stage's model."""
    if isinstance(data, dict) and "added" in data:
        raise ConfigError(
            f"{file_for(('added',), origin, path)}: added: not a recipe key: an added stage's "
            "section is written at the top level, under the stage's name"
        )
    keys = added_sections() if isinstance(data, dict) else {}
    sections = {k: v for k, v in data.items() if k in keys and k not in Recipe.model_fields}
    added = {}
    for key, value in sections.items():
        try:
            added[key] = keys[key].model_validate(value or {})
        except ValidationError as e:
            raise ConfigError(
                "\n".join(format_error({**err, "loc": (key, *err["loc"])}, origin, path) for err in e.errors())
            ) from None
    return {**{k: v for k, v in data.items() if k not in sections}, **({"added": added} if added else {})}
