"""The recipe's schema: its keys that are no stage's section (`RecipeKeys`, otbuild/settings/recipe.py)
and each built-in stage's section, the key its StageDef declares (`recipe_field`), in pipeline
order. Unknown keys are errors (`extra="forbid"`); the loader (load.py) moves the sections of the
stages that installed packages add under `added`, each validated by its stage's settings model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import create_model

from otbuild.settings.recipe import RecipeKeys
from otbuild.stages import STAGES

if TYPE_CHECKING:

    class Recipe(RecipeKeys):
        def __getattr__(self, key: str) -> Any: ...  # a stage's section: its StageDef's recipe_field

else:
    Recipe = create_model(
        "Recipe",
        __base__=RecipeKeys,
        __module__=__name__,
        **{d.section or d.name: d.recipe_field for d in STAGES.values() if d.recipe_field},
    )
