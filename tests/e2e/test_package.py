"""otbuild as an installed package: the wheel holds every file it reads, `otbuild init` makes a
project outside the repository, and that project builds against the installed workflow."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

import otbuild
from otbuild import cli
from otbuild.scaffold import TEMPLATE, template_files
from otbuild.stages import STAGES
from tests.conftest import REPO, snakemake
from tests.conftest import otbuild as run_otbuild
from tests.e2e.test_slurm import local_profile

TORCH = "torch==2.13.0"  # the Makefile's CPU torch (its wheel is on this machine's disk)


def build_wheel(tmp: Path) -> Path:
    """The wheel `pip wheel .` makes, built from a copy of the sources (links followed, as the
    build does) so that the repository gets no build/ or egg-info."""
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src)
    shutil.copytree(REPO / "otbuild", src / "otbuild", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp / "dist"),
            str(src),
        ],
        check=True,
        capture_output=True,
    )
    return next((tmp / "dist").glob("otbuild-*.whl"))


def test_the_wheel_holds_every_file_of_the_package(tmp_path):
    """Every file under otbuild/ (templates, SQL, the workflow, the project template) is in the
    wheel: what a non-editable install reads at run time."""
    wheel = build_wheel(tmp_path)
    assert wheel.name == f"otbuild-{otbuild.__version__}-py3-none-any.whl"  # one version, the package's
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("otbuild/")}
    source = {
        p.relative_to(REPO).as_posix()
        for p in (REPO / "otbuild").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert source - shipped == set()
    for must in (
        "otbuild/Snakefile",
        "otbuild/rules/stages.smk",
        "otbuild/report/templates/report.html.j2",
        "otbuild/report/templates/dataset_card.md.j2",
        "otbuild/project_template/recipes/smoke.yaml",
    ):
        assert must in shipped


def test_init_writes_the_repositorys_own_project_files(tmp_path):
    dest = tmp_path / "lab"
    res = CliRunner().invoke(cli.main, ["init", str(dest)])
    assert res.exit_code == 0, res.output
    # the template is the repository's own Snakefile, smoke and paper recipes and profiles
    for rel in (
        "Snakefile",
        "recipes/smoke.yaml",
        "recipes/otagent_v2_100k.yaml",
        "profiles/default/config.yaml",
        "profiles/slurm/config.yaml",
    ):
        assert (dest / rel).read_bytes() == (REPO / rel).read_bytes(), rel
        assert not (dest / rel).is_symlink()
    assert "/artifacts/" in (dest / ".gitignore").read_text()
    assert "snakemake smoke" in (dest / "README.md").read_text()
    assert os.readlink(dest / "slurm") == "profiles/slurm" and (dest / "slurm" / "config.yaml").is_file()
    assert {p.name for p in template_files()} >= {"README.md", "gitignore", "Snakefile"}


def test_init_never_overwrites(tmp_path):
    dest = tmp_path / "lab"
    (dest / "recipes").mkdir(parents=True)
    (dest / "recipes" / "smoke.yaml").write_text("description: the lab's own\n")
    res = run_otbuild(tmp_path, "init", "lab")
    assert res.returncode == 2
    assert "lab/recipes/smoke.yaml" in res.stderr and "already exist" in res.stderr
    # nothing written, the lab's file untouched
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*")) == ["recipes", "recipes/smoke.yaml"]
    assert (dest / "recipes" / "smoke.yaml").read_text() == "description: the lab's own\n"


def test_build_without_a_snakefile_runs_the_packaged_workflow(tmp_path):
    assert run_otbuild(tmp_path, "init", "lab").returncode == 0
    project = tmp_path / "lab"
    (project / "Snakefile").unlink()
    res = run_otbuild(project, "build", "smoke", "-n")
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-3000:]
    assert f"--snakefile {TEMPLATE.parent / 'Snakefile'}" in log
    assert "profiles/default" in log and "This was a dry-run" in log


AUDIT_RECIPE = """\
sources:
  synth: {kind: synthetic, rank: 1, count: 6, seed: 0, families: [files]}
mix: {n: 1, total: 6}
"""


@pytest.mark.slow
def test_audit_after_an_upgrade_names_versions(project, monkeypatch):
    """After a build, a newer otbuild (another version; then one that bumped a stage version)
    is told apart: artifacts built by another version are named, changed stage versions too."""
    (project / "recipes" / "up.yaml").write_text(AUDIT_RECIPE)
    snakemake(project, "up")
    monkeypatch.chdir(project)
    audit = lambda: CliRunner().invoke(cli.main, ["audit", "up"], env={"COLUMNS": "250"})
    res = audit()
    assert res.exit_code == 0 and "built by otbuild" not in res.output, res.output

    built_by = otbuild.__version__
    monkeypatch.setattr(otbuild, "__version__", "9.0.0")
    res = audit()
    assert res.exit_code == 0, res.output  # same ids: the artifacts still hold
    assert f"built by otbuild {built_by}; this is 9.0.0" in res.output

    old = STAGES["mix"].version
    monkeypatch.setitem(STAGES, "mix", dataclasses.replace(STAGES["mix"], version=old + 1))
    res = audit()
    assert res.exit_code == 1, res.output  # the new mix is not built yet
    assert f"stage versions changed since the last build: mix {old} -> {old + 1}" in res.output
    assert f"stage version {old} -> {old + 1}" in res.output


@pytest.mark.slow
def test_an_installed_wheel_builds_a_project_outside_the_repository(tmp_path):
    """What a lab does: install the wheel with its `train` extra into a fresh virtual
    environment (no editable install, no source tree on sys.path), `otbuild init` a project,
    build the smoke recipe there, its student trained briefly (the report stage reads the packaged
    templates), dry-run it on Slurm through the project's own profile, and audit it. The environment sees this machine's
    packages (torch, deepspeed, ...: installing them again costs minutes and shows nothing of
    otbuild's), so the wheel goes in with --ignore-installed, over the editable otbuild there,
    and pip then checks that what the `train` extra asks for is all there."""
    wheel = build_wheel(tmp_path)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True, system_site_packages=True)
    bin_dir = env_dir / "bin"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", VIRTUAL_ENV=str(env_dir), DS_BUILD_OPS="0")

    def run(*cmd, cwd=tmp_path):
        proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, check=False)
        log = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{log[-5000:]}"
        return log

    run(bin_dir / "python", "-m", "pip", "install", "-q", "--no-compile", "--no-deps", "--ignore-installed", wheel)
    run(bin_dir / "python", "-m", "pip", "install", "-q", "--no-compile", TORCH, f"{wheel}[train]")
    where = run(bin_dir / "python", "-c", "import otbuild, sys; print(otbuild.__file__); print(sys.path)")
    assert where.startswith(str(env_dir)) and str(REPO) not in where, where

    run(bin_dir / "otbuild", "init", "lab")
    project = tmp_path / "lab"
    slurm = project / "profiles" / "slurm"
    local_profile(slurm, source=slurm / "config.yaml")  # the placeholders, filled
    assert "<" not in (slurm / "config.yaml").read_text()

    # the smoke's whole DAG, its student trained briefly: the wheel is tested, not the student
    (project / "recipes" / "short.yaml").write_text(
        "extends: smoke\ntask_filter: {sample: {n: 24, seed: 0}}\nsft: {max_steps: 100}\n"
        "eval: {base: false, benchmarks: {heldout: {count: 6}}}\n"
    )
    run(bin_dir / "python", "-m", "snakemake", "short", cwd=project)
    assert "<!DOCTYPE html>" in (project / "results" / "short" / "report" / "report.html").read_text()
    record = json.loads((project / "results" / "short" / "report" / "provenance.json").read_text())
    assert record["otbuild_version"] == otbuild.__version__

    log = run(bin_dir / "python", "-m", "snakemake", "--profile", "slurm", "smoke", "-n", "--forceall", cwd=project)
    assert "slurm_partition=cpu" in log and "This was a dry-run" in log
    log = run(bin_dir / "otbuild", "audit", "short", cwd=project)
    assert "match their provenance records" in log
