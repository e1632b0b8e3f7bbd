"""What README.md and docs/ show, run: every YAML block is a valid recipe, and every command the
docs show works on the smoke build (dry-run forms where a GPU or a cluster would be needed): the
shell blocks of README.md and docs/usage.md, any doc's command table, and every command of the
generated CLI reference (docs/cli.md). A command added to any of them without a case here fails."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from otbuild.hashing import canonical_json
from otbuild.plan import plan_recipe
from otbuild.recipe.load import load_recipe
from tests.conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
# A block that only shows some sections (docs/training.md's sft/rl) extends this recipe.
FRAGMENT_BASE = "sources:\n  a: {kind: synthetic, rank: 1, count: 4}\nteacher: {engine: oracle}\ntrace_filter: {}\n"


def fenced(path: Path, lang: str) -> list[tuple[int, str]]:
    """(line, body) of every ```LANG block of a markdown file."""
    text = path.read_text()
    return [(text[: m.start()].count("\n") + 1, m.group(2)) for m in FENCE.finditer(text) if m.group(1) == lang]


YAML_BLOCKS = [(p, line, body) for p in DOCS for lang in ("yaml", "yml") for line, body in fenced(p, lang)]


@pytest.mark.parametrize(
    "path,line,body", YAML_BLOCKS, ids=[f"{p.relative_to(REPO)}:{line}" for p, line, _ in YAML_BLOCKS]
)
def test_yaml_blocks_are_valid_recipes(path, line, body, tmp_path):
    assert YAML_BLOCKS, "no YAML blocks found"
    (tmp_path / "recipes").mkdir()
    if "extends" in (doc := yaml.safe_load(body)):  # a shipped recipe's: checked against it
        for shipped in (REPO / "recipes").glob("*.yaml"):
            shutil.copy(shipped, tmp_path / "recipes")
    elif not {"sources", "trace_imports"} & set(doc):
        (tmp_path / "recipes" / "docs_base.yaml").write_text(FRAGMENT_BASE)
        body = "extends: docs_base\n" + body
    (tmp_path / "recipes" / "block.yaml").write_text(body)
    plan = plan_recipe(load_recipe("block", tmp_path))  # a ConfigError names the key and what was expected
    assert plan.nodes


def test_the_docs_index_names_every_page_and_every_link_is_there():
    """docs/README.md links each page of docs/; every relative link of the docs names a file
    that exists."""
    index = (REPO / "docs" / "README.md").read_text()
    assert not [p.name for p in DOCS[1:] if p.name != "README.md" and f"]({p.name})" not in index]
    broken = [
        f"{p.relative_to(REPO)}: {target}"
        for p in DOCS
        for target in re.findall(r"\]\(([^)\s]+)\)", p.read_text())
        if not target.startswith(("http", "#")) and not (p.parent / target.split("#")[0]).exists()
    ]
    assert not broken, broken


# Every YAML file the repository ships (recipes, profiles, the project template `otbuild init`
# copies), found here rather than listed, so that a new one is checked too.
SHIPPED_YAML = sorted(
    p
    for d in ("recipes", "profiles", "otbuild", "scripts", "bench", "slurm")
    for p in (REPO / d).rglob("*.y*ml")
    if p.suffix in (".yaml", ".yml")
)


@pytest.mark.parametrize("path", SHIPPED_YAML, ids=[str(p.relative_to(REPO)) for p in SHIPPED_YAML])
def test_shipped_yaml_files_have_no_duplicate_keys(path):
    """YAML keeps the last of two equal keys silently (issue 26.6: profiles/default set
    `benchmark-extended` twice); the recipes' loader refuses them, for every shipped file."""
    from otbuild.recipe.read import RecipeLoader

    assert len(SHIPPED_YAML) >= 10
    yaml.load(path.read_bytes(), Loader=RecipeLoader)  # noqa: S506 (a SafeLoader)


def test_stage_versions_the_docs_state_are_the_registry_s():
    """Any stage version the docs state (a StageDef line, "`sft` is at version 2") is the one in
    otbuild/stages/__init__.py (issue 26.6: docs/training.md said rl was at 2)."""
    from otbuild.stages import STAGES

    stated = []
    for path in DOCS:
        text = path.read_text()
        stated += [
            (path.name, *m) for m in re.findall(r'StageDef\(\s*"(\w+)",\s*(\d+)', text) if m[0] in STAGES
        ]  # not the example of adding one
        stated += [(path.name, *m) for m in re.findall(r"`(\w+)`[^.`\n]{0,30}\bversion (\d+)", text) if m[0] in STAGES]
    assert stated
    wrong = [
        f"{doc}: {stage} at version {v}, the registry has {STAGES[stage].version}"
        for doc, stage, v in stated
        if STAGES[stage].version != int(v)
    ]
    assert not wrong, wrong


def test_the_smoke_settings_the_docs_show_are_the_smoke_recipe_s():
    """docs/training.md's laptop block is recipes/smoke.yaml's sft and rl sections, as they are."""
    text = (REPO / "docs" / "training.md").read_text()
    block = yaml.safe_load(FENCE.search(text.split("on a laptop (recipes/smoke.yaml's)", 1)[1]).group(2))
    smoke = yaml.safe_load((REPO / "recipes" / "smoke.yaml").read_text())
    assert block == {"sft": smoke["sft"], "rl": smoke["rl"]}


# -- the documented commands -----------------------------------------------------------------

RUN_DOCS = [REPO / "README.md", REPO / "docs" / "usage.md"]  # their shell blocks run on the smoke build
CLI_DOC = REPO / "docs" / "cli.md"  # generated from click (tests/test_docgen.py keeps it current)


def documented_commands() -> set[str]:
    """The `otbuild`/`snakemake` lines of RUN_DOCS' shell blocks and the first column of any
    doc's command table, as written."""
    shown = [
        line.split("#", 1)[0].strip()
        for path in RUN_DOCS
        for _, block in fenced(path, "sh")
        for line in block.splitlines()
    ]
    tables = [c for path in DOCS for c in re.findall(r"^\| `((?:otbuild|snakemake) [^`]+)` \|", path.read_text(), re.M)]
    return {c for c in shown if c.startswith(("otbuild ", "snakemake "))} | set(tables)


def cli_commands() -> list[str]:
    """The commands docs/cli.md documents, without their placeholders: `otbuild export tasks`,
    `otbuild stage` (for `otbuild stage NAME`), ..."""
    headings = re.findall(r"^## `(otbuild[^`]*)`", CLI_DOC.read_text(), re.M)
    return [" ".join(w for w in h.split() if not w.isupper()) for h in headings]


KEPT = "results/smoke/trace_filter/kept.parquet"
TASKS = "results/smoke/task_filter/kept.parquet"
# documented command -> the concrete command lines run for it ({tmp}, {job}, {spec} filled in);
# "serve" is started, asked, and stopped.
CASES = {
    "snakemake smoke": [["snakemake", "smoke"]],
    "snakemake --profile slurm otagent_v2_100k -n": [["snakemake", "--profile", "slurm", "otagent_v2_100k", "-n"]],
    "snakemake --profile slurm otagent_v2_100k": [["snakemake", "--profile", "slurm", "otagent_v2_100k", "-n"]],
    "otbuild plan smoke": [["otbuild", "plan", "smoke"]],
    "otbuild audit --verify smoke": [["otbuild", "audit", "--verify", "smoke"]],
    f"otbuild show {KEPT} --row 0": [["otbuild", "show", KEPT, "--row", "0"]],
    f"otbuild audit {KEPT}": [["otbuild", "audit", KEPT]],
    "otbuild init lab": [["otbuild", "init", "{tmp}/new_lab"]],
    "otbuild validate RECIPE... [--profile P]": [
        ["otbuild", "validate", "smoke", "recipes/smoke.yaml"],
        ["otbuild", "validate", "smoke", "--profile", "slurm"],
    ],
    "otbuild plan RECIPE": [["otbuild", "plan", "recipes/smoke.yaml"]],
    "otbuild plan --estimate RECIPE [--from PILOT]... [--profile P] [--json]": [
        ["otbuild", "plan", "--estimate", "otagent_v2_100k", "--from", "{pilot}", "--profile", "slurm"],
        ["otbuild", "plan", "--estimate", "smoke", "--from", "recipes/smoke.yaml", "--json"],
    ],
    "otbuild build RECIPE [--profile P] [-n] [SNAKEMAKE ARGS]": [
        ["otbuild", "build", "smoke", "-n"],
        ["otbuild", "build", "smoke", "--profile", "profiles/slurm", "-n"],
    ],
    "otbuild report RECIPE [--profile P]": [["otbuild", "report", "smoke"]],
    "otbuild probe RECIPE [--tasks N] [--seed S] [--profile P] [-n] [SNAKEMAKE ARGS]": [
        ["otbuild", "probe", "smoke", "--tasks", "2", "-n"]
    ],
    "otbuild audit RECIPE [--verify]": [["otbuild", "audit", "smoke"]],
    "otbuild audit --rebuild RECIPE [ARTIFACT...] [--all] [--keep]": [
        ["otbuild", "audit", "--rebuild", "smoke", "sources/synth_more", "mix"]
    ],
    "otbuild audit PATH [--verify]": [
        ["otbuild", "audit", KEPT],
        ["otbuild", "audit", "--verify", "results/smoke/sft"],
    ],
    "otbuild show PARQUET [--columns a,b] [--limit N] [--row N]": [
        ["otbuild", "show", TASKS, "--columns", "task_id,source", "--limit", "3"],
        ["otbuild", "show", TASKS, "--row", "0"],
    ],
    "otbuild export tasks PARQUET DIR": [["otbuild", "export", "tasks", TASKS, "{tmp}/tasks"]],
    "otbuild ingest harbor-job DIR [--out D] [--benchmark B]": [
        ["otbuild", "ingest", "harbor-job", "{job}", "--out", "{tmp}/ingested", "--benchmark", "b"]
    ],
    "otbuild serve MODEL_DIR [--port P]": [["otbuild", "serve", "results/smoke/rl", "--port", "0"]],
    "otbuild stage NAME --spec JSON [--shard K]": [["otbuild", "stage", "trace_filter", "--spec", "{spec}"]],
    "otbuild init DIR": [["otbuild", "init", "{tmp}/lab"]],
    "otbuild validate --images RECIPE...": [["otbuild", "validate", "--images", "smoke"]],
    "otbuild images load DIR": [["otbuild", "images", "load", "{images}"]],
    "otbuild clean --containers": [["otbuild", "clean", "--containers"]],
    "otbuild costs RECIPE": [["otbuild", "costs", "smoke"]],
    "otbuild export llamafactory RECIPE DIR [--gpus N] [--model M] [--name D]": [
        ["otbuild", "export", "llamafactory", "smoke", "{tmp}/lf", "--gpus", "1", "--model", "Qwen/Qwen3-8B"]
    ],
    "otbuild export skyrl RECIPE DIR [--nodes N] [--gpus-per-node G] [--model M] [--python PY]": [
        ["otbuild", "export", "skyrl", "smoke", "{tmp}/skyrl", "--nodes", "1", "--gpus-per-node", "2"]
    ],
    "otbuild export rollout-details CALLS DEST": [
        ["otbuild", "export", "rollout-details", "results/smoke/teacher/calls.parquet", "{tmp}/rollout-details.jsonl"]
    ],
    "otbuild publish RECIPE ARTIFACT --repo ORG/NAME [--out D] [--dry-run] [--private]": [
        ["otbuild", "publish", "smoke", "trace_filter", "--repo", "lab/smoke-traces", "--out", "{tmp}/pub", "--dry-run"]
    ],
}


def test_every_documented_command_has_a_case():
    documented = documented_commands()
    assert len(documented) >= 10, documented
    assert not documented - set(CASES), (
        f"commands the docs show without a case: add them to CASES: {sorted(documented - set(CASES))}"
    )
    assert not set(CASES) - documented, f"cases of commands no doc shows: {sorted(set(CASES) - documented)}"


def test_every_command_of_the_cli_reference_is_run():
    """Each command of docs/cli.md, so each click command, is run by a case: a new command fails
    here until one runs it."""
    run = [" ".join(argv) + " " for argvs in CASES.values() for argv in argvs]
    commands = cli_commands()
    assert "otbuild export tasks" in commands and "otbuild stage" in commands, commands
    not_run = [c for c in commands if not any(r.startswith(c + " ") for r in run)]
    assert not not_run, f"commands of {CLI_DOC.name} no case runs: add them to CASES: {not_run}"


def _argv(cmd: list[str], fill: dict) -> list[str]:
    tool, *args = cmd
    module = "otbuild" if tool == "otbuild" else "snakemake"
    return [sys.executable, "-m", module, *(a.format(**fill) if "{" in a else a for a in args)]


def _serve(argv: list[str], cwd: Path) -> tuple[int, str]:
    """Start the server, ask /health and /v1/models, stop it with SIGTERM: its exit code, log."""
    from otbuild.serve import READY

    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith(READY):
                root = line[len(READY) :].strip()
                with urllib.request.urlopen(f"{root}/health", timeout=30) as r:
                    assert r.status == 200
                with urllib.request.urlopen(f"{root}/v1/models", timeout=30) as r:
                    assert json.loads(r.read())["data"]
                break
        proc.terminate()
        rest = proc.communicate(timeout=60)[0]
        return proc.returncode, "".join(lines) + rest
    finally:
        proc.kill()


def _saved_image(tmp: Path) -> Path:
    """A folder holding one `podman save` tarball of a one-file image (removed from storage
    again, so `images load` really imports it)."""
    folder, name = tmp / "images", "localhost/otbuild-docs-test:1"
    folder.mkdir()
    (tmp / "rootfs").mkdir()
    (tmp / "rootfs" / "hello").write_text("hi\n")
    subprocess.run(["tar", "-C", str(tmp / "rootfs"), "-cf", str(tmp / "rootfs.tar"), "."], check=True)
    subprocess.run(["podman", "import", str(tmp / "rootfs.tar"), name], check=True, capture_output=True)
    subprocess.run(["podman", "save", "-o", str(folder / "tiny.tar"), name], check=True, capture_output=True)
    subprocess.run(["podman", "rmi", name], check=True, capture_output=True)
    return folder


@pytest.mark.slow
def test_documented_commands_run_on_the_smoke_build(smoke_build, tmp_path):
    from tests.harbor.test_harbor import _trial

    project, _ = smoke_build
    job = tmp_path / "job"
    _trial(
        job,
        "t1__a",
        "t1",
        [
            {"source": "user", "message": "task"},
            {"source": "agent", "message": "ls", "observation": {"results": [{"content": "a"}]}},
        ],
    )
    node = next(n for n in plan_recipe(load_recipe("smoke", project)).nodes if n.stage == "trace_filter")
    spec = {**node.spec(), "outdir": str(tmp_path / "trace_filter")}  # the stage once more, beside the build
    fill = {
        "tmp": str(tmp_path),
        "job": str(job),
        "spec": canonical_json(spec),
        "images": str(_saved_image(tmp_path)),
        "pilot": str(project / "recipes" / "smoke.yaml"),
    }
    failures = []
    for documented, cmds in CASES.items():
        for cmd in cmds:
            argv = _argv(cmd, fill)
            cwd = REPO if "otagent_v2_100k" in cmd else project  # the paper's recipe: the repo's recipes/
            if cmd[:2] == ["otbuild", "serve"]:
                rc, log = _serve(argv, cwd)
            else:
                res = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
                rc, log = res.returncode, res.stdout + res.stderr
            if rc != 0:
                failures.append(f"{documented}: `{' '.join(cmd)}` exited {rc}\n{log[-2000:]}")
    assert not failures, "\n\n".join(failures)
    assert (tmp_path / "trace_filter" / "provenance.json").exists()
    assert (tmp_path / "ingested" / "scores.parquet").exists() and any((tmp_path / "tasks").iterdir())


# -- docs/training.md's LLaMA-Factory handoff ----------------------------------------------------

LF_PYTHON = REPO / ".venv-llamafactory" / "bin" / "python"


def handoff_commands() -> str:
    """The shell block of docs/training.md's LLaMA-Factory handoff, as written."""
    text = (REPO / "docs" / "training.md").read_text()
    section = text.split("### LLaMA-Factory export", 1)[1].split("\n## ", 1)[0]
    (block,) = [m.group(2) for m in FENCE.finditer(section) if m.group(1) == "sh"]
    return block


@pytest.mark.slow
@pytest.mark.skipif(
    not LF_PYTHON.is_file(),
    reason="LLaMA-Factory is not installed in .venv-llamafactory: "
    "run scripts/llamafactory-env.sh (make llamafactory-env)",
)
def test_the_llamafactory_handoff_runs_as_written(tmp_path, monkeypatch):
    """The documented commands, in a project whose recipe of that name has the paper recipe's
    `sft` section and imported traces (built here), with `llamafactory-cli` standing in as
    LLaMA-Factory's own checks (no GPU): its parser takes the YAML, its loader the data."""
    from otbuild.settings.train import TinyModel
    from otbuild.runner import run_spec
    from otbuild.train.model import materialise
    from otbuild.train.toy import trace_rows

    block = handoff_commands()
    recipe = re.search(r"otbuild export llamafactory (\S+)", block).group(1)
    sft = load_recipe(recipe, REPO).data["sft"]  # the paper recipe's, `extends` resolved
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / f"{recipe}.yaml").write_text(
        yaml.safe_dump(
            {
                "trace_imports": {"runs": {"kind": "messages-jsonl", "path": "runs.jsonl"}},
                "trace_filter": {"min_turns": 0},
                "sft": sft,
            }
        )
    )
    (tmp_path / "runs.jsonl").write_text(
        "".join(json.dumps({"messages": r["conversations"]}) + "\n" for r in trace_rows(6))
    )
    monkeypatch.chdir(tmp_path)  # the stages write under the project
    nodes = plan_recipe(load_recipe(recipe, tmp_path)).nodes
    for n in nodes:
        if n.stage in ("trace_import", "trace_filter"):
            run_spec(n.spec())
    kept = next(n for n in nodes if n.stage == "trace_filter").main_output
    model = materialise(
        TinyModel(kind="tiny", vocab_size=600, hidden_size=32, intermediate_size=64, num_hidden_layers=1),
        tmp_path / "tiny",
        [kept],
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "llamafactory-cli"
    shim.write_text(
        f'#!/bin/sh\nexec env -u PYTHONPATH "{LF_PYTHON}" "{REPO / "tests" / "support" / "llamafactory_contract.py"}" cli "$@"\n'
    )
    shim.chmod(0o755)
    otbuild = bin_dir / "otbuild"  # this checkout's CLI, whatever `otbuild` is on PATH
    otbuild.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m otbuild "$@"\n')
    otbuild.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "OTBUILD_LF_MODEL": str(model),
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "DISABLE_VERSION_CHECK": "1",
    }
    res = subprocess.run(
        ["bash", "-euc", block], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    assert "6 examples" in res.stdout and "template qwen3_nothink" in res.stdout, res.stdout[-2000:]
