"""The otbuild command line. Run from the project root (where Snakefile and recipes/ are).

Exit codes: 0 ok, 1 findings (audit) or a failed build/stage, 2 usage or config error.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

import otbuild
from otbuild.errors import EXIT_FINDINGS, EXIT_USAGE, ConfigError
from otbuild.stages import STAGES

# Piped output (CI logs, files) gets wide tables instead of rich's 80-column default.
_WIDTH = None if sys.stdout.isatty() else 160
out = Console(width=_WIDTH)
err = Console(stderr=True, width=_WIDTH)


class Group(click.Group):
    """Turns a ConfigError anywhere into its message on stderr and exit code 2."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except ConfigError as e:
            err.print(f"[bold red]error:[/] {e}", markup=True, highlight=False, soft_wrap=True)
            ctx.exit(EXIT_USAGE)


@click.group(cls=Group, epilog="Exit codes: 0 ok, 1 findings or a failed build, 2 usage or config error.")
@click.version_option(otbuild.__version__, prog_name="otbuild")
def main():
    """Declarative, content-addressed builds of agentic training data on Snakemake + DuckDB."""


def _plan(recipe: str):
    from otbuild.plan import plan_recipe
    from otbuild.recipe.load import load_recipe

    return plan_recipe(load_recipe(recipe, Path.cwd()))


def _check_jobs(plan, profile: str | None) -> None:
    """Refuse a rollout or eval whose concurrent trials would not fit in its job's memory."""
    if not profile:
        return
    from otbuild.jobs import overcommit_problems

    where = next((d for d in (Path.cwd() / "profiles" / profile, Path(profile)) if (d / "config.yaml").is_file()), None)
    if where is None:
        raise ConfigError(f"--profile {profile}: no profiles/{profile}/config.yaml or {profile}/config.yaml")
    if problems := overcommit_problems(plan.nodes, where):
        raise ConfigError("\n".join(problems))


@main.command()
@click.argument("recipes", nargs=-1, required=True)
@click.option("--profile", help="Also check the recipe against this Snakemake profile's job sizes.")
def validate(recipes, profile):
    """Check RECIPES (names under recipes/ or paths) against the schema; write nothing. With
    --profile, also refuse rollouts whose concurrency x limits.memory_mb exceeds their job's mem_mb."""
    for r in recipes:
        plan = _plan(r)
        _check_jobs(plan, profile)
        out.print(f"[green]ok[/] {plan.recipe.path}: {len(plan.nodes)} stage(s)")
        for node, path in plan.missing:
            err.print(f"[yellow]warning:[/] {node.label}: {path} does not exist yet; the build needs it")


@main.command()
@click.argument("recipe")
def plan(recipe):
    """Show RECIPE's stages, their content ids and whether each is built."""
    from otbuild.provenance import check

    p = _plan(recipe)
    table = Table(title=f"plan: {p.recipe.name}")
    for col in ("artifact", "stage", "id", "status", "inputs"):
        table.add_column(col)
    for n in p.nodes:
        status = check(n.dir, n.stage).status
        style = {"ok": "green", "not-built": "yellow"}.get(status, "red")
        shown = {"ok": "built", "not-built": "pending"}.get(status, status)
        table.add_row(n.label, n.stage, n.id, f"[{style}]{shown}[/]", ", ".join(i.id for i in n.inputs))
    out.print(table)


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("recipe")
@click.option("--profile", help="Snakemake profile (e.g. slurm); profiles/default always applies.")
@click.option("-n", "--dry-run", is_flag=True, help="Show the jobs without running them.")
@click.argument("snakemake_args", nargs=-1, type=click.UNPROCESSED)
def build(recipe, profile, dry_run, snakemake_args):
    """Build RECIPE with Snakemake (validated first). Extra args go to snakemake."""
    p = _plan(recipe)
    _check_jobs(p, profile)
    code = _snakemake(p.recipe.name, profile, ["-n"] * dry_run + list(snakemake_args))
    sys.exit(0 if code == 0 else EXIT_FINDINGS)


def _snakemake(target: str, profile: str | None, args: list[str]) -> int:
    cmd = [sys.executable, "-m", "snakemake", target, *(["--profile", profile] if profile else []), *args]
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
    code = _snakemake(p.recipe.name, profile, list(snakemake_args))
    if code:
        sys.exit(EXIT_FINDINGS)
    view = Path("results") / p.recipe.name / "report"
    out.print(f"[green]report[/] {view / 'report.html'}\n[green]card[/]   {view / 'dataset_card.md'}")


@main.command()
@click.argument("target")
@click.option("--verify", is_flag=True,
              help="Rehash every file from its bytes; without it, a file whose path, size, mtime, ctime "
                   "and inode are unchanged keeps its cached sha256 (.otbuild/digests.json).")
def audit(target, verify):
    """Prove where artifacts came from. TARGET is a recipe (checks all of its artifacts) or an
    artifact dir/file (shows its full record). Exits 1 if any artifact drifted from its record,
    lacks one, or is not built."""
    from otbuild import audit as audit_mod

    path = Path(target)
    if path.exists() and "artifacts" in path.resolve().parts:
        sys.exit(audit_mod.show_artifact(path, out, verify))
    sys.exit(audit_mod.audit_plan(_plan(target), out, verify))


@main.command()
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--row", type=int, help="Show row N (0-based) in full: fields, metadata, task files.")
@click.option("--limit", default=20, show_default=True, help="Rows in the preview table.")
@click.option("--columns", help="Comma-separated columns for the table (default: all but blobs).")
def show(path, row, limit, columns):
    """Preview a parquet artifact as a table, or one row in full."""
    from otbuild import show as show_mod

    show_mod.show(path, out, row=row, limit=limit, columns=columns.split(",") if columns else None)


@main.command(context_settings={"ignore_unknown_options": True, "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def serve(args):
    """Serve a transformers model dir over an OpenAI-compatible chat API (`serve --help`)."""
    from otbuild.serve import main as serve_main

    sys.exit(serve_main(list(args)))


@main.group()
def ingest():
    """Bring results made elsewhere in as otbuild tables."""


@ingest.command("harbor-job")
@click.argument("job_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", "dest", type=click.Path(file_okay=False, path_type=Path),
              help="Where to write the tables (default: JOB_DIR/otbuild).")
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

    try:
        n = export_tasks(parquet, dest)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    out.print(f"[green]wrote[/] {n} task dir(s) to {dest}")


@main.group()
def stage():
    """Run one stage from its spec (what the Snakemake rules call)."""


def _stage_command(name: str):
    @click.option("--spec", required=True, help="The node's spec as JSON (from the Snakefile).")
    @click.option("--shard", type=int, help="Sharded stages: run this shard (without: merge them).")
    def cmd(spec, shard):
        from otbuild.runner import run_shard, run_spec

        if shard is not None:
            run_shard(json.loads(spec), shard)
            return
        record = run_spec(json.loads(spec), rule=name)
        rows = ", ".join(f"{Path(o['path']).name}: {o.get('rows', '?')} rows" for o in record["outputs"])
        out.print(f"[green]{name}[/] {record['id']}: {rows}")

    cmd.__doc__ = f"Run the {name!r} stage (version {STAGES[name].version})."
    return stage.command(name)(cmd)


for _name in STAGES:
    _stage_command(_name)
