"""Every content id of every recipe in recipes/ stays what it was (tests/data/plan_ids.json):
a refactor that changes one moves artifacts users already built. A change of a stage's
semantics bumps its version (otbuild/stages/__init__.py) and regenerates the file:
`OTBUILD_UPDATE_PLAN_IDS=1 pytest tests/test_plan_ids.py`.

Ids of data that is not there yet name its absolute path: they are compared with the
checkout's path replaced by `<repo>` (and ids naming other ids, the report's, with those
recomputed), so the file holds for any clone."""

import json
import os

import pytest

from otbuild.hashing import settings_hash
from otbuild.plan import plan_recipe
from otbuild.recipe.load import load_recipe
from otbuild.stages import STAGES
from tests.conftest import REPO

SNAPSHOT = REPO / "tests" / "data" / "plan_ids.json"
RECIPES = sorted(p.stem for p in (REPO / "recipes").glob("*.yaml"))


def portable_ids(name: str) -> dict[str, dict]:
    """label -> {stage, id, identity}, ids recomputed with the checkout's path as `<repo>`."""
    ids: dict[str, str] = {}  # raw id -> portable id
    out = {}
    for node in plan_recipe(load_recipe(name, REPO)).nodes:
        text = json.dumps(node.identity).replace(str(REPO), "<repo>")
        for raw, portable in ids.items():  # the report's settings name every node's id and dir
            text = text.replace(raw, portable)
        ident = json.loads(text)
        ids[node.id] = settings_hash({"stage": node.stage, "version": STAGES[node.stage].version,
                                      "settings": ident, "inputs": [ids[i.id] for i in node.inputs]})
        out[node.label] = {"stage": node.stage, "id": ids[node.id], "identity": ident}
    return out


def test_snapshot_covers_every_recipe():
    if os.environ.get("OTBUILD_UPDATE_PLAN_IDS"):
        SNAPSHOT.write_text(json.dumps({r: portable_ids(r) for r in RECIPES}, indent=1, sort_keys=True) + "\n")
    assert sorted(json.loads(SNAPSHOT.read_text())) == RECIPES


@pytest.mark.parametrize("recipe", RECIPES)
def test_ids_unchanged(recipe):
    want = json.loads(SNAPSHOT.read_text())[recipe]
    got = portable_ids(recipe)
    assert sorted(got) == sorted(want), "the recipe plans other artifacts"
    changed = {label: {"was": want[label]["identity"], "now": got[label]["identity"]}
               for label in got if got[label]["id"] != want[label]["id"]}
    assert not changed, f"content ids changed: {json.dumps(changed, indent=1)[:3000]}"
