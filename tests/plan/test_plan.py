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
        "sources:\n  h: {kind: harbor-parquet, rank: 1, path: data/none.parquet}\n"
    )
    plan = plan_recipe(load_recipe("r", tmp_path))
    (missing,) = plan.missing
    assert missing.what == str(tmp_path / "data" / "none.parquet") and missing.key == "sources.h.path"
    assert missing.file == tmp_path / "recipes" / "r.yaml" and missing.needed


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
        RECIPE + "augment: {engine: openai, base_url: 'http://x/v1', model: m, sources: [bb]}\n"
    )
    with pytest.raises(ConfigError, match="augment.sources: no source.s. bb; did you mean 'b'"):
        load_recipe("r", tmp_path)


# -- the id rule: execution-only fields never count; identity fields only when not default ----
FULL = (
    RECIPE
    + """
teacher: {engine: vllm, model: org/m, samples_per_task: 2}
trace_filter: {min_turns: 3}
sft: {model: {kind: tiny}, epochs: 2}
rl: {steps: 2, samples_per_task: 2}
eval: {benchmarks: {h: {kind: synthetic, count: 3, seed: 9}}, max_tokens: 64}
"""
)


def test_execution_only_settings_do_not_change_ids(tmp_path):
    """Shards, concurrency, client retries/timeouts, vLLM parallelism and checkpoint cadence
    change how a stage runs, not what it produces: GPU rollouts must not rerun for them."""
    before = ids(tmp_path, FULL)
    knobs = FULL.replace(
        "samples_per_task: 2}",
        "samples_per_task: 2, shards: 4, concurrency: 32, max_retries: 9, "
        "request_timeout_sec: 30, engine_args: {tensor_parallel_size: 8, port: 8001, "
        "gpu_memory_utilization: 0.8}}",
        1,
    )
    knobs = knobs.replace("epochs: 2}", "epochs: 2, save_steps: 7, launcher: torchrun, master_port: 29600}")
    knobs = knobs.replace("max_tokens: 64}", "max_tokens: 64, shards: 3, concurrency: 16}")
    assert knobs.count("shards") == 2 and "save_steps" in knobs
    assert ids(tmp_path, knobs) == before


def test_identity_settings_change_ids(tmp_path):
    before = ids(tmp_path, FULL)
    for edit in (
        "samples_per_task: 2}|samples_per_task: 2, max_episodes: 9}",
        "samples_per_task: 2}|samples_per_task: 2, engine_args: {reasoning_parser: glm45}}",
    ):
        old, new = edit.split("|")
        after = ids(tmp_path, FULL.replace(old, new, 1))
        assert after["teacher"] != before["teacher"] and after["mix"] == before["mix"]


def test_spelled_out_defaults_give_the_same_ids(tmp_path):
    defaults = FULL.replace("mix: {n: 2, total: 10}", "mix: {n: 2, total: 10, order: shuffle, seed: 0}")
    defaults = defaults.replace(
        "samples_per_task: 2}",
        "samples_per_task: 2, temperature: 0.7, "
        "engine_args: {max_model_len: null, enable_auto_tool_choice: false}, "
        "limits: {memory_mb: 4096}}",
        1,
    )
    defaults = defaults.replace("epochs: 2}", "epochs: 2, learning_rate: 4.0e-5, adam_betas: [0.9, 0.999]}")
    assert ids(tmp_path, defaults) == ids(tmp_path, FULL)


def test_a_new_defaulted_field_keeps_every_id():
    """What a schema change in a later release looks like: the same sections, one more field
    with a default. Ids of recipes that do not set it stay what they were."""
    from pydantic import Field

    from otbuild.settings.identity import identity
    from otbuild.settings.recipe import AgentModel
    from otbuild.settings.train import Sft
    from otbuild.stages.mix import Mix
    from otbuild.stages.trace_filter import TraceFilter

    cases = [
        (Mix, {"n": 2, "total": 10}),
        (AgentModel, {"engine": "vllm", "model": "m", "max_episodes": 9}),
        (TraceFilter, {"min_turns": 3}),
        (Sft, {"model": {"kind": "tiny"}, "epochs": 2}),
    ]
    for cls, data in cases:
        newer = type(
            f"Newer{cls.__name__}", (cls,), {"__annotations__": {"new_knob": int}, "new_knob": Field(default=3, ge=0)}
        )
        assert identity(newer(**data)) == identity(cls(**data)), cls.__name__
        assert identity(newer(**data, new_knob=4)) == {**identity(cls(**data)), "new_knob": 4}


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
        STUDENT + "harness: {prompt: compact, constrained_decoding: true}\n"
    )
    base, same, tiny = (plan_recipe(load_recipe(n, tmp_path)) for n in ("base", "same", "tiny"))
    assert [n.id for n in base.nodes[:-1]] == [n.id for n in same.nodes[:-1]]
    by_label = {n.label: n for n in tiny.nodes}
    assert {n.label for n in tiny.nodes if n.settings.get("prompt") == "compact"} == {"teacher", "sft", "eval"}
    assert by_label["eval"].settings["extra_body"]["structured_outputs"]["regex"].startswith("[ \\n]{0,8}\\{")
    moved = {n.label for n, m in zip(base.nodes, tiny.nodes) if n.id != m.id}
    assert moved == {"teacher", "trace_filter", "sft", "eval", "report"}


def test_a_recipe_that_cannot_be_planned_leaves_the_others_planned(tmp_path, monkeypatch, capsys):
    """The Snakefile's view: every valid recipe has its plan; each invalid one (a config error,
    bytes that are not text, even a bug while planning) is named, never raised."""
    from otbuild import workflow

    (tmp_path / "recipes").mkdir()
    good = "sources:\n  a: {kind: synthetic, rank: 1, count: 2}\n"
    for name, text in (("good", good), ("typo", good.replace("count", "cont")), ("bug", good)):
        (tmp_path / "recipes" / f"{name}.yaml").write_text(text)
    (tmp_path / "recipes" / "binary.yaml").write_bytes(b'description: "\xff"\n')
    real = workflow.plan_recipe
    monkeypatch.setattr(workflow, "plan_recipe", lambda r: real(r) if r.name != "bug" else 1 / 0)
    wf = workflow.Workflow.load_or_exit(tmp_path)
    assert set(wf.plans) == {"good"} and set(wf.broken) == {"typo", "binary", "bug"}
    assert "sources.a.cont: unknown key" in wf.broken["typo"]
    assert "binary.yaml: byte 14: not valid YAML (not UTF-8 text" in wf.broken["binary"]
    assert "bug.yaml: cannot be planned (ZeroDivisionError: division by zero; a bug in otbuild)" in wf.broken["bug"]
    assert "warning: recipes/typo.yaml is not valid, so target 'typo' cannot be built" in capsys.readouterr().err


def test_eval_base_plans_the_untrained_base_beside_the_student(tmp_path):
    """`eval.base`: the student's SFT node with max_steps 0 (same inputs: the same traces, so the
    same tokenizer) and an eval of it with the student's eval settings, each its own artifact;
    the student's nodes keep their ids, an ablation ranks the students, and a candidate whose
    student trains 0 steps is its own base (one node)."""
    from tests.conftest import REPO

    (tmp_path / "recipes").mkdir()
    smoke = (REPO / "recipes" / "smoke.yaml").read_text()
    assert "  base: true " in smoke
    (tmp_path / "recipes" / "smoke.yaml").write_text(smoke)
    (tmp_path / "recipes" / "without.yaml").write_text("extends: smoke\neval: {base: false}\n")
    plan = plan_recipe(load_recipe("smoke", tmp_path))
    node = {n.label: n for n in plan.nodes}
    without = {n.label: n.id for n in plan_recipe(load_recipe("without", tmp_path)).nodes if n.stage != "report"}
    assert {label: node[label].id for label in without} == without  # the student's ids do not move
    assert set(node) - set(without) == {"base/sft", "base/eval", "report"}
    base, sft = node["base/sft"], node["sft"]
    assert base.inputs == sft.inputs and base.config.max_steps == 0 and sft.config.max_steps == 1500
    assert base.config.model_dump(exclude={"max_steps"}) == sft.config.model_dump(exclude={"max_steps"})
    ev, base_ev = node["eval"].config.model_dump(), node["base/eval"].config.model_dump()
    assert base_ev.pop("model") == str(base.dir) and ev.pop("model") == str(node["rl"].dir)
    assert base_ev.pop("model_label") == f"auto:{base.dir}" and ev.pop("model_label") == f"auto:{node['rl'].dir}"
    assert base_ev == ev  # the same eval settings, decoding constraint included
    assert [i.label for i in node["base/eval"].inputs] == ["benchmarks/heldout", "base/sft"]

    (tmp_path / "recipes" / "thesis_smoke.yaml").write_text((REPO / "recipes" / "thesis_smoke.yaml").read_text())
    (tmp_path / "recipes" / "thesis.yaml").write_text("extends: thesis_smoke\neval: {base: true}\n")
    nodes = plan_recipe(load_recipe("thesis", tmp_path)).nodes
    by = {n.label: n for n in nodes}
    assert by["candidates/sft.max_steps=1500/base/sft"].id == by["candidates/sft.max_steps=0/sft"].id
    rank = next(n for n in nodes if n.stage == "rank")
    assert [i.label for i in rank.inputs] == ["candidates/sft.max_steps=0/eval", "candidates/sft.max_steps=1500/eval"]

    (tmp_path / "recipes" / "named.yaml").write_text(
        "extends: smoke\nharness: {constrained_decoding: false}\neval: {model: {engine: oracle}}\n"
    )
    with pytest.raises(ConfigError, match=r"eval.base: compares the recipe's own checkpoint with its untrained base"):
        load_recipe("named", tmp_path)
