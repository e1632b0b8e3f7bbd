"""Recipes: extends + deep merge, strict schema, errors that name file, key, found, expected."""

import os

import pytest

from otbuild.errors import ConfigError
from otbuild.plan import plan_recipe
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
    root = _write(
        recipes, "child", "extends: base\nsources:\n  b: {count: 99}\nmix: {order: round_robin}\ntask_filter: null\n"
    )
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
    root = _write(
        recipes,
        "bad",
        "sources:\n  a: {kind: synthetic, rank: 1, count: 1, famlies: [text]}\n"
        "  c: {kind: harbor-dir, rank: 2}\n  d: {kind: nope, rank: 3}\n",
    )
    msg = _error(root, "bad")
    assert "sources.a.famlies: unknown key; did you mean 'families'?" in msg
    assert "sources.c.path: required key is missing" in msg
    assert "sources.d" in msg and "'nope'" in msg


def test_a_section_without_kind_gets_the_kind_its_keys_point_to(recipes):
    root = _write(
        recipes,
        "bad",
        "sources:\n  a: {type: stackexchange, rank: 1, path: x.parquet}\n"
        "  b: {rank: 2, count: 3, families: [text]}\n  c: {rank: 3}\n",
    )
    msg = _error(root, "bad")
    assert (
        "sources.a.kind: required key is missing; did you mean `kind: stackexchange` (found `type: stackexchange`)?"
        in msg
    )
    assert "sources.b.kind: required key is missing; its keys (rank, count, families) fit kind 'synthetic'" in msg
    assert "sources.c.kind: required key is missing (kinds: synthetic, harbor-dir," in msg  # rank fits every kind


def test_a_wrong_value_is_blamed_on_the_file_that_set_it_with_did_you_mean(recipes):
    """Issue 26.2: a child of `base` that sets an enumerated value wrongly: the child is named
    (not the parent that set the rest of the section), with the close value, and no dump of
    the merged section."""
    root = _write(recipes, "child", "extends: base\nsources:\n  a: {kind: harbor_dir}\n")
    msg = _error(root, "child")
    assert msg.startswith(
        f"{recipes}/child.yaml: sources.a.kind: unknown kind 'harbor_dir'; did you mean "
        "'harbor-dir'? (kinds: synthetic, harbor-dir,"
    ), msg
    assert "count" not in msg and "{" not in msg
    cases = {
        "teacher: {engine: olacle}": "teacher.engine: unknown value 'olacle'; did you mean 'oracle'?",
        "teacher: {engine: oracle, sandbox: bwarp}": "teacher.sandbox: unknown value 'bwarp'; did you mean 'bwrap'?",
        "sft: {model: {kind: tiny, chat_template: qwen_thinking}}": "sft.model.chat_template: unknown value 'qwen_thinking'; did you mean 'qwen3_thinking'?",
        "mix: {order: shufle}": "mix.order: unknown value 'shufle'; did you mean 'shuffle'? "
        "(expected one of: shuffle, round_robin)",
    }
    for body, said in cases.items():
        root = _write(recipes, "child", f"extends: base\n{body}\n")
        assert f"child.yaml: {said}" in _error(root, "child")


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


def test_regexes_are_checked_by_duckdb_re2(recipes):
    """Python's `re` accepts lookarounds; DuckDB (RE2), which runs the filter, does not."""
    root = _write(recipes, "look", BASE.replace("sample: {n: 5}", "include_regex: 'foo(?=bar)'"))
    msg = _error(root, "look")
    assert "task_filter.include_regex: not a valid regular expression for DuckDB" in msg and "(?=" in msg
    root = _write(recipes, "ok", BASE.replace("sample: {n: 5}", r"exclude_regex: '\bsudo\s+rm\b'"))
    assert load_recipe("ok", root).recipe.task_filter.exclude_regex == r"\bsudo\s+rm\b"


def test_duplicate_keys_are_refused_with_both_lines(recipes):
    root = _write(
        recipes, "dup", BASE + "teacher: {engine: oracle}\ntrace_filter: {}\nteacher: {engine: oracle, shards: 4}\n"
    )
    assert "dup.yaml: line 9, column 1: not valid YAML (duplicate key 'teacher', first set on line 7)" in _error(
        root, "dup"
    )
    root = _write(recipes, "dup2", BASE.replace("count: 10, seed: 1}", "count: 10, seed: 1, count: 3}"))
    assert "duplicate key 'count', first set on line 3" in _error(root, "dup2")
    root = _write(recipes, "merge", BASE + "x: &t {engine: oracle}\n".replace("x", "teacher") + "trace_filter: {}\n")
    assert load_recipe("merge", root).recipe.teacher.engine == "oracle"  # anchors alone are fine


def test_alias_bombs_and_absurd_sizes_are_refused(recipes):
    levels = ["&a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 6):  # 10^6 values once expanded, from a few hundred bytes
        levels.append(f"&a{i} [{', '.join([f'*a{i - 1}'] * 10)}]")
    bomb = "".join(f"  l{i}: {lv}\n" for i, lv in enumerate(levels))
    root = _write(
        recipes,
        "bomb",
        BASE
        + "teacher:\n  engine: vllm\n  model: m\n  engine_args:\n    extra_args:\n"
        + bomb.replace("  l", "      l")
        + "trace_filter: {}\n",
    )
    assert "not valid YAML (aliases expand to more than 100000 values)" in _error(root, "bomb")
    root = _write(recipes, "loop", "sources: &s\n  a: {kind: synthetic, count: 1}\n  b: *s\n")
    assert "an alias refers to itself" in _error(root, "loop")
    root = _write(
        recipes,
        "huge",
        BASE.replace("count: 10, seed: 1", "count: 100000000000000000000000, seed: 1").replace(
            "total: 10", "total: 1.0e+12"
        )
        + "teacher: {engine: oracle, shards: 1000000000000}\ntrace_filter: {}\n",
    )
    msg = _error(root, "huge")
    assert "sources.a.count: Input should be less than or equal to 10000000" in msg
    assert "teacher.shards: Input should be less than or equal to 10000" in msg
    assert "mix.total: Input should be less than or equal to 10000000" in msg


def test_source_paths_that_cannot_be_read_are_config_errors(recipes, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "not_a_dir.txt").write_text("x")
    root = _write(recipes, "swe", f"sources:\n  swe: {{kind: swe-instances, path: {tmp_path}/empty}}\n")
    assert (
        "swe.yaml: sources.swe.path: expected a .jsonl/.ndjson/.json file or a folder of them, "
        f"found none in {tmp_path}/empty"
    ) in _error(root, "swe")
    root = _write(recipes, "hd", "sources:\n  h: {kind: harbor-dir, path: not_a_dir.txt}\n")
    assert (
        f"hd.yaml: sources.h.path: expected a folder of task dirs, found the file {tmp_path}/not_a_dir.txt"
        in _error(root, "hd")
    )
    root = _write(
        recipes,
        "bm",
        BASE + f"eval:\n  model: {{engine: oracle}}\n  benchmarks:\n    b: {{kind: tb1-dir, path: {tmp_path}/empty}}\n",
    )
    assert "eval.benchmarks.b.path: expected a folder of task dirs, found none in" in _error(root, "bm")
    (tmp_path / "labels").mkdir()
    root = _write(
        recipes,
        "imp",
        f"trace_imports:\n  m: {{kind: mini-swe-agent, path: {tmp_path}/empty}}\n"
        "  s: {kind: swe-agent, path: not_a_dir.txt, labels: labels}\n",
    )
    msg = _error(root, "imp")
    assert (
        f"imp.yaml: trace_imports.m.path: expected a .traj.json file or a folder of them, found none in {tmp_path}/empty"
        in msg
    )
    root = _write(recipes, "imp2", "trace_imports:\n  s: {kind: swe-agent, path: not_a_dir.txt, labels: labels}\n")
    assert f"trace_imports.s.labels: expected a JSON/JSONL file, found the folder {tmp_path}/labels" in _error(
        root, "imp2"
    )
    root = _write(recipes, "later", "sources:\n  h: {kind: harbor-dir, path: data/not/there/yet}\n")
    assert load_recipe("later", root).recipe.sources["h"].path  # data may arrive before the build


def _plan_error(root, name) -> str:
    with pytest.raises(ConfigError) as e:
        plan_recipe(load_recipe(name, root))
    return str(e.value)


def test_the_pipeline_shape_names_what_is_missing_or_unused(recipes, tmp_path):
    """From the stages' declared inputs (otbuild/plan/shape.py): the first stage whose input no
    earlier section brings, data brought that no stage uses, a recipe with nothing to start from."""
    imports = "trace_imports:\n  m: {kind: messages-jsonl, path: chats.jsonl}\ntrace_filter: {}\n"
    root = _write(recipes, "unused", BASE + imports)
    assert (
        "unused.yaml: sources: no stage uses these tasks (the recipe ends in traces): add `teacher` or `rl`, "
        "or remove `sources`"
    ) in _plan_error(root, "unused")
    root = _write(recipes, "imports_only", imports)
    assert [n.stage for n in plan_recipe(load_recipe("imports_only", root)).nodes] == [
        "trace_import",
        "trace_filter",
        "report",
    ]
    root = _write(recipes, "nothing", "description: empty\n")
    assert "nothing.yaml: nothing to build from: add `sources` (tasks) or `trace_imports` (traces)" in _plan_error(
        root, "nothing"
    )
    root = _write(recipes, "no_traces", BASE + "sft: {model: {kind: tiny}}\n")
    assert ("no_traces.yaml: sft: needs traces: add `trace_imports` or `teacher`") in _plan_error(root, "no_traces")
    root = _write(recipes, "no_sft", BASE + "rl: {steps: 1}\n")
    assert "no_sft.yaml: rl: needs checkpoint: add `sft`" in _plan_error(root, "no_sft")
    root = _write(recipes, "no_tasks", imports + "teacher: {engine: oracle}\n")
    assert "no_tasks.yaml: teacher: needs tasks: add `sources`" in _plan_error(root, "no_tasks")


def test_constrained_decoding_that_would_constrain_nothing_is_an_error(recipes):
    """It applies to the served checkpoint's eval: with an explicit eval.model, or no eval, it
    would silently do nothing."""
    harness = "harness: {constrained_decoding: true}\n"
    root = _write(
        recipes,
        "explicit",
        BASE + harness + "eval:\n  model: {engine: oracle}\n  benchmarks: {h: {kind: synthetic, count: 2}}\n",
    )
    assert "explicit.yaml: harness.constrained_decoding: applies to the eval of the recipe's own" in _error(
        root, "explicit"
    )
    root = _write(recipes, "noeval", BASE + harness)
    assert "noeval.yaml: harness.constrained_decoding" in _error(root, "noeval")


def test_engine_args_are_checked_by_their_engines_launch_options(recipes):
    """Each key of teacher.engine_args (and eval's, rl's vllm_args) is named when its engine
    does not take it or its value does not fit, with what it takes."""
    root = _write(
        recipes,
        "typo",
        BASE + "teacher: {engine: vllm, model: m, engine_args: {tensor_parallel_sze: 2}}\ntrace_filter: {}\n",
    )
    assert (
        "typo.yaml: teacher.engine_args.tensor_parallel_sze: unknown key; did you mean 'tensor_parallel_size'? "
        "(allowed keys: data_parallel_size, "
    ) in _error(root, "typo")
    root = _write(
        recipes,
        "kind",
        BASE + "teacher: {engine: vllm, model: m, engine_args: {tensor_parallel_size: two}}\ntrace_filter: {}\n",
    )
    assert "kind.yaml: teacher.engine_args.tensor_parallel_size: Input should be a valid integer" in _error(
        root, "kind"
    )
    root = _write(
        recipes,
        "api",
        BASE + "teacher: {engine: openai, base_url: 'http://h/v1', model: m, "
        "engine_args: {max_retries: 2}}\ntrace_filter: {}\n",
    )
    assert "api.yaml: teacher.engine_args: engine 'openai' starts no server" in _error(root, "api")
    root = _write(
        recipes,
        "served",
        BASE + "teacher: {engine: oracle}\ntrace_filter: {}\nsft: {model: {kind: tiny}}\n"
        "rl: {steps: 1, rollout: vllm, vllm_args: {port: x}}\neval:\n  benchmarks: {b: {kind: synthetic, "
        "count: 1}}\n  serve_with: vllm\n  engine_args: {max_model_lenn: 9}\n",
    )
    assert "served.yaml: eval.engine_args.max_model_lenn: unknown key; did you mean 'max_model_len'?" in _error(
        root, "served"
    )
    _write(recipes, "served", (recipes / "served.yaml").read_text().replace("lenn", "len"))
    assert "served.yaml: rl.vllm_args.port: Input should be a valid integer" in _error(root, "served")


def test_teacher_ablation_gives_each_candidate_its_own_engine_args(recipes):
    """A teacher.model grid over an AWQ base passed `--quantization awq` to every model."""
    from otbuild.engines.vllm import vllm_command
    from otbuild.recipe.ablate import candidates

    commands = {}
    for name, cand in candidates(load_recipe("ablate_teacher", REPO)):
        commands[cand.recipe.teacher.model] = vllm_command(cand.recipe.teacher, 1)  # the typed section
    glm47, glm46, kimi = (commands[m] for m in ("QuantTrio/GLM-4.7-AWQ", "zai-org/GLM-4.6-FP8", "moonshotai/Kimi-K2.5"))
    assert glm47[glm47.index("--quantization") + 1] == "awq" and "--quantization" not in glm46 + kimi
    assert glm46[glm46.index("--reasoning-parser") + 1] == "glm45"
    assert kimi[kimi.index("--reasoning-parser") + 1] == "kimi_k2" and "--trust-remote-code" in kimi
    # the old grid is refused at validate time, naming the candidate and the mismatch
    (recipes / "parent.yaml").write_text(
        BASE + "teacher: {engine: vllm, model: QuantTrio/GLM-4.7-AWQ, "
        "engine_args: {quantization: awq}}\ntrace_filter: {}\n"
        "eval: {model: {engine: oracle}, benchmarks: {b: {kind: synthetic, count: 1}}}\n"
    )
    root = _write(
        recipes, "grid", "extends: parent\nablate:\n  teacher.model: [QuantTrio/GLM-4.7-AWQ, zai-org/GLM-4.6-FP8]\n"
    )
    with pytest.raises(ConfigError, match=r"candidate \[teacher.model=zai-org--GLM-4.6-FP8\].*teacher: .*saved as FP8"):
        plan_recipe(load_recipe("grid", root))


def test_eval_context_beyond_the_models_needs_rope_scaling(recipes, tmp_path):
    base = tmp_path / "qwen3"  # the SFT base: the checkpoint keeps its config
    base.mkdir()
    (base / "config.json").write_text('{"model_type": "qwen3", "max_position_embeddings": 40960}')
    recipe = (
        BASE + "teacher: {engine: oracle}\ntrace_filter: {}\nsft: {model: {kind: pretrained, path: qwen3}}\n"
        "eval:\n  benchmarks: {b: {kind: synthetic, count: 1}}\n  serve_with: vllm\n"
        "  engine_args: {max_model_len: 65536}\n"
    )
    root = _write(recipes, "long", recipe)
    assert "long.yaml: eval.engine_args: max_model_len 65536 exceeds" in _error(root, "long")
    yarn = "{max_model_len: 65536, hf_overrides: {rope_scaling: {rope_type: yarn, factor: 2.0}}}"
    root = _write(recipes, "yarn", recipe.replace("{max_model_len: 65536}", yarn))
    assert load_recipe("yarn", root).recipe.eval.engine_args["hf_overrides"]


EVAL = "eval: {model: {engine: oracle}, benchmarks: {b: {kind: synthetic, count: 1}}}\n"


def test_an_ablation_grid_is_bounded_before_any_candidate_is_made(recipes):
    axes = ", ".join(str(i) for i in range(1, 1001))
    root = _write(
        recipes, "huge", f"extends: base\n{EVAL}ablate:\n  mix.seed: [{axes}]\n  task_filter.sample.seed: [{axes}]\n"
    )
    msg = _error(root, "huge")  # 10^6 candidates: refused from the product of the axes
    assert (
        "huge.yaml: ablate: the grid has 1000 x 1000 = 1000000 candidates, expected at most "
        "max_candidates (1000)" in msg
    )
    grid = f"extends: base\n{EVAL}ablate:\n  mix.seed: [1, 2, 3]\n  mix.order: [shuffle, round_robin]\n"
    root = _write(recipes, "six", grid + "max_candidates: 5\n")
    assert "the grid has 3 x 2 = 6 candidates, expected at most max_candidates (5)" in _error(root, "six")
    _write(recipes, "six", grid + "max_candidates: 6\n")
    raised = plan_recipe(load_recipe("six", root))
    _write(recipes, "six", grid)
    assert [n.id for n in raised.nodes] == [n.id for n in plan_recipe(load_recipe("six", root)).nodes]


def test_deep_yaml_nesting_is_a_config_error_not_a_recursion_error(recipes):
    root = _write(recipes, "deep", BASE + "description: " + "[" * 20000 + "]" * 20000 + "\n")
    assert "deep.yaml: line 7, column 113: not valid YAML (nested more than 100 levels deep)" in _error(root, "deep")
    block = "".join("  " * i + f"k{i}:\n" for i in range(3000))
    root = _write(
        recipes,
        "deep2",
        BASE
        + "teacher:\n  engine: vllm\n  model: m\n  engine_args:\n"
        + block.replace("k", "    k")
        + "trace_filter: {}\n",
    )
    assert "not valid YAML (nested more than 100 levels deep)" in _error(root, "deep2")


def test_nan_and_infinity_are_config_errors_everywhere(recipes):
    root = _write(recipes, "nan", BASE + "teacher: {engine: oracle}\ntrace_filter: {min_reward: .nan}\n")
    assert "nan.yaml: trace_filter.min_reward: expected a finite number, found nan" in _error(root, "nan")
    root = _write(
        recipes, "inf", "extends: base\n" + EVAL.replace("count: 1}}", "count: 1}}, timeout_multiplier: .inf")
    )
    assert "inf.yaml: eval.timeout_multiplier: expected a finite number, found inf" in _error(root, "inf")
    root = _write(
        recipes, "args", BASE + "teacher: {engine: vllm, model: m, engine_args: {x: [1, -.Inf]}}\ntrace_filter: {}\n"
    )
    assert "args.yaml: teacher.engine_args.x.1: expected a finite number, found -inf" in _error(root, "args")
    root = _write(recipes, "grid", f"extends: base\n{EVAL}ablate:\n  task_filter.sample.n: [3, .nan]\n")
    assert "grid.yaml: ablate.task_filter.sample.n.1: expected a finite number, found nan" in _error(root, "grid")


def test_unreadable_source_paths_name_the_key(recipes, tmp_path):
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    root = _write(recipes, "loop", "sources:\n  h: {kind: harbor-parquet, path: loop1}\n")
    assert "loop.yaml: sources.h.path: cannot resolve" in _error(root, "loop")
    root = _write(recipes, "imp", "trace_imports:\n  t: {kind: messages-jsonl, path: loop1}\ntrace_filter: {}\n")
    assert "imp.yaml: trace_imports.t.path: cannot resolve" in _error(root, "imp")
    os.mkfifo(tmp_path / "fifo")
    for source in (
        "{kind: harbor-parquet, path: /dev/zero}",
        "{kind: harbor-dir, path: fifo}",
        "{kind: table, path: fifo, columns: {instruction: q}}",
    ):
        root = _write(recipes, "special", f"sources:\n  h: {source}\n")
        assert "special.yaml: sources.h.path: expected a file or a folder, found a special file" in _error(
            root, "special"
        )


def test_engine_urls_must_be_http(recipes):
    for url in ("file:///tmp/x", "localhost:8000/v1", "http://", "ftp://host/v1"):
        root = _write(
            recipes, "url", BASE + f"teacher: {{engine: openai, model: m, base_url: '{url}'}}\ntrace_filter: {{}}\n"
        )
        assert "url.yaml: teacher.base_url: expected an http(s) URL" in _error(root, "url"), url
    _write(
        recipes,
        "url",
        BASE + "teacher: {engine: openai, model: m, base_url: 'https://api.x.com/v1'}\ntrace_filter: {}\n",
    )
    assert load_recipe("url", root).recipe.teacher.base_url == "https://api.x.com/v1"


def test_eval_on_another_harness_prompt_than_the_rollouts_is_refused(recipes):
    """The 100K recipe's student trained on otbuild's terminus-2 text and was evaluated on
    Harbor's: validate refuses that unless eval.allow_prompt_mismatch says it is meant."""

    def recipe(teacher, ev, more=""):
        return (
            BASE + f"teacher: {{engine: openai, base_url: 'http://127.0.0.1:1/v1', model: m, sandbox: {teacher}}}\n"
            "sft: {model: {kind: pretrained, path: qwen3}}\n"
            + more
            + f"eval:\n  benchmarks: {{h: {{kind: synthetic, count: 2}}}}\n  sandbox: {ev}\n"
        )

    msg = _error(_write(recipes, "mixed", recipe("bwrap", "harbor")), "mixed")
    assert (
        "mixed.yaml: eval: the checkpoint is evaluated with the harbor:terminus-2 prompt but teacher "
        "rollouts use otbuild:terminus2"
        in msg
        and "eval.allow_prompt_mismatch: true" in msg
    )
    msg = _error(_write(recipes, "compact", recipe("harbor", "bwrap", "harness: {prompt: compact}\n")), "compact")
    assert "evaluated with the otbuild:compact prompt but teacher rollouts use harbor:terminus-2" in msg
    root = _write(recipes, "rl", recipe("harbor", "harbor", "rl: {steps: 1}\n"))
    assert "but rl rollouts use otbuild:terminus2" in _error(root, "rl")
    # one harness (Harbor's, or otbuild's in any local sandbox) validates; so does the switch,
    # which changes no content id
    _write(recipes, "local", recipe("bwrap", "podman"))
    _write(recipes, "one", recipe("harbor", "harbor"))
    _write(recipes, "allowed", recipe("harbor", "harbor") + "  allow_prompt_mismatch: true\n")
    _write(recipes, "mismatch", recipe("bwrap", "harbor") + "  allow_prompt_mismatch: true\n")
    ids = {
        name: {n.label: n.id for n in plan_recipe(load_recipe(name, root)).nodes if n.stage != "report"}
        for name in ("local", "one", "allowed", "mismatch")
    }  # (a report's id has the recipe's name)
    assert ids["one"] == ids["allowed"]


def test_paper_recipes_use_one_harness_end_to_end():
    from otbuild.recipe.checks import harness_prompt

    for name in ("otagent_v2_100k", "otagent_v2_10k"):
        r = load_recipe(name, REPO).recipe
        assert harness_prompt(r.teacher, r) == harness_prompt(r.eval, r) == "harbor:terminus-2", name


@pytest.mark.parametrize("name, traces", [("otagent_v2_100k", 100_000), ("otagent_v2_10k", 10_000)])
def test_paper_recipes_filter_traces_as_the_paper_did(name, traces):
    """The paper's final pipeline drops only traces under 5 turns and ends with its trace count
    after that filter: the budget counts kept traces, the filter caps exactly."""
    from otbuild.stages.task_filter import planned_rollouts

    r = load_recipe(name, REPO).recipe
    tf = r.trace_filter
    assert tf.min_turns == 5 and not (tf.drop_timed_out or tf.drop_subagent or tf.drop_exceptions)
    assert tf.sample.n == traces == r.task_filter.score.budget
    score = r.task_filter.score
    assert planned_rollouts(score) == traces  # until a pilot's keep rate is set
    assert planned_rollouts(score.model_copy(update={"keep_rate": 0.6})) == -(-traces * 10 // 6)
    assert r.task_filter.llm.shards > 1 and r.augment.shards > 1  # ~50K and ~21K requests resume


def test_a_teacher_context_longer_than_sft_cutoff_needs_an_explicit_truncation(recipes):
    """The teacher writes traces up to its context (64K) and SFT cuts at cutoff_len (32K): right
    truncation loses each long trace's ending, so validate asks the recipe to say it."""
    teacher = (
        "teacher: {engine: vllm, model: zai-org/GLM-4.7-AWQ, engine_args: {quantization: awq, max_model_len: 65536}}\n"
    )
    sft = "sft:\n  model: {kind: pretrained, path: Qwen/Qwen3-8B}\n"
    root = _write(recipes, "implicit", BASE + teacher + sft)
    msg = _error(root, "implicit")
    assert "implicit.yaml: sft.truncation: required key is missing: the teacher runs at 65536 positions" in msg
    assert "sft.cutoff_len is 32768" in msg and "`right`" in msg and "`drop`" in msg
    for policy in ("right", "drop"):
        root = _write(recipes, f"explicit_{policy}", BASE + teacher + sft + f"  truncation: {policy}\n")
        assert load_recipe(f"explicit_{policy}", root).recipe.sft.truncation == policy
    root = _write(recipes, "fits", BASE + teacher + sft + "  cutoff_len: 65536\n")  # nothing is cut
    assert load_recipe("fits", root).recipe.sft.cutoff_len == 65536
    for name in ("otagent_v2_100k", "otagent_v2_10k"):  # the paper's recipes say it
        assert load_recipe(name, REPO).recipe.sft.truncation == "right"


def test_a_reward_rule_over_an_unverified_teacher_is_refused(recipes):
    """teacher.verify: false leaves every teacher trace's reward unknown: a min_reward filter
    would drop them all, so validate refuses it (exit 2) naming both keys; without the rule
    the recipe is valid and its unverified traces pass drop_exceptions."""
    from tests.conftest import otbuild

    teacher = "teacher: {engine: oracle, verify: false}\n"
    root = _write(recipes, "unverified", BASE + teacher + "trace_filter: {min_reward: 1.0}\n")
    msg = _error(root, "unverified")
    assert "unverified.yaml: trace_filter.min_reward:" in msg and "teacher.verify is false" in msg
    res = otbuild(root, "validate", "unverified")
    assert res.returncode == 2 and "trace_filter.min_reward" in res.stderr + res.stdout
    root = _write(recipes, "unverified_ok", BASE + teacher + "trace_filter: {drop_exceptions: true}\n")
    assert load_recipe("unverified_ok", root).recipe.teacher.verify is False
