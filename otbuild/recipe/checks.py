"""The checks around a recipe's schema. The rule: a settings model's validators check its own
section (types, bounds, how its own fields go together: otbuild/settings/); what relates
sections (one needs or names another) and what needs the world (files, a model's config,
DuckDB's regex engine) is checked here, after validation, naming the file that set the key.
Before it, the document as read: no NaN or infinity, no credential."""

from __future__ import annotations

import math
import stat
import typing
from functools import partial
from pathlib import Path

from pydantic import BaseModel

from otbuild.engines import SERVERS, resolve_auto, tools_refusal
from otbuild.engines.model_config import check_fits_model
from otbuild.errors import ConfigError
from otbuild.recipe.credentials import REMEDY, credentials
from otbuild.recipe.messages import file_for, launch_errors, suggest
from otbuild.recipe.schema import Recipe
from otbuild.settings.base import RE2, field_extra
from otbuild.settings.engines import LLM, LaunchOptionsError, launch_options
from otbuild.settings.recipe import AgentModel, AtPath, Source
from otbuild.settings.train import Rl
from otbuild.settings.trials import HARBOR, ShardedTrials, harbor_agent, trials_of
from otbuild.stagekit import section_key, section_of
from otbuild.stages import STAGES
from otbuild.stages.eval import Eval


class Checker:
    """The checks of one recipe document. `origin` (key path -> file, from its `extends:`
    chain) and `path` (the recipe) say which file set a key: `where(loc)`."""

    def __init__(self, origin: dict, path: Path):
        self.origin, self.path = origin, path

    def where(self, loc: tuple) -> Path:
        """The file that set the key at `loc`: the recipe, or one it extends."""
        return file_for(loc, self.origin, self.path)

    def error(self, loc: tuple, text: str) -> ConfigError:
        """`FILE: KEY: TEXT` for the key at `loc`."""
        return ConfigError(f"{self.where(loc)}: {'.'.join(map(str, loc))}: {text}")

    # -- the document as read, before the schema ----------------------------------------------
    def finite(self, value, loc: tuple = ()) -> None:
        """NaN and infinity are config errors wherever they appear (YAML's .nan, .inf)."""
        if isinstance(value, float) and not math.isfinite(value):
            where = ".".join(str(p) for p in loc) or "(top level)"
            raise ConfigError(f"{self.where(loc)}: {where}: expected a finite number, found {value}")
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in items:
            self.finite(item, (*loc, key))

    def credentials(self, data) -> None:
        """A credential written in the recipe is a config error naming its key (recipe/credentials.py)."""
        found = [f"{self.where(loc)}: {'.'.join(map(str, loc))}: {why}" for loc, why in credentials(data)]
        if found:
            raise ConfigError("\n".join(found) + f"\n{REMEDY}")

    # -- the validated recipe -----------------------------------------------------------------
    def regexes(self, value, loc: tuple = ()) -> None:
        """Every `re2` field (otbuild/settings/base.py) through DuckDB's regex engine, which runs them."""
        from otbuild.duck import regex_error

        if isinstance(value, BaseModel):
            for name, info in type(value).model_fields.items():
                v = getattr(value, name)
                if field_extra(info).get(RE2) and v is not None and (error := regex_error(v)):
                    raise self.error(
                        (*loc, name), f"not a valid regular expression for DuckDB (RE2 syntax: {error}); found {v!r}"
                    )
                self.regexes(v, (*loc, name))
        elif isinstance(value, dict):
            for k, v in value.items():
                self.regexes(v, (*loc, k))
        elif isinstance(value, list | tuple):
            for i, v in enumerate(value):
                self.regexes(v, (*loc, i))

    def sections(self, recipe: Recipe) -> None:
        """What relates the recipe's sections, and what needs the world."""
        self._inputs(recipe)
        # every section that is a model's (a stage's: the teacher, augment, a task scorer, a pilot) and
        # the eval's model under test
        llms = {section_key(d): section_of(recipe, section_key(d)) for d in STAGES.values()}
        llms["eval.model"] = recipe.eval.model if recipe.eval else None
        for key, section in llms.items():
            if isinstance(section, LLM) and section.engine != "oracle":
                self._engine(section, key)
        ev, base = recipe.eval, recipe.sft.model if recipe.sft else None
        if ev and ev.model is None:
            self._launch_options(ev.serve_with, ev.engine_args, ("eval", "engine_args"))
        if recipe.rl and recipe.rl.rollout in ("vllm", "auto"):
            self._launch_options(recipe.rl.rollout, recipe.rl.vllm_args, ("rl", "vllm_args"))
        if ev and ev.model is None and ev.serve_with in ("vllm", "auto") and base and base.kind == "pretrained":
            local = self.path.resolve().parent.parent / base.path  # the checkpoint keeps its base's config
            model = str(local) if local.exists() else base.path
            self._engine(LLM(engine="vllm", model=model, engine_args=ev.engine_args), "eval.engine_args")
        unknown = sorted(set(recipe.augment.sources or []) - set(recipe.sources)) if recipe.augment else []
        if unknown:
            raise self.error(
                ("augment", "sources"),
                f"no source(s) {', '.join(unknown)}" + suggest(unknown[0], sorted(recipe.sources), "sources"),
            )
        if (size := math.prod(len(v) for v in recipe.ablate.values())) > recipe.max_candidates:
            axes = " x ".join(str(len(v)) for v in recipe.ablate.values())
            raise self.error(
                ("ablate",),
                f"the grid has {axes} = {size} candidates, expected at most "
                f"max_candidates ({recipe.max_candidates}): shrink the grid, or raise "
                "`max_candidates` if you mean it",
            )
        self._search(recipe)
        if recipe.ablate and not recipe.eval:
            raise self.error(("ablate",), "candidates are ranked by their eval scores: add an `eval` section")
        if recipe.eval and recipe.eval.model is None and not recipe.sft:
            raise ConfigError(
                f"{self.where(('eval',))}: eval.model: required key is missing (the recipe "
                "trains no model: name an engine, e.g. {engine: oracle} for the ceiling)"
            )
        if recipe.eval and recipe.eval.base and recipe.eval.model is not None:
            raise self.error(
                ("eval", "base"),
                "compares the recipe's own checkpoint with its untrained base; "
                "eval.model names another model: remove one",
            )
        if recipe.harness.constrained_decoding and not (recipe.eval and recipe.eval.model is None):
            raise self.error(
                ("harness", "constrained_decoding"),
                "applies to the eval of the recipe's own "
                "checkpoint (no eval.model); here it would constrain nothing: remove it",
            )
        self._sft_context(recipe)
        self._reward_known(recipe)
        self._tools_protocol(recipe)
        self._one_harness(recipe)
        self._paths(recipe)
        unranked = sorted(n for n, s in recipe.sources.items() if s.rank is None)
        if recipe.mix and unranked:
            raise ConfigError(
                f"{self.where(('sources', unranked[0]))}: sources.{unranked[0]}.rank: "
                "required key is missing (mix picks the Top-N sources by rank)"
            )
        if recipe.mix and recipe.mix.n > len(recipe.sources):
            raise self.error(
                ("mix", "n"), f"found {recipe.mix.n}, expected at most the number of sources ({len(recipe.sources)})"
            )

    def _inputs(self, recipe: Recipe) -> None:
        """What the pipeline's shape does not say (the plan checks that: otbuild/plan/shape.py):
        RL's one task set, the task sets a stage holds out (`StageDef.held_out`)."""
        if recipe.rl and not (recipe.mix or recipe.task_filter) and len(recipe.sources) > 1:
            raise self.error(("rl",), "draws its tasks from one task set: add `mix` or `task_filter`")
        known = [*(recipe.eval.benchmarks if recipe.eval else {}), *recipe.sources]
        for d in STAGES.values():
            if d.held_out and (section := section_of(recipe, section_key(d))) is not None:
                key = (*section_key(d).split("."), *d.held_out.split("."))
                self._held_out(key, d.held_out_names(section), known)

    def _held_out(self, key: tuple[str, ...], against: list[str], known: list[str]) -> None:
        """Each name a stage holds out is a benchmark in eval.benchmarks or a source."""
        for name in against:
            if name not in known:
                raise self.error(
                    key,
                    f"{name!r} is neither a "
                    f"benchmark in eval.benchmarks nor a source (known: {', '.join(known) or 'none'})",
                )

    def _engine(self, llm: LLM, key: str) -> None:
        """The engine's settings against its model (otbuild/settings/engines.py), before anything runs."""
        try:
            check_fits_model(llm)
        except ConfigError as e:
            raise self.error(tuple(key.split(".")), str(e)) from None

    def _launch_options(self, engine: str, args: dict, loc: tuple) -> None:
        """Launch options the schema keeps as a mapping beside the engine that reads them (eval's
        checkpoint server, RL's rollout server), checked by that engine's options."""
        try:
            launch_options(engine, args)
        except LaunchOptionsError as e:
            raise ConfigError(launch_errors(e, loc, self.origin, self.path)) from None

    def _search(self, recipe: Recipe) -> None:
        """A search is its own grid of grids: not beside `ablate`, ranked by an eval, each stage a
        grid of keys no other stage searches, within max_candidates."""
        if not recipe.search:
            return
        where = self.where(("search",))
        if recipe.ablate:
            raise ConfigError(
                f"{where}: search: a recipe has `ablate` or `search`, not both (a one-stage search "
                "is an ablation): remove one"
            )
        if not recipe.eval:
            raise ConfigError(
                f"{where}: search: each stage's candidates are ranked by their eval scores: add an `eval` section"
            )
        seen: dict[str, int] = {}
        for step, grid in enumerate(recipe.search, 1):
            if (size := math.prod(len(v) for v in grid.values())) > recipe.max_candidates:
                raise ConfigError(
                    f"{where}: search[{step - 1}]: the grid has {size} candidates, expected at "
                    f"most max_candidates ({recipe.max_candidates})"
                )
            for key in grid:
                if key in seen:
                    raise ConfigError(
                        f"{where}: search[{step - 1}].{key}: stage {seen[key]} already searches "
                        "it (a stage's winner is fixed for the stages after it): search it once"
                    )
                seen[key] = step

    def _one_harness(self, recipe: Recipe) -> None:
        """The student is evaluated on the prompt its training traces (teacher rollouts, RL) show."""
        ev = recipe.eval
        if not ev or ev.model is not None or ev.allow_prompt_mismatch:
            return
        evaluated = harness_prompt(ev, recipe)
        for key, section in (("teacher", recipe.teacher), ("rl", recipe.rl)):
            trained = section and harness_prompt(section, recipe)
            if trained and trained != evaluated:
                raise ConfigError(
                    f"{self.where(('eval', 'sandbox'))}: eval: the checkpoint is evaluated with the "
                    f"{evaluated} prompt but {key} rollouts use {trained} (sandbox/harbor.agent/harness.prompt): "
                    "use one harness end to end (Harbor's terminus-2 text: sandbox: harbor in both), or set "
                    "eval.allow_prompt_mismatch: true"
                )

    def _tools_protocol(self, recipe: Recipe) -> None:
        """harness.protocol: tools needs every model that runs otbuild's trials to answer tool
        calls (a vLLM with its tool call parser named), and texts of its own."""
        harness = recipe.harness
        if harness.protocol != "tools":
            return
        if harness.prompt != "terminus2":
            raise self.error(
                ("harness", "prompt"),
                f"{harness.prompt} is a style of terminus-2's JSON answers; the tools protocol has "
                "texts of its own: remove harness.prompt, or use harness.protocol: terminus2",
            )
        if harness.constrained_decoding:
            raise self.error(
                ("harness", "constrained_decoding"),
                "decodes terminus-2's JSON frame; the tools protocol answers with tool calls: remove it",
            )
        sections = {section_key(d): section_of(recipe, section_key(d)) for d in STAGES.values()}
        sections["eval.model"] = recipe.eval.model if recipe.eval else None
        trials: dict[str, LLM] = {
            k: s for k, s in sections.items() if isinstance(s, AgentModel) and trials_of(s).sandbox != HARBOR
        }
        ev = recipe.eval
        if ev and ev.model is None and trials_of(ev).sandbox != HARBOR:  # the checkpoint, served
            trials["eval"] = LLM(engine=ev.serve_with, model="checkpoint", engine_args=ev.engine_args)
        for key, llm in trials.items():
            if why := tools_refusal(llm):
                raise self.error((*key.split("."), "serve_with" if key == "eval" else "engine"), why)
            if resolve_auto(llm).engine in SERVERS and not llm.engine_args.get("tool_call_parser"):
                raise self.error(
                    (*key.split("."), "engine_args", "tool_call_parser"),
                    "required key is missing: a model server turns a model's text into tool calls with "
                    "the parser of its chat format (e.g. hermes for Qwen3, see `vllm serve --help`)",
                )

    def _sft_context(self, recipe: Recipe) -> None:
        """Traces from a teacher with a longer context than SFT's cutoff get cut: the recipe must
        say how (right truncation loses the ending, where the task gets solved)."""
        sft, teacher = recipe.sft, recipe.teacher
        context = teacher.engine_args.get("max_model_len") if teacher else None
        if sft and isinstance(context, int) and context > sft.cutoff_len and "truncation" not in sft.model_fields_set:
            raise ConfigError(
                f"{self.where(('sft',))}: sft.truncation: required key is missing: the teacher runs at "
                f"{context} positions (teacher.engine_args.max_model_len) but sft.cutoff_len is {sft.cutoff_len}, "
                "so longer traces are cut; say how: `right` keeps each trace's first cutoff_len tokens (its ending, "
                "where the task gets solved, is lost), `drop` leaves the trace out (both counted in the provenance)"
            )

    def _reward_known(self, recipe: Recipe) -> None:
        """A reward rule needs rewards: a teacher that skips the verifier leaves every trace's unknown."""
        teacher, rules = recipe.teacher, recipe.trace_filter
        if teacher and not teacher.verify and rules and rules.min_reward is not None:
            raise self.error(
                ("trace_filter", "min_reward"),
                "keeps traces by their reward, but teacher.verify is false: no "
                "verifier runs, so no teacher trace has a reward and every one would be dropped; set "
                "teacher.verify: true, or remove trace_filter.min_reward",
            )

    def _paths(self, recipe: Recipe) -> None:
        """A path that exists must be what its key reads (data still to come is fine)."""
        from otbuild.sources import files_problem, path_problem
        from otbuild.traces.imports import PATH_FORMS

        root = self.path.resolve().parent.parent
        checks: dict[tuple, tuple[Path, typing.Callable, str | None]] = {}  # key path -> (path, check, kind)
        groups: dict[str, dict[str, Source]] = {
            "sources": recipe.sources,
            "eval.benchmarks": recipe.eval.benchmarks if recipe.eval else {},
        }
        for group, sources in groups.items():
            for name, src in sources.items():
                if src.kind == "harbor-dataset":
                    checks[(*group.split("."), name, "registry")] = (root / src.registry, _registry_problem, src.kind)
                elif isinstance(src, AtPath):  # every kind but synthetic and hf-dataset
                    checks[(*group.split("."), name, "path")] = (
                        root / src.path,
                        partial(path_problem, src.kind),
                        src.kind,
                    )
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
                raise self.error(loc, problem + (f" (kind {kind!r})" if kind else ""))


def harness_prompt(section: AgentModel | Eval | Rl, recipe: Recipe) -> str:
    """The prompt a section's trials show the model: Harbor's own agent (`harbor:terminus-2`,
    its text generated by Harbor at run time) or otbuild's harness (`otbuild:<harness.prompt>`,
    `otbuild:tools` in the tools protocol)."""
    trials = trials_of(section)
    if trials.sandbox == HARBOR and isinstance(trials, ShardedTrials):  # rl's trials never run in Harbor
        return f"harbor:{harbor_agent(trials.harbor.agent, section.engine if isinstance(section, LLM) else None)}"
    harness = recipe.harness
    return f"otbuild:{harness.prompt if harness.protocol == 'terminus2' else harness.protocol}"


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
