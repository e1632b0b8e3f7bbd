"""Content-addressed ids: stable, edits move exactly the edited stage and its dependants."""

import pytest

from otbuild.errors import ConfigError
from otbuild.plan import plan_recipe
from otbuild.recipe.load import load_recipe
from tests.conftest import DATA

RECIPE = """
sources:
  a: {kind: synthetic, rank: 1, count: 10, seed: 1}
  b: {kind: synthetic, rank: 2, count: 10, seed: 2}
  c: {kind: synthetic, rank: 3, count: 10, seed: 3}
mix: {n: 2, total: 10}
task_filter: {dedup: true}
"""


def ids(tmp_path, text, name="r"):
    (tmp_path / "recipes").mkdir(exist_ok=True)
    (tmp_path / "recipes" / f"{name}.yaml").write_text(text)
    plan = plan_recipe(load_recipe(name, tmp_path))
    return {n.label: n.id for n in plan.nodes if n.stage != "report"}  # the report names its recipe


def test_same_recipe_same_ids_and_top_n_only(tmp_path):
    first = ids(tmp_path, RECIPE)
    assert first == ids(tmp_path, RECIPE, name="copy")  # the recipe's name is not part of ids
    assert set(first) == {"sources/a", "sources/b", "mix", "task_filter"}  # c is outside the top 2


def test_edit_moves_the_stage_and_downstream_only(tmp_path):
    before = ids(tmp_path, RECIPE)
    after = ids(tmp_path, RECIPE.replace("dedup: true", "dedup: false"))
    assert [k for k in before if before[k] != after[k]] == ["task_filter"]
    after = ids(tmp_path, RECIPE.replace("total: 10", "total: 12"))
    assert [k for k in before if before[k] != after[k]] == ["mix", "task_filter"]
    after = ids(tmp_path, RECIPE.replace("seed: 2", "seed: 20"))
    assert [k for k in before if before[k] != after[k]] == ["sources/b", "mix", "task_filter"]


def test_rank_is_a_mix_setting_not_a_source_setting(tmp_path):
    before = ids(tmp_path, RECIPE)
    swapped = ids(tmp_path, RECIPE.replace("rank: 1", "rank: 9").replace("rank: 3", "rank: 1"))
    assert swapped["sources/c"] == ids(tmp_path, RECIPE.replace("mix: {n: 2", "mix: {n: 3"))["sources/c"]
    assert swapped["sources/b"] == before["sources/b"]
    assert swapped["mix"] != before["mix"]


def test_path_sources_are_addressed_by_content(tmp_path):
    src = tmp_path / "tasks"
    (src / "t1").mkdir(parents=True)
    (src / "t1" / "instruction.md").write_text("do it")
    recipe = f"sources:\n  h: {{kind: harbor-dir, rank: 1, path: {src}}}\n"
    first = ids(tmp_path, recipe)
    moved = tmp_path / "moved"
    src.rename(moved)
    assert ids(tmp_path, recipe.replace(str(src), str(moved))) == first  # where it lies: irrelevant
    (moved / "t1" / "instruction.md").write_text("do it twice")
    assert ids(tmp_path, recipe.replace(str(src), str(moved))) != first  # what it holds: relevant


def test_missing_data_still_plans(tmp_path):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "r.yaml").write_text(
        "sources:\n  h: {kind: harbor-parquet, rank: 1, path: data/none.parquet}\n")
    plan = plan_recipe(load_recipe("r", tmp_path))
    assert [str(p) for _, p in plan.missing] == [str(tmp_path / "data" / "none.parquet")]


@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data/dev is not present")
def test_real_data_ids_are_stable(tmp_path):
    path = DATA / "terminal_bench_tasks" / "harbor_format" / "tb2_ot_fewshots"
    recipe = f"sources:\n  h: {{kind: harbor-dir, rank: 1, path: {path}}}\n"
    assert ids(tmp_path, recipe) == ids(tmp_path, recipe)


def test_augment_sits_between_its_sources_and_the_mix(tmp_path):
    llm = "{engine: openai, base_url: 'http://127.0.0.1:1/v1', model: m"
    plain = ids(tmp_path, RECIPE)
    aug = ids(tmp_path, RECIPE + f"augment: {llm}, sources: [b], k: 3}}\n")
    assert set(aug) == set(plain) | {"augment/b"}
    assert aug["sources/a"] == plain["sources/a"] and aug["sources/b"] == plain["sources/b"]
    assert aug["mix"] != plain["mix"]
    (tmp_path / "recipes" / "r.yaml").write_text(RECIPE + f"augment: {llm}, concurrency: 64, sources: [b], k: 3}}\n")
    assert ids(tmp_path, (tmp_path / "recipes" / "r.yaml").read_text()) == aug  # an execution knob


def test_unknown_augment_source_is_a_config_error(tmp_path):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "r.yaml").write_text(
        RECIPE + "augment: {engine: openai, base_url: 'http://x/v1', model: m, sources: [bb]}\n")
    with pytest.raises(ConfigError, match="augment.sources: no source.s. bb; did you mean 'b'"):
        load_recipe("r", tmp_path)


STUDENT = """
sources:
  a: {kind: synthetic, rank: 1, count: 4, seed: 1}
teacher: {engine: oracle}
trace_filter: {min_turns: 0}
sft: {model: {kind: tiny}}
eval: {benchmarks: {held: {kind: synthetic, count: 2, seed: 9}}}
"""


def test_harness_settings_reach_the_stages_that_render_turns(tmp_path):
    """harness.prompt goes to the rollouts, SFT and eval (not the task or trace stages);
    constrained decoding to the eval's engine; left at their defaults they change no id."""
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "base.yaml").write_text(STUDENT)
    (tmp_path / "recipes" / "same.yaml").write_text(STUDENT + "harness: {prompt: terminus2}\n")
    (tmp_path / "recipes" / "tiny.yaml").write_text(
        STUDENT + "harness: {prompt: compact, constrained_decoding: true}\n")
    base, same, tiny = (plan_recipe(load_recipe(n, tmp_path)) for n in ("base", "same", "tiny"))
    assert [n.id for n in base.nodes[:-1]] == [n.id for n in same.nodes[:-1]]
    by_label = {n.label: n for n in tiny.nodes}
    assert {n.label for n in tiny.nodes if n.settings.get("prompt") == "compact"} == {"teacher", "sft", "eval"}
    assert by_label["eval"].settings["extra_body"]["guided_regex"].startswith("[ \\n]{0,8}\\{")
    moved = {n.label for n, m in zip(base.nodes, tiny.nodes) if n.id != m.id}
    assert moved == {"teacher", "trace_filter", "sft", "eval", "report"}
