"""Every content id of every recipe in recipes/ stays what it was (tests/data/plan_ids.json):
a refactor that changes one moves artifacts users already built. A change of a stage's
semantics bumps its version (otbuild/stages/__init__.py) and regenerates the file:
`OTBUILD_UPDATE_PLAN_IDS=1 pytest tests/plan/test_plan_ids.py`.

Ids of data that is not there yet name its absolute path: they are compared with the
checkout's path replaced by `<repo>` (and ids naming other ids, the report's, with those
recomputed), so the file holds for any clone.

The recipes under tests/data/plan_ids_extra/ (their snapshot beside them) cover what recipes/
does not: an eval of a named model, a served checkpoint under constrained decoding, tasks and
traces named by path (there or not), by Hub id and by Harbor's registry."""

import json
import os

import pytest

from otbuild.hashing import settings_hash
from otbuild.plan import plan_recipe
from otbuild.recipe.load import load_recipe
from otbuild.stages import STAGES
from tests.conftest import REPO

EXTRA = REPO / "tests" / "data" / "plan_ids_extra"
SNAPSHOTS = {REPO: REPO / "tests" / "data" / "plan_ids.json", EXTRA: EXTRA / "plan_ids.json"}
RECIPES = [(root, p.stem) for root in SNAPSHOTS for p in sorted((root / "recipes").glob("*.yaml"))]


def portable_ids(root, name: str) -> dict[str, dict]:
    """label -> {stage, id, identity}, ids recomputed with the checkout's path as `<repo>`."""
    ids: dict[str, str] = {}  # raw id -> portable id
    out = {}
    for node in plan_recipe(load_recipe(name, root)).nodes:
        text = json.dumps(node.identity).replace(str(REPO), "<repo>")
        for raw, portable in ids.items():  # the report's settings name every node's id and dir
            text = text.replace(raw, portable)
        ident = json.loads(text)
        ids[node.id] = settings_hash(
            {
                "stage": node.stage,
                "version": STAGES[node.stage].version,
                "settings": ident,
                "inputs": [ids[i.id] for i in node.inputs],
            }
        )
        out[node.label] = {"stage": node.stage, "id": ids[node.id], "identity": ident}
    return out


@pytest.mark.parametrize("root", list(SNAPSHOTS), ids=["recipes", "extra"])
def test_snapshot_covers_every_recipe(root):
    names = [name for r, name in RECIPES if r == root]
    if os.environ.get("OTBUILD_UPDATE_PLAN_IDS"):
        SNAPSHOTS[root].write_text(
            json.dumps({r: portable_ids(root, r) for r in names}, indent=1, sort_keys=True) + "\n"
        )
    assert sorted(json.loads(SNAPSHOTS[root].read_text())) == names


@pytest.mark.parametrize(("root", "recipe"), RECIPES, ids=[name for _, name in RECIPES])
def test_ids_unchanged(root, recipe):
    want = json.loads(SNAPSHOTS[root].read_text())[recipe]
    got = portable_ids(root, recipe)
    assert sorted(got) == sorted(want), "the recipe plans other artifacts"
    changed = {
        label: {"was": want[label]["identity"], "now": got[label]["identity"]}
        for label in got
        if got[label]["id"] != want[label]["id"]
    }
    assert not changed, f"content ids changed: {json.dumps(changed, indent=1)[:3000]}"
