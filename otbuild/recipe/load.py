"""Load a recipe: YAML, `extends:` chains (deep merge), schema validation, clear errors."""

from __future__ import annotations

import difflib
import math
import re
import stat
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from otbuild.engines.model_config import check_fits_model
from otbuild.errors import ConfigError
from otbuild.recipe.credentials import REMEDY, credentials
from otbuild.settings.added import added_sections
from otbuild.settings.base import RE2, field_extra
from otbuild.settings.engines import LLM, LaunchOptionsError, launch_options
from otbuild.settings.recipe import NAME_RE, AtPath, Eval, Recipe, Teacher
from otbuild.settings.train import Rl
from otbuild.settings.trials import HARBOR, ShardedTrials, harbor_agent, trials_of


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
        return _file_for(tuple(key.split(".")), self.origin, self.path)


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
        raise ConfigError(f"{path}: no such recipe" + _suggest(str(name_or_path), known, "recipes"))
    name = path.stem
    if not re.match(NAME_RE, name):
        raise ConfigError(f"{path}: recipe names must be identifiers ([A-Za-z_][A-Za-z0-9_]*), found {name!r}")
    data, origin = _load_chain(path, [])
    return LoadedRecipe(name, path, path.resolve().parent.parent, data, validate(data, origin, path), origin)


def validate(data: dict, origin: dict, path: Path, context: str = "") -> Recipe:
    """The schema, then the checks across keys; errors name the file that set each key."""
    try:
        _check_finite(data, origin, path, ())
        _check_credentials(data, origin, path)
        recipe = Recipe.model_validate(_with_added(data, origin, path))
        _check_regexes(recipe, origin, path, ())
        _check_semantics(recipe, origin, path)
    except ValidationError as e:
        raise ConfigError("\n".join(context + _format_error(err, origin, path) for err in e.errors())) from None
    except ConfigError as e:
        raise ConfigError(context + str(e)) from None
    return recipe


def _with_added(data: dict, origin: dict, path: Path) -> dict:
    """The document with the sections of stages added by installed packages (a StageDef outside
    otbuild's own, no field of Recipe) moved under `added`, each validated by its stage's model."""
    if isinstance(data, dict) and "added" in data:
        raise ConfigError(f"{_file_for(('added',), origin, path)}: added: not a recipe key: an added stage's "
                          "section is written at the top level, under the stage's name")
    keys = added_sections() if isinstance(data, dict) else {}
    sections = {k: v for k, v in data.items() if k in keys and k not in Recipe.model_fields}
    added = {}
    for key, value in sections.items():
        try:
            added[key] = keys[key].model_validate(value or {})
        except ValidationError as e:
            raise ConfigError("\n".join(_format_error({**err, "loc": (key, *err["loc"])}, origin, path)
                                        for err in e.errors())) from None
    return {**{k: v for k, v in data.items() if k not in sections}, **({"added": added} if added else {})}


def _check_finite(value, origin: dict, path: Path, loc: tuple) -> None:
    """NaN and infinity are config errors wherever they appear (YAML's .nan, .inf)."""
    if isinstance(value, float) and not math.isfinite(value):
        where = ".".join(str(p) for p in loc) or "(top level)"
        raise ConfigError(f"{_file_for(loc, origin, path)}: {where}: expected a finite number, found {value}")
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        _check_finite(item, origin, path, (*loc, key))


def _check_credentials(data, origin: dict, path: Path) -> None:
    """A credential written in the recipe is a config error naming its key (recipe/credentials.py)."""
    found = [f"{_file_for(loc, origin, path)}: {'.'.join(map(str, loc))}: {why}"
             for loc, why in credentials(data)]
    if found:
        raise ConfigError("\n".join(found) + f"\n{REMEDY}")


# -- extends + deep merge, remembering which file set each key ------------------------------
# A recipe is a few hundred values; aliases may not expand it beyond this (a YAML "billion
# laughs" would otherwise take gigabytes once hashed or written out), nor nest deeper than
# MAX_YAML_DEPTH (the parser recurses per level).
MAX_YAML_VALUES = 100_000
MAX_YAML_DEPTH = 100


class _RecipeLoader(yaml.SafeLoader):
    """safe_load that refuses a duplicate key (YAML keeps the last one silently), nesting
    deeper than MAX_YAML_DEPTH and aliases that are recursive or expand beyond MAX_YAML_VALUES."""

    depth = 0

    def compose_node(self, parent, index):
        if self.depth >= MAX_YAML_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"nested more than {MAX_YAML_DEPTH} levels deep", self.peek_event().start_mark)
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_document(self, node):
        _expanded_size(node, {}, set())
        return super().construct_document(node)

    def construct_mapping(self, node, deep=False):
        first: dict = {}
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key, line = self.construct_scalar(key_node), key_node.start_mark.line + 1
                if key in first:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r}, first set on line {first[key]}", key_node.start_mark)
                first[key] = line
        return super().construct_mapping(node, deep)


def _expanded_size(node: yaml.Node, sizes: dict, open_: set) -> int:
    """How many values `node` holds with every alias expanded."""
    if id(node) in sizes:
        return sizes[id(node)]
    if id(node) in open_:
        raise yaml.constructor.ConstructorError(None, None, "an alias refers to itself", node.start_mark)
    open_.add(id(node))
    kids = [x for kv in node.value for x in kv] if isinstance(node, yaml.MappingNode) else (
        node.value if isinstance(node, yaml.SequenceNode) else [])
    n = 1 + sum(_expanded_size(k, sizes, open_) for k in kids)
    open_.discard(id(node))
    if n > MAX_YAML_VALUES:
        raise yaml.constructor.ConstructorError(
            None, None, f"aliases expand to more than {MAX_YAML_VALUES} values", node.start_mark)
    sizes[id(node)] = n
    return n


def _read_yaml(path: Path) -> dict:
    try:
        doc = yaml.load(path.read_bytes(), Loader=_RecipeLoader)
    except yaml.reader.ReaderError as e:  # bytes that are not UTF-8 (or UTF-16) text
        raise ConfigError(f"{path}: byte {e.position}: not valid YAML (not UTF-8 text: {e.reason})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}:" if mark else ""
        raise ConfigError(f"{path}:{where} not valid YAML ({getattr(e, 'problem', e)})") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a mapping of settings at the top, found {type(doc).__name__}")
    return doc


def _load_chain(path: Path, seen: list[Path]) -> tuple[dict, dict]:
    if path.resolve() in seen:
        chain = " -> ".join(str(p) for p in [*seen, path.resolve()])
        raise ConfigError(f"{path}: extends: cycle ({chain})")
    doc = _read_yaml(path)
    parent_name = doc.pop("extends", None)
    if parent_name is None:
        base: dict = {}
        origin: dict = {}
    else:
        if not isinstance(parent_name, str):
            raise ConfigError(f"{path}: extends: expected a recipe name, found {parent_name!r}")
        parent = path.parent / f"{parent_name}.yaml"
        if not parent.is_file():
            known = sorted(q.stem for q in path.parent.glob("*.yaml"))
            raise ConfigError(f"{path}: extends: no recipe {parent_name!r}" + _suggest(parent_name, known, "recipes"))
        base, origin = _load_chain(parent, [*seen, path.resolve()])
    return _merge(base, doc, origin, path, ()), origin


def _merge(base: dict, over: dict, origin: dict, path: Path, prefix: tuple) -> dict:
    """Deep merge: mappings merge key by key, anything else replaces; `null` deletes a key."""
    out = dict(base)
    for key, value in over.items():
        loc = (*prefix, key)
        if value is None:
            out.pop(key, None)
            origin[loc] = path
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value, origin, path, loc)
        else:
            out[key] = value
            for k in [k for k in origin if k[: len(loc)] == loc]:
                del origin[k]
            origin[loc] = path
    return out


def _file_for(loc: tuple, origin: dict, default: Path) -> Path:
    for n in range(len(loc), 0, -1):
        if loc[:n] in origin:
            return origin[loc[:n]]
    return default


# -- error messages --------------------------------------------------------------------------
def _format_error(err: Mapping[str, Any], origin: dict, path: Path) -> str:
    model, loc, union = _walk(Recipe, err["loc"])
    if err["type"] == "union_tag_not_found":  # no `kind`: say which the section's keys point to
        return _describe(err, model, loc, origin, path) + _guess_kind(err.get("input"), union)
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, LaunchOptionsError):  # keys of an engine_args mapping, by its engine's options
        return _launch_errors(cause, loc, origin, path)
    return _describe(err, model, loc, origin, path)


def _launch_errors(error: LaunchOptionsError, loc: tuple, origin: dict, path: Path) -> str:
    return "\n".join(_describe(e, error.options, (*loc, *e["loc"]), origin, path) for e in error.errors)


def _describe(err: Mapping[str, Any], model: type[BaseModel] | None, loc: tuple, origin: dict, path: Path) -> str:
    """One error at `loc` (a key path in the recipe) of a key that `model` owns."""
    where = ".".join(str(p) for p in loc) or "(top level)"
    file = _file_for(loc, origin, path)
    kind, found = err["type"], err.get("input")
    if kind == "extra_forbidden":
        key = str(loc[-1])
        allowed = sorted(model.model_fields) if model else []
        return f"{file}: {where}: unknown key" + _suggest(key, allowed, "allowed keys")
    if kind == "missing":
        return f"{file}: {where}: required key is missing"
    if kind in ("union_tag_invalid", "union_tag_not_found"):  # the `kind` of a section with several kinds
        key = err["ctx"]["discriminator"].strip("'")
        tags = re.findall(r"'([^']*)'", (err.get("ctx") or {}).get("expected_tags", ""))
        file, where = _file_for((*loc, key), origin, path), f"{where}.{key}"
        if kind == "union_tag_not_found":
            return f"{file}: {where}: required key is missing"
        return f"{file}: {where}: unknown {key} {err['ctx']['tag']!r}" + _suggest(err["ctx"]["tag"], tags, f"{key}s")
    if kind == "literal_error" and isinstance(found, str):  # one of a few values: say which is close
        return f"{file}: {where}: unknown value {found!r}" + _suggest(
            found, re.findall(r"'([^']*)'", err["ctx"]["expected"]), "expected one of")
    msg = err["msg"].removeprefix("Value error, ")
    return f"{file}: {where}: {msg}; found {found!r}"


def _walk(model: type[BaseModel], raw_loc: tuple) -> tuple[type[BaseModel] | None, tuple, object]:
    """Follow a pydantic error location through the schema. Returns the model that owns the
    last key, the location without discriminator tags (which are not keys in the file) and the
    type found there."""
    t: object = model
    clean: list = []
    owner: type[BaseModel] | None = model
    for part in raw_loc:
        t = _unwrap(t)
        if isinstance(t, type) and issubclass(t, BaseModel):
            owner = t
            clean.append(part)
            field = t.model_fields.get(part)
            t = field.annotation if field else None
        elif typing.get_origin(t) is dict:
            clean.append(part)
            t = typing.get_args(t)[1]
        elif typing.get_origin(t) is list:
            clean.append(part)
            t = typing.get_args(t)[0]
        elif _is_union(t):  # discriminated union: `part` is the tag
            t = next((m for m in typing.get_args(t) if part in _kinds(m)), None)
        else:
            clean.append(part)
    return owner, tuple(clean), t


def _guess_kind(found, union) -> str:
    """For a section without `kind`: a key whose value is a kind (`type: synthetic`), else the
    one set of kinds whose keys hold all the section's keys; then every kind."""
    members = [m for m in typing.get_args(_unwrap(union)) if _kinds(m)]
    tags = [k for m in members for k in _kinds(m)]
    if not tags:
        return ""
    found = found if isinstance(found, dict) else {}
    named = [(k, v) for k, v in found.items() if isinstance(v, str) and v in tags]
    fit = [m for m in members if found and set(found) <= set(m.model_fields)]
    if named:
        hint = f"; did you mean `kind: {named[0][1]}` (found `{named[0][0]}: {named[0][1]}`)?"
    elif len(fit) == 1:
        hint = f"; its keys ({', '.join(found)}) fit kind {' or '.join(map(repr, _kinds(fit[0])))}"
    else:
        hint = ""
    return f"{hint} (kinds: {', '.join(tags)})"


def _unwrap(t):
    while typing.get_origin(t) is typing.Annotated:
        t = typing.get_args(t)[0]
    if _is_union(t):
        members = [a for a in typing.get_args(t) if a is not type(None)]
        if len(members) == 1:
            return _unwrap(members[0])
        return typing.Union[tuple(_unwrap(m) for m in members)]  # noqa: UP007 (built at run time)
    return t


def _is_union(t) -> bool:
    return typing.get_origin(t) in (typing.Union, types.UnionType)


def _kinds(model) -> tuple:
    field = getattr(model, "model_fields", {}).get("kind")
    return typing.get_args(field.annotation) if field else ()


def _suggest(word: str, choices: list[str], what: str) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{hint} ({what}: {', '.join(choices)})" if choices else hint


# -- checks across sections ----------------------------------------------------------------
# The rule: a settings model's validators check its own section (types, bounds, how its own
# fields go together: otbuild/settings/); what relates sections (one needs or names another)
# and what needs the world (files, a model's config, DuckDB's regex engine) is checked here,
# after validation, naming the file that set the key.
def _check_engine(llm: LLM, where: str, file: Path) -> None:
    """The engine's settings against its model (otbuild/settings/engines.py), before anything runs."""
    try:
        check_fits_model(llm)
    except ConfigError as e:
        raise ConfigError(f"{file}: {where}: {e}") from None


def _check_launch_options(engine: str, args: dict, loc: tuple, origin: dict, path: Path) -> None:
    """Launch options the schema keeps as a mapping beside the engine that reads them (eval's
    checkpoint server, RL's rollout server), checked by that engine's options."""
    try:
        launch_options(engine, args)
    except LaunchOptionsError as e:
        raise ConfigError(_launch_errors(e, loc, origin, path)) from None


def _check_regexes(value, origin: dict, path: Path, loc: tuple) -> None:
    """Every `re2` field (otbuild/settings/base.py) through DuckDB's regex engine, which runs them."""
    from otbuild.duck import regex_error

    if isinstance(value, BaseModel):
        for name, info in type(value).model_fields.items():
            v = getattr(value, name)
            if field_extra(info).get(RE2) and v is not None and (error := regex_error(v)):
                raise ConfigError(f"{_file_for((*loc, name), origin, path)}: {'.'.join(map(str, (*loc, name)))}: "
                                  f"not a valid regular expression for DuckDB (RE2 syntax: {error}); found {v!r}")
            _check_regexes(v, origin, path, (*loc, name))
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_regexes(v, origin, path, (*loc, k))
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _check_regexes(v, origin, path, (*loc, i))


def _check_inputs(recipe: Recipe, origin: dict, path: Path) -> None:
    """What the pipeline's shape does not say (the plan checks that: otbuild/stages/shape.py):
    RL's one task set, the task sets a decontamination names."""
    def fail(key: str, why: str):
        raise ConfigError(f"{_file_for(tuple(key.split('.')), origin, path)}: {key}: {why}")

    if recipe.rl and not (recipe.mix or recipe.task_filter) and len(recipe.sources) > 1:
        fail("rl", "draws its tasks from one task set: add `mix` or `task_filter`")
    if recipe.task_filter and recipe.task_filter.decontaminate:
        known = [*(recipe.eval.benchmarks if recipe.eval else {}), *recipe.sources]
        for name in recipe.task_filter.decontaminate.against:
            if name not in known:
                fail("task_filter.decontaminate.against", f"{name!r} is neither a benchmark in eval.benchmarks "
                     f"nor a source (known: {', '.join(known) or 'none'})")


def _check_semantics(recipe: Recipe, origin: dict, path: Path) -> None:
    _check_inputs(recipe, origin, path)
    llms = {"teacher": recipe.teacher, "augment": recipe.augment,
            "task_filter.llm": recipe.task_filter.llm if recipe.task_filter else None,
            "eval.model": recipe.eval.model if recipe.eval else None}
    for where, section in llms.items():
        if section is not None and section.engine != "oracle":
            _check_engine(section, where, _file_for(tuple(where.split(".")), origin, path))
    ev, base = recipe.eval, recipe.sft.model if recipe.sft else None
    if ev and ev.model is None:
        _check_launch_options(ev.serve_with, ev.engine_args, ("eval", "engine_args"), origin, path)
    if recipe.rl and recipe.rl.rollout in ("vllm", "auto"):
        _check_launch_options(recipe.rl.rollout, recipe.rl.vllm_args, ("rl", "vllm_args"), origin, path)
    if ev and ev.model is None and ev.serve_with in ("vllm", "auto") and base and base.kind == "pretrained":
        local = path.resolve().parent.parent / base.path  # the checkpoint keeps its base's config
        model = str(local) if local.exists() else base.path
        _check_engine(LLM(engine="vllm", model=model, engine_args=ev.engine_args),
                      "eval.engine_args", _file_for(("eval", "engine_args"), origin, path))
    unknown = sorted(set(recipe.augment.sources or []) - set(recipe.sources)) if recipe.augment else []
    if unknown:
        raise ConfigError(f"{_file_for(('augment', 'sources'), origin, path)}: augment.sources: "
                          f"no source(s) {', '.join(unknown)}"
                          + _suggest(unknown[0], sorted(recipe.sources), "sources"))
    if (size := math.prod(len(v) for v in recipe.ablate.values())) > recipe.max_candidates:
        axes = " x ".join(str(len(v)) for v in recipe.ablate.values())
        raise ConfigError(f"{_file_for(('ablate',), origin, path)}: ablate: the grid has {axes} = {size} "
                          f"candidates, expected at most max_candidates ({recipe.max_candidates}): shrink "
                          "the grid, or raise `max_candidates` if you mean it")
    _check_search(recipe, origin, path)
    if recipe.ablate and not recipe.eval:
        raise ConfigError(f"{_file_for(('ablate',), origin, path)}: ablate: candidates are ranked by their "
                          "eval scores: add an `eval` section")
    if recipe.eval and recipe.eval.model is None and not recipe.sft:
        raise ConfigError(f"{_file_for(('eval',), origin, path)}: eval.model: required key is missing "
                          "(the recipe trains no model: name an engine, e.g. {engine: oracle} for the ceiling)")
    if recipe.eval and recipe.eval.base and recipe.eval.model is not None:
        raise ConfigError(f"{_file_for(('eval', 'base'), origin, path)}: eval.base: compares the recipe's own "
                          "checkpoint with its untrained base; eval.model names another model: remove one")
    if recipe.harness.constrained_decoding and not (recipe.eval and recipe.eval.model is None):
        raise ConfigError(f"{_file_for(('harness', 'constrained_decoding'), origin, path)}: "
                          "harness.constrained_decoding: applies to the eval of the recipe's own checkpoint "
                          "(no eval.model); here it would constrain nothing: remove it")
    _check_sft_context(recipe, origin, path)
    _check_reward_known(recipe, origin, path)
    _check_one_harness(recipe, origin, path)
    _check_paths(recipe, origin, path)
    unranked = sorted(n for n, s in recipe.sources.items() if s.rank is None)
    if recipe.mix and unranked:
        raise ConfigError(f"{_file_for(('sources', unranked[0]), origin, path)}: sources.{unranked[0]}.rank: "
                          "required key is missing (mix picks the Top-N sources by rank)")
    if recipe.mix and recipe.mix.n > len(recipe.sources):
        file = _file_for(("mix", "n"), origin, path)
        raise ConfigError(
            f"{file}: mix.n: found {recipe.mix.n}, expected at most the number of sources ({len(recipe.sources)})"
        )


def _check_search(recipe: Recipe, origin: dict, path: Path) -> None:
    """A search is its own grid of grids: not beside `ablate`, ranked by an eval, each stage a
    grid of keys no other stage searches, within max_candidates."""
    if not recipe.search:
        return
    where = _file_for(("search",), origin, path)
    if recipe.ablate:
        raise ConfigError(f"{where}: search: a recipe has `ablate` or `search`, not both (a one-stage search is "
                          "an ablation): remove one")
    if not recipe.eval:
        raise ConfigError(f"{where}: search: each stage's candidates are ranked by their eval scores: add an "
                          "`eval` section")
    seen: dict[str, int] = {}
    for step, grid in enumerate(recipe.search, 1):
        if (size := math.prod(len(v) for v in grid.values())) > recipe.max_candidates:
            raise ConfigError(f"{where}: search[{step - 1}]: the grid has {size} candidates, expected at most "
                              f"max_candidates ({recipe.max_candidates})")
        for key in grid:
            if key in seen:
                raise ConfigError(f"{where}: search[{step - 1}].{key}: stage {seen[key]} already searches it "
                                  "(a stage's winner is fixed for the stages after it): search it once")
            seen[key] = step


def harness_prompt(section: Teacher | Eval | Rl, recipe: Recipe) -> str:
    """The prompt a section's trials show the model: Harbor's own agent (`harbor:terminus-2`,
    its text generated by Harbor at run time) or otbuild's harness (`otbuild:<harness.prompt>`)."""
    trials = trials_of(section)
    if trials.sandbox == HARBOR and isinstance(trials, ShardedTrials):  # rl's trials never run in Harbor
        return f"harbor:{harbor_agent(trials.harbor.agent, section.engine if isinstance(section, LLM) else None)}"
    return f"otbuild:{recipe.harness.prompt}"


def _check_one_harness(recipe: Recipe, origin: dict, path: Path) -> None:
    """The student is evaluated on the prompt its training traces (teacher rollouts, RL) show."""
    ev = recipe.eval
    if not ev or ev.model is not None or ev.allow_prompt_mismatch:
        return
    evaluated = harness_prompt(ev, recipe)
    for where, section in (("teacher", recipe.teacher), ("rl", recipe.rl)):
        trained = section and harness_prompt(section, recipe)
        if trained and trained != evaluated:
            raise ConfigError(
                f"{_file_for(('eval', 'sandbox'), origin, path)}: eval: the checkpoint is evaluated with the "
                f"{evaluated} prompt but {where} rollouts use {trained} (sandbox/harbor.agent/harness.prompt): "
                "use one harness end to end (Harbor's terminus-2 text: sandbox: harbor in both), or set "
                "eval.allow_prompt_mismatch: true")


def _check_sft_context(recipe: Recipe, origin: dict, path: Path) -> None:
    """Traces from a teacher with a longer context than SFT's cutoff get cut: the recipe must
    say how (right truncation loses the ending, where the task gets solved)."""
    sft, teacher = recipe.sft, recipe.teacher
    context = teacher.engine_args.get("max_model_len") if teacher else None
    if sft and isinstance(context, int) and context > sft.cutoff_len and "truncation" not in sft.model_fields_set:
        raise ConfigError(
            f"{_file_for(('sft',), origin, path)}: sft.truncation: required key is missing: the teacher runs "
            f"at {context} positions (teacher.engine_args.max_model_len) but sft.cutoff_len is {sft.cutoff_len}, "
            "so longer traces are cut; say how: `right` keeps each trace's first cutoff_len tokens (its ending, "
            "where the task gets solved, is lost), `drop` leaves the trace out (both counted in the provenance)")


def _check_reward_known(recipe: Recipe, origin: dict, path: Path) -> None:
    """A reward rule needs rewards: a teacher that skips the verifier leaves every trace's unknown."""
    teacher, rules = recipe.teacher, recipe.trace_filter
    if teacher and not teacher.verify and rules and rules.min_reward is not None:
        raise ConfigError(
            f"{_file_for(('trace_filter', 'min_reward'), origin, path)}: trace_filter.min_reward: keeps traces by "
            "their reward, but teacher.verify is false: no verifier runs, so no teacher trace has a reward and "
            "every one would be dropped; set teacher.verify: true, or remove trace_filter.min_reward")


def _check_paths(recipe: Recipe, origin: dict, path: Path) -> None:
    """A path that exists must be what its key reads (data still to come is fine)."""
    from otbuild.sources import files_problem, path_problem
    from otbuild.traces.imports import PATH_FORMS

    root = path.resolve().parent.parent
    checks: dict[tuple, tuple[Path, typing.Callable, str | None]] = {}  # key path -> (path, check, kind)
    groups = {"sources": recipe.sources, "eval.benchmarks": recipe.eval.benchmarks if recipe.eval else {}}
    for group, sources in groups.items():
        for name, src in sources.items():
            if src.kind == "harbor-dataset":
                checks[(*group.split("."), name, "registry")] = (root / src.registry, _registry_problem, src.kind)
            elif isinstance(src, AtPath):  # every kind but synthetic and hf-dataset
                checks[(*group.split("."), name, "path")] = (root / src.path, partial(path_problem, src.kind), src.kind)
    for name, imp in recipe.trace_imports.items():
        loc = ("trace_imports", name)
        if imp.kind == "hf-dataset":
            continue
        checks[(*loc, "path")] = (root / imp.path, partial(files_problem, forms=PATH_FORMS[imp.kind]), imp.kind)
        if imp.tasks:
            checks[(*loc, "tasks")] = (root / imp.tasks, partial(path_problem, "harbor-parquet"), None)
        for key in ("labels", "instances"):
            if getattr(imp, key, None):
                checks[(*loc, key)] = (root / getattr(imp, key), _json_file_problem, imp.kind)
    for loc, (file, check, kind) in checks.items():
        if problem := _special_file_problem(file) or check(file):
            raise ConfigError(f"{_file_for(loc, origin, path)}: {'.'.join(loc)}: {problem}"
                              + (f" (kind {kind!r})" if kind else ""))


def _special_file_problem(path: Path) -> str | None:
    """A path that cannot be resolved (a symlink loop), or that exists as something other than
    a file or a folder (a device, a FIFO, a socket: reading one never ends or yields nothing)."""
    try:
        path.resolve()
        mode = path.stat().st_mode if path.exists() else None
    except (OSError, RuntimeError) as e:
        return f"cannot resolve {path}: {e}"
    if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        return f"expected a file or a folder, found a special file (device, FIFO or socket): {path}"
    return None


def _registry_problem(path: Path) -> str | None:
    """Harbor's registry.json, or a folder holding it (as Harbor's --registry-path)."""
    if path.is_dir() and not (path / "registry.json").is_file():
        return f"expected Harbor's registry.json or a folder holding it, found none in {path}"
    return None


def _json_file_problem(path: Path) -> str | None:
    return f"expected a JSON/JSONL file, found the folder {path}" if path.is_dir() else None
