"""Recipes: extends + deep merge, strict schema, errors that name file, key, found, expected."""

import pytest

from otbuild.errors import ConfigError
from otbuild.recipe.load import load_recipe
from tests.conftest import REPO

BASE = """
sources:
  a: {kind: synthetic, rank: 1, count: 10, seed: 1}
  b: {kind: synthetic, rank: 2, count: 10, seed: 2, families: [text]}
mix: {n: 2, total: 10}
task_filter: {dedup: true, sample: {n: 5}}
"""


@pytest.fixture
def recipes(tmp_path):
    d = tmp_path / "recipes"
    d.mkdir()
    (d / "base.yaml").write_text(BASE)
    return d


def _write(recipes, name, text):
    (recipes / f"{name}.yaml").write_text(text)
    return recipes.parent


def _error(root, name) -> str:
    with pytest.raises(ConfigError) as e:
        load_recipe(name, root)
    return str(e.value)


def test_extends_deep_merges_and_null_deletes(recipes):
    root = _write(recipes, "child", "extends: base\nsources:\n  b: {count: 99}\nmix: {order: round_robin}\ntask_filter: null\n")
    r = load_recipe("child", root).recipe
    assert r.sources["b"].count == 99 and r.sources["b"].families == ["text"]  # merged, not replaced
    assert r.mix.order == "round_robin" and r.mix.total == 10
    assert r.task_filter is None


def test_unknown_key_did_you_mean_names_the_file_that_set_it(recipes):
    root = _write(recipes, "child", "extends: base\nmix: {ordr: shuffle}\n")
    msg = _error(root, "child")
    assert "child.yaml: mix.ordr: unknown key; did you mean 'order'?" in msg
    assert "allowed keys: n, order, seed, total" in msg


def test_error_in_parent_names_the_parent(recipes):
    (recipes / "base.yaml").write_text(BASE.replace("total: 10", "total: -3"))
    root = _write(recipes, "child", "extends: base\n")
    msg = _error(root, "child")
    assert "base.yaml: mix.total:" in msg and "greater than or equal to 1" in msg and "found -3" in msg


def test_discriminated_sources_report_real_key_paths(recipes):
    root = _write(recipes, "bad", "sources:\n  a: {kind: synthetic, rank: 1, count: 1, famlies: [text]}\n"
                  "  c: {kind: harbor-dir, rank: 2}\n  d: {kind: nope, rank: 3}\n")
    msg = _error(root, "bad")
    assert "sources.a.famlies: unknown key; did you mean 'families'?" in msg
    assert "sources.c.path: required key is missing" in msg
    assert "sources.d" in msg and "'nope'" in msg


def test_all_errors_are_reported_at_once_and_types_are_named(recipes):
    root = _write(recipes, "bad", BASE.replace("n: 2,", "n: two,").replace("sample: {n: 5}", "sample: {n: 5, x: 1}"))
    msg = _error(root, "bad")
    assert "mix.n:" in msg and "'two'" in msg
    assert "task_filter.sample.x: unknown key" in msg


def test_cross_key_checks(recipes):
    root = _write(recipes, "bad", BASE.replace("n: 2,", "n: 3,"))
    assert "mix.n: found 3, expected at most the number of sources (2)" in _error(root, "bad")
    root = _write(recipes, "bad2", BASE.replace("sample: {n: 5}", "include_regex: '(['"))
    assert "task_filter.include_regex: not a valid regular expression" in _error(root, "bad2")


def test_unbuilt_stage_and_yaml_and_cycles(recipes):
    root = _write(recipes, "later", BASE + "sfft: {lr: 4.0e-5}\n")
    assert "later.yaml: sfft: unknown key; did you mean 'sft'?" in _error(root, "later")
    root = _write(recipes, "broken", "sources: [a\n")
    assert "broken.yaml: line" in _error(root, "broken")
    _write(recipes, "x", "extends: y\n")
    _write(recipes, "y", "extends: x\n")
    assert "extends: cycle" in _error(root, "x")
    assert "no such recipe" in _error(root, "base2") and "did you mean 'base'" in _error(root, "base2")


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "recipes").glob("*.yaml")))
def test_shipped_recipes_validate(name):
    load_recipe(name, REPO)
