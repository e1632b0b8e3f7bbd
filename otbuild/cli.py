"""The otbuild command line. Run from the project root (where recipes/ and profiles/ are).

Exit codes: 0 ok, 1 findings (audit) or a failed build/stage, 2 usage or config error.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape

import otbuild
from otbuild.errors import EXIT_FINDINGS, EXIT_USAGE, ConfigError, StageError
from otbuild.stages import STAGES
from otbuild.views import costs_tables, images_table, plan_table, versus_table

out = Console()
err = Console(stderr=True)


def _fit_width() -> None:
    """Each command's tables as wide as COLUMNS says, else the terminal; piped output (CI logs,
    files) gets 160 columns instead of rich's 80. Decided per command, not when the module was
    first imported (a process may run several, as tests do)."""
    out.width = err.width = shutil.get_terminal_size(fallback=(160, 24)).columns


class Group(click.Group):
    """Turns a ConfigError anywhere into its message on stderr and exit code 2 (a StageError:
    exit code 1)."""

    def invoke(self, ctx):
        _fit_width()
        try:
            return super().invoke(ctx)
        except (ConfigError, StageError) as e:
            err.print(f"[bold red]error:[/] {escape(str(e))}", markup=True, highlight=False, soft_wrap=True)
            ctx.exit(e.exit_code)


@click.group(cls=Group, epilog="Exit codes: 0 ok, 1 findings or a failed build, 2 usage or config error.")
@click.version_option(otbuild.__version__, prog_name="otbuild")
def main():
    """Declarative, content-addressed builds of agentic training data on Snakemake + DuckDB."""


def _plan(recipe: str):
    """RECIPE (a name under recipes/ or a path), planned. A file elsewhere whose stem names
    another recipe of the project is refused, as Snakemake could not tell their targets apart."""
    from otbuild.plan import plan_recipe
    from otbuild.recipe.load import load_recipe
    from otbuild.workflow import outside_recipe

    loaded = load_recipe(recipe, Path.cwd())
    outside_recipe(loaded, Path.cwd())
    return plan_recipe(loaded)


def _check_jobs(plan, profile: str | None) -> None:
    """Refuse a rollout or eval whose concurrent trials would not fit in its job's memory."""
    if not profile:
        return
    from otbuild.profiles import overcommit_problems

    where = next((d for d in (Path.cwd() / "profiles" / profile, Path(profile)) if (d / "config.yaml").is_file()), None)
    if where is None:
        raise ConfigError(f"--profile {profile}: no profiles/{profile}/config.yaml or {profile}/config.yaml")
    if problems := overcommit_problems(plan.nodes, where):
        raise ConfigError("\n".join(problems))


@main.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
def init(directory):
    """Make DIRECTORY an otbuild project that uses the installed workflow: a Snakefile that
    includes it, recipes/ (smoke and the paper's), profiles/default and profiles/slurm, a
    README. Never overwrites: if any of these files exists, nothing is written (exit 2)."""
    from otbuild.scaffold import init_project

    for path in init_project(directory):
        out.print(f"[green]wrote[/] {path}")
    out.print(f"next: cd {directory} && snakemake smoke")


@main.command()
@click.argument("recipes", nargs=-1, required=True)
@click.option(
    "--images",
    is_flag=True,
    help="Also list each distinct base image the recipes' tasks start "
    "FROM and whether podman has it here (exit 1 when one is missing).",
)
@click.option("--profile", help="Also check the recipe against this Snakemake profile's job sizes.")
def validate(recipes, images, profile):
    """Check RECIPES (names under recipes/ or paths) against the schema; write nothing. With
    --profile, also refuse rollouts whose concurrency x limits.memory_mb exceeds their job's mem_mb."""
    from otbuild.workflow import preflight

    missing_images = 0
    for r in recipes:
        plan = _plan(r)
        _check_jobs(plan, profile)
        out.print(f"[green]ok[/] {plan.recipe.path}: {len(plan.nodes)} stage(s)")
        for message, _ in preflight(plan):
            err.print(f"[yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True)
        if images:
            missing_images += images_table(plan, out)
    if missing_images:
        raise SystemExit(1)


@main.command()
@click.argument("recipe")
@click.option(
    "--estimate",
    is_flag=True,
    help="Estimate what building RECIPE will take, per stage and in "
    "total: counts, requests, tokens, cost, GPU-hours and wall time, each with a range; saved to "
    ".otbuild/estimates/RECIPE.json for the report (docs/estimate.md).",
)
@click.option(
    "--from",
    "pilots",
    multiple=True,
    metavar="PILOT",
    help="With --estimate: a built pilot recipe (a name, or a recipe file in another project's "
    "recipes/) whose artifacts give the rates; repeatable.",
)
@click.option(
    "--profile",
    help="With --estimate: the Snakemake profile whose resources, runtimes, retries "
    "and parallel jobs the estimate uses (default: a local run).",
)
@click.option("--json", "as_json", is_flag=True, help="With --estimate: print it as one JSON object.")
def plan(recipe, estimate, pilots, profile, as_json):
    """Show RECIPE's stages, their content ids and whether each is built; with --estimate, what
    building it will cost."""
    if (pilots or profile or as_json) and not estimate:
        raise ConfigError("--from, --profile and --json go with --estimate")
    p = _plan(recipe)
    if estimate:
        if p.search:  # every stage, as if each undecided one kept its default
            from otbuild.plan import plan_recipe

            p = plan_recipe(p.recipe, assume_defaults=True)
        _estimate(p, pilots, profile, as_json)
        return
    plan_table(p, out)
    if p.recipe.recipe.search:
        from otbuild.search import search_lines

        for line in search_lines(p):
            out.print(escape(line), highlight=False)


def _estimate(p, pilots: tuple[str, ...], profile: str | None, as_json: bool) -> None:
    """`plan --estimate`: calibrate from each pilot (planned in its own project), estimate, save, show."""
    import json

    from otbuild.estimate.pilot import calibrate
    from otbuild.estimate.profile import find_profile
    from otbuild.estimate.run import estimate
    from otbuild.plan import plan_recipe
    from otbuild.recipe.load import load_recipe, recipe_path
    from otbuild.report.estimate import save

    calibrated = []
    for name in pilots:
        path = recipe_path(name, Path.cwd()).resolve()
        root = path.parent.parent if path.parent.name == "recipes" else Path.cwd()
        calibrated.append(calibrate(plan_recipe(load_recipe(path, root)), root))
    if found := _built_probe(p, pilots):
        calibrated.append(found)
    result = estimate(p, calibrated, find_profile(profile, Path(".")))
    saved = save(result)
    if as_json:
        click.echo(json.dumps(result.json(), indent=1))
        return
    from otbuild.estimate.show import show

    show(result, out)
    out.print(f"[dim]saved to {saved}: the report of a build shows it beside what was measured[/]", highlight=False)


def _built_probe(p, pilots: tuple[str, ...]):
    """The recipe's probe (`otbuild probe`) as a pilot when it is built and not named already,
    said on stderr; None otherwise."""
    from otbuild.plan import plan_recipe
    from otbuild.probe import as_pilot, probe_name, probe_path
    from otbuild.recipe.load import load_recipe

    path = probe_path(p.recipe.name, Path.cwd())
    named = {Path(x).stem for x in pilots}
    if not path.is_file() or probe_name(p.recipe.name) in named:
        return None
    try:
        found = as_pilot(plan_recipe(load_recipe(path, Path.cwd())), Path.cwd())
    except ConfigError:  # not built (or no longer valid): the estimate goes on without it
        err.print(f"[dim]{path} is not built: its rates are not used (`otbuild probe {p.recipe.name}`)[/]")
        return None
    err.print(f"[dim]rates also from the built probe {path} (`otbuild probe {p.recipe.name}`)[/]", highlight=False)
    return found


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("recipe")
@click.option("--tasks", default=25, show_default=True, type=click.IntRange(1, 100_000), help="Tasks per source.")
@click.option("--seed", default=0, show_default=True, help="The sample's seed.")
@click.option("--profile", help="Snakemake profile (e.g. slurm); profiles/default always applies.")
@click.option("-n", "--dry-run", is_flag=True, help="Write the probe recipe and show its jobs without running them.")
@click.argument("snakemake_args", nargs=-1, type=click.UNPROCESSED)
def probe(recipe, tasks, seed, profile, dry_run, snakemake_args):
    """Each source's health before the run: build RECIPE_probe (recipes/RECIPE_probe.yaml,
    written from RECIPE: every source sampled to --tasks tasks, validated, piloted by the
    recipe's difficulty section or else its teacher), then print per source the valid share,
    the pilot's pass rate, bands, errors, turns and seconds per trial; written as
    results/RECIPE_probe/probe.json and probe.html. Exit 0 when built (a broken source is a
    finding, flagged), 1 when the build fails. Extra args go to snakemake."""
    from otbuild import probe as pr
    from otbuild.plan import plan_recipe
    from otbuild.recipe.load import load_recipe
    from otbuild.views import probe_table

    loaded = load_recipe(recipe, Path.cwd())
    path, pilot = pr.write_recipe(loaded, Path.cwd(), tasks, seed)
    p = plan_recipe(load_recipe(path, Path.cwd()))
    err.print(f"[dim]probe recipe {path}; pilot: {pilot or 'none (no teacher or difficulty section)'}[/]")
    _check_jobs(p, profile)
    code = _snakemake(p, profile, ["-n"] * dry_run + list(snakemake_args))
    if code or dry_run:
        sys.exit(code if code in (0, EXIT_USAGE) else EXIT_FINDINGS)
    summary = pr.summarize(p, Path.cwd(), pilot)
    probe_table(summary, out)
    written = pr.write(summary, Path.cwd())
    out.print(f"[dim]written: {', '.join(str(w) for w in written)}[/]", highlight=False)


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("recipe")
@click.option("--profile", help="Snakemake profile (e.g. slurm); profiles/default always applies.")
@click.option("-n", "--dry-run", is_flag=True, help="Show the jobs without running them.")
@click.argument("snakemake_args", nargs=-1, type=click.UNPROCESSED)
def build(recipe, profile, dry_run, snakemake_args):
    """Build RECIPE with Snakemake (validated first). Extra args go to snakemake. A project
    without a Snakefile gets the installed otbuild's workflow. Long jobs show their progress
    and the log to follow; a build ends with where the results and the report are, tasks and
    traces kept, pass@1 per benchmark, tokens, cost and time, and any degenerate result."""
    p = _plan(recipe)
    _check_jobs(p, profile)
    code = _snakemake(p, profile, ["-n"] * dry_run + list(snakemake_args))
    sys.exit(code if code in (0, EXIT_USAGE) else EXIT_FINDINGS)  # 2: the workflow refused the recipe


def _snakemake(plan, profile: str | None, args: list[str]) -> int:
    """`snakemake RECIPE` here, with the project's Snakefile, else the packaged workflow; a recipe
    file outside recipes/ is named in Snakemake's config."""
    from snakemake.common import SNAKEFILE_CHOICES

    from otbuild.workflow import RECIPE_KEY, SNAKEFILE, outside_recipe

    path = outside_recipe(plan.recipe, Path.cwd())
    if path is not None:
        pair = f"{RECIPE_KEY}={path}"
        flag = next((i for i, a in enumerate(args) if a in ("--config", "-C")), None)
        args = [*args[: flag + 1], pair, *args[flag + 1 :]] if flag is not None else [*args, "--config", pair]
    own = any(p.is_file() for p in SNAKEFILE_CHOICES) or {"-s", "--snakefile"} & set(args)
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        plan.recipe.name,
        *(["--profile", profile] if profile else []),
        *([] if own else ["--snakefile", str(SNAKEFILE)]),
        *args,
    ]
    err.print(f"[dim]$ {' '.join(cmd)}[/]")
    return subprocess.call(cmd, cwd=Path.cwd())


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("recipe")
@click.option("--profile", help="Snakemake profile for what still has to be built.")
@click.argument("snakemake_args", nargs=-1, type=click.UNPROCESSED)
def report(recipe, profile, snakemake_args):
    """Build RECIPE (what is missing) and its report: one self-contained HTML page and a
    dataset card, linked from results/RECIPE/report/."""
    p = _plan(recipe)
    code = _snakemake(p, profile, list(snakemake_args))
    if code:
        sys.exit(EXIT_FINDINGS)
    view = Path("results") / p.recipe.name / "report"
    out.print(f"[green]report[/] {view / 'report.html'}\n[green]card[/]   {view / 'dataset_card.md'}")


@main.command()
@click.argument("recipe")
def costs(recipe):
    """Tokens, cost, runtime and GPU-hours of RECIPE's built artifacts (nothing is built): the
    report's tables, from each artifact's record, the recipe's `prices` and the jobs' benchmarks;
    and, when `plan --estimate` was run before the build, its figures beside them."""
    from otbuild.report import costs as costs_mod
    from otbuild.report.data import artifacts

    report = _plan(recipe).nodes[-1].config  # the report's: every node, and the prices
    arts = artifacts(report.nodes)
    k = costs_mod.collect(arts, report.prices)
    costs_tables(recipe, k, out)
    versus_table(report.recipe, arts, k, out)


@main.command()
@click.argument("target")
@click.argument("artifacts", nargs=-1)
@click.option(
    "--verify",
    is_flag=True,
    help="Rehash every file from its bytes; without it, a file whose path, size, mtime, ctime "
    "and inode are unchanged keeps its cached sha256 (.otbuild/digests.json).",
)
@click.option(
    "--rebuild",
    is_flag=True,
    help="Rebuild the recipe's ARTIFACTS (labels, stages or ids; default: the cheap ones: table "
    "stages, the report, oracle trials) from their recorded inputs into .otbuild/rebuild/ and "
    "compare them with the build, volatile columns set aside; exit 1 on a difference.",
)
@click.option("--all", "everything", is_flag=True, help="With --rebuild: every artifact (training, LLM stages).")
@click.option("--keep", is_flag=True, help="With --rebuild: keep the rebuilds that matched too.")
def audit(target, artifacts, verify, rebuild, everything, keep):
    """Prove where artifacts came from. TARGET is a recipe (checks all of its artifacts) or an
    artifact dir/file (shows its full record). Exits 1 if any artifact drifted from its record,
    lacks one, or is not built; 2 if TARGET is neither a recipe nor a path inside an artifact.

    With --rebuild, prove that they can be made again: TARGET is a recipe, its ARTIFACTS (or the
    cheap ones) are rebuilt from their recorded inputs and compared file by file (parquet column
    by column, naming the first differing row); exits 1 on a difference (docs/reproducibility.md)."""
    from otbuild import audit as audit_mod

    if (artifacts or everything or keep) and not rebuild:
        raise ConfigError("ARTIFACTS, --all and --keep go with --rebuild")
    if rebuild:
        from otbuild.rebuild import rebuild_plan

        if everything and artifacts:
            raise ConfigError("--all or ARTIFACTS, not both")
        if "artifacts" in Path(target).parts or target.endswith((".parquet", ".json")):
            raise ConfigError(f"{target}: --rebuild takes a recipe (and the labels of its artifacts)")
        sys.exit(rebuild_plan(_plan(target), artifacts, out, everything, keep))

    try:
        path = Path(target).resolve()  # results/NAME/LABEL links into artifacts/
    except (OSError, RuntimeError) as e:
        raise ConfigError(f"{target}: cannot resolve the path ({e})") from None
    if "artifacts" in Path(target).parts or (path.exists() and "artifacts" in path.parts):  # not a recipe
        if not path.exists():
            raise ConfigError(f"{target}: no such file or folder")
        if (path if path.is_dir() else path.parent).parent.name not in STAGES:
            raise ConfigError(f"{target}: not inside an artifact dir (artifacts/<stage>/<id>/)")
        sys.exit(audit_mod.show_artifact(path, out, verify))
    sys.exit(audit_mod.audit_plan(_plan(target), out, verify))


@main.command()
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option("--row", type=int, help="Show row N (0-based) in full: fields, metadata, task files.")
@click.option("--limit", default=20, show_default=True, help="Rows in the preview table.")
@click.option("--columns", help="Comma-separated columns for the table (default: all but blobs).")
def show(path, row, limit, columns):
    """Preview a parquet artifact as a table, or one row in full. PATH may be an artifact's
    folder (results/NAME/LABEL) holding one parquet file; with several, they are listed."""
    from otbuild import show as show_mod

    if path.is_dir():
        path = show_mod.only_parquet(path)
    show_mod.show(path, out, row=row, limit=limit, columns=columns.split(",") if columns else None)


@main.command(context_settings={"ignore_unknown_options": True, "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def serve(args):
    """Serve a transformers model dir over an OpenAI-compatible chat API (`serve --help`)."""
    from otbuild.serve import main as serve_main

    sys.exit(serve_main(list(args)))


@main.command()
@click.option(
    "--containers",
    is_flag=True,
    help="Remove podman trial containers, and the working containers "
    "and intermediate images of image builds, whose build is no longer running (left by kill -9); "
    "those of live builds are kept.",
)
def clean(containers):
    """Remove what killed builds left behind."""
    if not containers:
        raise click.UsageError("say what to clean: --containers")
    from otbuild.sandbox.podman.container import remove_leaked_containers
    from otbuild.sandbox.podman.images import remove_leaked_builds

    out.print(f"removed {remove_leaked_containers()} trial container(s) of builds that are no longer running")
    out.print(
        f"removed {remove_leaked_builds()} image-build working container(s) of builds that are no longer "
        "running (and their intermediate images)"
    )


@main.group()
def images():
    """Container images for podman trials."""


@images.command("load")
@click.argument("folder", type=click.Path(exists=True, file_okay=False, path_type=Path))
def images_load(folder):
    """Import every image tarball in FOLDER (`podman save` / `docker save`: docker-archive or
    OCI) into podman's storage: base images for clusters that reach no registry."""
    from otbuild.sandbox.podman.cli import ContainerError
    from otbuild.sandbox.podman.images import load_images

    try:
        loaded = load_images(folder)
    except ContainerError as e:
        raise ConfigError(str(e)) from None
    for path, names in loaded:
        out.print(f"[green]loaded[/] {names} from {path.name}")
    if not loaded:
        raise ConfigError(f"{folder}: no image tarballs in it")


@main.group()
def ingest():
    """Bring results made elsewhere in as otbuild tables."""


@ingest.command("harbor-job")
@click.argument("job_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--out",
    "dest",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where to write the tables (default: JOB_DIR/otbuild).",
)
@click.option("--benchmark", help="Benchmark name for trials whose job does not name one.")
def ingest_harbor_job(job_dir, dest, benchmark):
    """Turn a Harbor job dir into the eval scores table (scores.parquet, summary.parquet)."""
    from otbuild import ingest as ingest_mod

    dest = dest or job_dir / "otbuild"
    try:
        counts = ingest_mod.harbor_job(job_dir, dest, benchmark)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    out.print(f"[green]wrote[/] {dest}/scores.parquet ({counts['scores']} trials) and summary.parquet")


@main.group()
def export():
    """Write artifacts out in other formats."""


@export.command("tasks")
@click.argument("parquet", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
def export_tasks_cmd(parquet, dest):
    """Write every task of PARQUET as a Harbor task dir under DEST/<path>/."""
    from otbuild.tasks.export import export_tasks
    from otbuild.tasks.redact import Redactor, describe

    redactor = Redactor()
    try:
        n = export_tasks(parquet, dest, redactor)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    out.print(f"[green]wrote[/] {n} task dir(s) to {dest} ({describe(redactor.found())})")


@export.command("rollout-details")
@click.argument("calls", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("dest", type=click.Path(dir_okay=False, path_type=Path))
def export_rollout_details_cmd(calls, dest):
    """Write CALLS (a calls.parquet) as Harbor's rollout details: one JSON line per trial in
    DEST, {"trial_name", "agent_result": Harbor's AgentContext with its rollout_details}."""
    import duckdb

    from otbuild.harbor.rollout_detail import write_rollout_details

    if dest.exists():
        raise ConfigError(f"{dest} exists: the export writes a new file, never over one")
    try:
        n = write_rollout_details(calls, dest)
    except duckdb.Error as e:
        raise ConfigError(f"{calls}: not a calls table ({e})") from None
    reasons = (("no_trial", "of no trial"), ("without_token_ids", "without token ids"))
    left = [f"{n[k]} call(s) {why}" for k, why in reasons if n[k]]
    out.print(
        f"[green]wrote[/] {n['trials']} trial(s), {n['calls']} call(s) in {n['segments']} segment(s) to {dest}"
        + (f" (left out: {', '.join(left)})" if left else "")
    )


def _the_stage(plan, stage: str):
    """The plan's one `stage` node (an export takes a recipe with exactly one; `eval.base`'s
    untrained base is not the recipe's training)."""
    from otbuild.plan import BASE

    nodes = [n for n in plan.nodes if n.stage == stage and not n.label.startswith(BASE)]
    if len(nodes) != 1:
        found = f"no {stage} section" if not nodes else f"{len(nodes)} {stage} stages (an ablation)"
        raise ConfigError(f"{plan.recipe.path}: {found}: export a recipe with exactly one")
    return nodes[0]


@export.command("llamafactory")
@click.argument("recipe")
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--gpus",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="GPUs the lab trains on in all: sets gradient accumulation so the global batch is the recipe's.",
)
@click.option("--model", help="model_name_or_path (default: the recipe's sft.model path).")
@click.option("--name", default="otbuild_sft", show_default=True, help="The dataset's name in dataset_info.json.")
@click.option(
    "--speed",
    multiple=True,
    type=click.Choice(["liger-kernel", "flash-attn"]),
    help="OpenThoughts-Agent's speed settings (repeatable): enable_liger_kernel, flash_attn: fa2.",
)
def export_llamafactory_cmd(recipe, dest, gpus, model, name, speed):
    """RECIPE's SFT traces and settings for LLaMA-Factory, in DEST: the sharegpt data,
    dataset_info.json, ds_zN_config.json and train_NAME.yaml (run it from DEST)."""
    from otbuild.tasks.redact import describe
    from otbuild.train.llamafactory import write_handoff

    plan = _plan(recipe)
    node = _the_stage(plan, "sft")
    cfg = node.config
    traces = [i.main_output for i in node.inputs]
    if missing := [str(p) for p in traces if not p.exists()]:
        raise ConfigError(
            f"{plan.recipe.path}: the traces are not built yet ({', '.join(missing)}): "
            f"run `otbuild build {recipe}` first"
        )
    if model is None and cfg.model.kind != "pretrained":
        raise ConfigError(
            f"{plan.recipe.path}: sft.model is a {cfg.model.kind} model otbuild builds "
            "itself: pass --model (an HF id or a model dir)"
        )
    header = (
        f"LLaMA-Factory training of recipe {plan.recipe.name} ({plan.recipe.path}), its sft stage {node.id}\n"
        f"traces: {', '.join(f'{i.label} {i.id}' for i in node.inputs)}"
    )
    try:
        stats = write_handoff(traces, dest, cfg, model or cfg.model.path, gpus, name=name, header=header, speed=speed)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    mended = ", ".join(
        f"{k.replace('_', ' ')}: {stats[k]}" for k in ("merged_turns", "trailing_turns_dropped", "dropped") if stats[k]
    )
    out.print(
        f"[green]wrote[/] {stats['rows']} conversation(s) to {stats['file']}"
        f"{f' ({mended})' if mended else ''}, dataset_info.json and {stats['yaml']}; "
        f"{describe(stats['redacted'])}"
    )


@export.command("skyrl")
@click.argument("recipe")
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=4, show_default=True)
@click.option(
    "--nodes",
    type=click.IntRange(min=1),
    default=6,
    show_default=True,
    help="The allocation SkyRL splits: a third trains, the rest serve (OT-Agent: 6 x 4).",
)
@click.option("--model", help="trainer.policy.model.path (default: the recipe's SFT checkpoint dir).")
@click.option("--python", "python", default="python", show_default=True, help="SkyRL's python in the command.")
def export_skyrl_cmd(recipe, dest, gpus_per_node, nodes, model, python):
    """RECIPE's rl stage as SkyRL runs it (`rl.trainer: skyrl`), in DEST: the task set (tasks/),
    SkyRL's config (skyrl.yaml) and its entry point's command (command.sh, printed)."""
    from otbuild.tasks.redact import describe
    from otbuild.train.skyrl import shell_lines, write_handoff

    plan = _plan(recipe)
    node = _the_stage(plan, "rl")
    ckpt, tasks = (i.main_output for i in node.inputs)
    if not tasks.exists():
        raise ConfigError(
            f"{plan.recipe.path}: the task table is not built yet ({tasks}): run `otbuild build {recipe}` first"
        )
    header = (
        f"SkyRL run of recipe {plan.recipe.name} ({plan.recipe.path}), its rl stage {node.id}\n"
        f"inputs: {', '.join(f'{i.label} {i.id}' for i in node.inputs)}"
    )
    try:
        h = write_handoff(
            node.config,
            tasks,
            model or str(ckpt.parent.resolve()),
            dest,
            gpus_per_node,
            nodes,
            python=python,
            header=header,
        )
    except ValueError as e:
        raise ConfigError(str(e)) from None
    out.print(
        f"[green]wrote[/] {h['tasks']} task dir(s) to {h['tasks_dir']} ({describe(h['redacted'])}), "
        f"{h['yaml']} and {dest}/command.sh"
    )
    click.echo(shell_lines(h["command"]))


@main.command()
@click.argument("recipe")
@click.argument("artifact")
@click.option("--repo", required=True, help="The Hub dataset repo, ORG/NAME.")
@click.option(
    "--out",
    "dest",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where to write the folder (default: publish/RECIPE/ARTIFACT); it must not exist.",
)
@click.option("--dry-run", is_flag=True, help="Write the folder only; upload nothing.")
@click.option("--private", is_flag=True, help="Create the repo private (when it does not exist yet).")
def publish(recipe, artifact, repo, dest, dry_run, private):
    """Write ARTIFACT (a label of RECIPE, e.g. trace_filter) as a Hub-ready dataset folder:
    parquet shards, a dataset card, the resolved recipe and a manifest of ids and sha256s; then
    upload it with the token huggingface_hub finds (HF_TOKEN or a saved login)."""
    from otbuild.publish import hub_folder, upload
    from otbuild.tasks.redact import describe

    token = None
    if not dry_run:
        from huggingface_hub import get_token

        if not (token := get_token()):
            raise ConfigError(
                "no Hugging Face token (set HF_TOKEN or run `hf auth login`); --dry-run writes the folder only"
            )
    plan = _plan(recipe)
    folder = dest or Path("publish") / plan.recipe.name / artifact.replace("/", "__")
    manifest = hub_folder(plan, artifact, folder, repo)
    rows = sum(f["rows"] for f in manifest["files"])
    out.print(
        f"[green]wrote[/] {folder}: {rows} rows in {len(manifest['files'])} file(s), README.md, manifest.json; "
        f"{describe(manifest['redacted'])}"
    )
    if not dry_run:
        out.print(f"[green]uploaded[/] {upload(folder, repo, token, private)}")


@main.group()
def stage():
    """Run one stage from its spec (what the Snakemake rules call)."""


def _stage_command(name: str):
    @click.option("--spec", required=True, help="The node's spec as JSON (from the Snakefile).")
    @click.option("--shard", type=int, help="Sharded stages: run this shard (without: merge them).")
    def cmd(spec, shard):
        from otbuild.runner import read_spec, run_shard, run_spec

        spec = read_spec(spec, name)
        if shard is not None:
            run_shard(spec, shard)
            return
        record = run_spec(spec, rule=name)
        rows = ", ".join(f"{Path(o['path']).name}: {o.get('rows', '?')} rows" for o in record["outputs"])
        out.print(f"[green]{name}[/] {record['id']}: {rows}")

    cmd.__doc__ = f"Run the {name!r} stage (version {STAGES[name].version})."
    return stage.command(name)(cmd)


for _name in STAGES:
    _stage_command(_name)
