"""One definition per setting: what a stage and its workers receive is the recipe section's
model (otbuild/settings/stages.py), its defaults the schema's, whatever path the settings take
(plan -> spec JSON -> runner -> training worker)."""

import ast
import importlib
import json
import typing

import pytest
from pydantic import BaseModel

from otbuild.plan import plan_recipe
from otbuild.recipe.load import load_recipe
from otbuild.settings.recipe import Harness
from otbuild.stages import STAGES
from otbuild.settings.base import EXTERNAL, PLAN_ONLY, fields_with
from tests.conftest import REPO

# Every stage, each section with only what it requires: all else is left to the schema.
BARE = """
sources:
  a: {kind: synthetic, rank: 1, count: 2}
mix: {n: 1, total: 2}
near_dedup: {}
task_check: {}
difficulty: {engine: oracle}
augment: {engine: openai, base_url: 'http://127.0.0.1:1/v1', model: m}
task_filter:
  llm: {engine: openai, base_url: 'http://127.0.0.1:1/v1', model: m, kind: askllm}
skills: {engine: openai, base_url: 'http://127.0.0.1:1/v1', model: m}
teacher: {engine: oracle}
trace_imports:
  chats: {kind: messages-jsonl, path: chats.jsonl}
trace_filter: {}
sft: {model: {kind: tiny}}
rl: {steps: 1}
eval:
  benchmarks:
    b: {kind: synthetic, count: 1}
search:
  - {mix.total: [2, 3]}
"""
# What the plan sets itself, not from the section: fields it reads itself (`plan_only`: a
# source's rank, augment's `sources`, task_filter's `llm`) or resolves (`external`: files);
# eval's model is the checkpoint it serves; the searched setting (a rank stage needs candidates).
NOT_PASSED = {"eval": {"model"}, "mix": {"total"}}
SETTINGS = {name: d.settings for name, d in STAGES.items()}


def bare_plan(tmp_path):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "bare.yaml").write_text(BARE)
    loaded = load_recipe("bare", tmp_path)
    return loaded.recipe, plan_recipe(loaded)


def sections(recipe, stage: str) -> list[BaseModel]:
    """The recipe sections a stage's settings come from."""
    return {
        "source": [recipe.sources["a"], recipe.eval.benchmarks["b"]],
        "mix": [recipe.mix],
        "augment": [recipe.augment],
        "near_dedup": [recipe.near_dedup],
        "task_check": [recipe.task_check],
        "difficulty": [recipe.difficulty],
        "task_score": [recipe.task_filter.llm],
        "skills": [recipe.skills],
        "task_filter": [recipe.task_filter],
        "trace_import": [recipe.trace_imports["chats"]],
        "rollout": [recipe.teacher],
        "trace_filter": [recipe.trace_filter],
        "sft": [recipe.sft],
        "rl": [recipe.rl],
        "eval": [recipe.eval],
        "decide": [recipe.decision],
    }.get(stage, [])


def test_every_stage_declares_its_settings_model():
    """The registry's model of each stage's settings (a model, or a discriminated union of
    them) is the one its `run` (and, sharded, its `run_shard`) takes as `cfg`; each is marked
    @stage_run (@stage_run_shard), so the type checker verifies the rest of its signature."""
    for name, d in STAGES.items():
        union = typing.get_origin(d.settings) is typing.Annotated
        members = typing.get_args(typing.get_args(d.settings)[0]) if union else (d.settings,)
        assert all(isinstance(m, type) and issubclass(m, BaseModel) for m in members), name
        module = importlib.import_module(d.module)
        assert hasattr(module, "run_shard") == d.sharded, name
        for fn in ("run", "run_shard") if d.sharded else ("run",):
            assert getattr(getattr(module, fn), "stage_entry", None) == fn, f"{d.module}.{fn}: not marked @stage_{fn}"
            cfg = typing.get_type_hints(getattr(module, fn), include_extras=True).get("cfg")
            assert cfg == d.settings, (
                f"{d.module}.{fn} takes cfg: {cfg}, the registry's {name} settings are {d.settings}"
            )


def test_a_recipe_that_sets_nothing_gives_every_stage_the_schema_defaults(tmp_path):
    """Each stage's typed settings, as its job gets them from the spec's JSON, hold the value
    of every field of its recipe section: a default restated anywhere on the way shows here."""
    recipe, plan = bare_plan(tmp_path)
    assert {n.stage for n in plan.nodes} == set(STAGES)
    compared = 0
    for node in plan.nodes:
        cfg = STAGES[node.stage].config(json.loads(json.dumps(node.spec()))["settings"])  # what the job validates
        assert cfg == node.config
        for section in sections(recipe, node.stage):
            if node.stage == "source" and section.count != cfg.count:
                continue  # the other source
            planned = fields_with(type(section), PLAN_ONLY, EXTERNAL) | NOT_PASSED.get(node.stage, set())
            for name in type(section).model_fields.keys() - planned:
                if node.stage == "eval" and name not in type(cfg).model_fields:
                    continue  # the eval's own: benchmarks, repeats, rank_by, ...
                assert getattr(cfg, name) == getattr(section, name), f"{node.stage}.{name}"
                mine, theirs = type(cfg).model_fields[name], type(section).model_fields[name]
                if not theirs.is_required():  # the stage's model declares the section's default
                    assert mine.get_default(call_default_factory=True) == theirs.get_default(
                        call_default_factory=True
                    ), f"{node.stage}.{name}"
                compared += 1
        if "prompt" in type(cfg).model_fields:
            assert cfg.prompt == Harness().prompt
    assert compared > 250


def test_the_training_workers_read_back_what_the_stage_wrote(tmp_path):
    """The JSON a launched rank reads (`python -m otbuild.train sft --settings @FILE`)."""
    _, plan = bare_plan(tmp_path)
    for node in plan.nodes:
        if node.stage in ("sft", "rl"):
            assert STAGES[node.stage].config(json.loads(node.config.model_dump_json())) == node.config


def test_rl_trials_are_the_teachers_fields(tmp_path):
    """rl.sandbox declares no field of its own: the same trial fields, with limits."""
    recipe, _ = bare_plan(tmp_path)
    from otbuild.settings.trials import Trials

    assert set(type(recipe.rl.sandbox).model_fields) == set(Trials.model_fields)
    assert set(Trials.model_fields) <= set(type(recipe.teacher).model_fields) & set(type(recipe.eval).model_fields)


# Receivers whose `.get(NAME, default)` or `getattr(x, NAME, default)` would restate a default.
SETTINGS_NAMES = {"settings", "cfg", "section", "sb"}


def fields(model, seen=None):
    """(name, FieldInfo) of every field of `model` (a model or a discriminated union of them)
    and of the models its fields hold."""
    seen = seen if seen is not None else set()
    for m in typing.get_args(typing.get_args(model)[0]) if typing.get_origin(model) is typing.Annotated else [model]:
        if not (isinstance(m, type) and issubclass(m, BaseModel)) or m in seen:
            continue
        seen.add(m)
        for name, info in m.model_fields.items():
            yield name, info
            for arg in (info.annotation, *typing.get_args(info.annotation)):
                if isinstance(arg, type) and issubclass(arg, BaseModel):
                    yield from fields(arg, seen)


def field_names(model) -> set[str]:
    return {name for name, _ in fields(model)}


def restated_defaults(paths, names: set[str]) -> list[str]:
    found = []
    for path in paths:
        for call in (n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)):
            f, args = call.func, call.args
            if isinstance(f, ast.Attribute) and f.attr == "get" and len(args) == 2:
                receiver, key = f.value, args[0]
            elif isinstance(f, ast.Name) and f.id == "getattr" and len(args) == 3:
                receiver, key = args[0], args[1]
            else:
                continue
            if (
                isinstance(receiver, ast.Name)
                and receiver.id in SETTINGS_NAMES
                and isinstance(key, ast.Constant)
                and key.value in names
            ):
                found.append(f"{path}:{call.lineno}: {ast.unparse(call)}")
    return found


NAMES = set().union(*(field_names(m) for m in SETTINGS.values()))
# Every default a setting of that name has (settings of several sections share a name).
DEFAULTS: dict[str, list] = {}
for _model in SETTINGS.values():
    for _name, _info in fields(_model):
        if not _info.is_required():
            DEFAULTS.setdefault(_name, []).append(_info.get_default(call_default_factory=True))


@pytest.mark.parametrize("where", ["stages", "train", "sources", "harness", "engines", "sandbox"])
def test_no_code_restates_a_settings_default(where):
    """No `settings.get("epochs", 1.0)` and no `getattr(cfg, "epochs", 1.0)`: a setting's default
    lives in its model only."""
    found = restated_defaults(sorted((REPO / "otbuild" / where).rglob("*.py")), NAMES)
    assert not found, "\n".join(found)


def test_the_checker_finds_a_restated_default(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('def f(settings, cfg):\n    return settings.get("epochs", 1.0), getattr(cfg, "adam_eps", 1e-8)\n')
    assert len(restated_defaults([bad], NAMES)) == 2


def restated_keyword_defaults(paths, defaults: dict[str, list]) -> list[str]:
    """Parameters named like a setting whose keyword default is that setting's default (the
    adapter's `def read(path, verifier=True)`): the adapter gets the setting from its section."""
    found = []
    for path in paths:
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                continue
            a = fn.args
            positional = [*a.posonlyargs, *a.args]
            pairs = [
                *zip(positional[len(positional) - len(a.defaults) :], a.defaults),
                *((arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None),
            ]
            for arg, node in pairs:
                try:
                    value = ast.literal_eval(node)
                except ValueError:
                    continue  # not a constant: no restated value
                if any(type(value) is type(d) and value == d for d in defaults.get(arg.arg, [])):
                    found.append(
                        f"{path}:{node.lineno}: {getattr(fn, 'name', 'lambda')}({arg.arg}={ast.unparse(node)})"
                    )
    return found


@pytest.mark.parametrize("where", ["sources", "traces/imports", "stages"])
def test_no_adapter_or_stage_restates_a_settings_default_as_a_keyword_default(where):
    """No `def read(path, verifier=True)` fed a section's dump: the adapters, importers and
    stages take their typed settings, whose model holds each default once."""
    found = restated_keyword_defaults(sorted((REPO / "otbuild" / where).rglob("*.py")), DEFAULTS)
    assert not found, "\n".join(found)


def test_the_checker_finds_a_restated_keyword_default(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "def read(path, verifier=True, *, episodes='last', site=None, count=3):\n    pass\n"
        "def ok(path, verifier=1, episodes='all', columns=None, agent=AGENT):\n    pass\n"
    )
    assert [f.split(": ", 1)[1] for f in restated_keyword_defaults([bad], DEFAULTS)] == [
        "read(verifier=True)",
        "read(episodes='last')",
        "read(site=None)",
    ]
