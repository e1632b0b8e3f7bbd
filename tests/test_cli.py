"""The CLI as users call it: exit codes 0/1/2, clear errors, show/export/plan/build."""

from collections import Counter

import pyarrow.parquet as pq
import pytest

from otbuild.stages import mix, source
from otbuild.stages.mix import MixSettings
from otbuild.stages import STAGES
from otbuild.tasks.taskdir import TaskDir
from tests.conftest import otbuild

RECIPE = "sources:\n  a: {kind: synthetic, rank: 1, count: 6, seed: 1}\ntask_filter: {dedup: true}\n"


@pytest.fixture
def built_source(tmp_path):
    out = tmp_path / "src"
    out.mkdir()
    source.run(STAGES["source"].config({"name": "a", "kind": "synthetic", "count": 4, "seed": 3}), [], out)
    return out / "tasks.parquet"


def test_validate_exit_codes(project):
    (project / "recipes" / "good.yaml").write_text(RECIPE)
    (project / "recipes" / "bad.yaml").write_text(RECIPE.replace("count: 6", "count: six"))
    res = otbuild(project, "validate", "good")
    assert res.returncode == 0 and "ok" in res.stdout
    res = otbuild(project, "validate", "bad")
    assert res.returncode == 2
    assert "bad.yaml: sources.a.count:" in res.stderr and "'six'" in res.stderr
    assert otbuild(project, "validate", "nope").returncode == 2
    assert otbuild(project, "frobnicate").returncode == 2  # usage error


def test_plan_lists_stages_and_ids(project):
    (project / "recipes" / "good.yaml").write_text(RECIPE)
    res = otbuild(project, "plan", "good")
    assert res.returncode == 0
    assert "sources/a" in res.stdout and "task_filter" in res.stdout and "pending" in res.stdout


def test_plan_reads_in_80_columns_with_inputs_by_name(project):
    """Issue 26.7: at 80 columns every id shows whole, once (its own row: inputs are named by
    label), and no line is wider."""
    import os
    import subprocess
    import sys

    from otbuild.plan import plan_recipe
    from otbuild.recipe.load import load_recipe

    (project / "recipes" / "r.yaml").write_text(
        "sources:\n  a_rather_long_source_name: {kind: synthetic, rank: 1, count: 6, seed: 1}\n"
        "  b: {kind: synthetic, rank: 2, count: 6, seed: 2}\nmix: {n: 2, total: 8}\n"
        "task_filter: {dedup: true}\n"
    )
    res = subprocess.run(
        [sys.executable, "-m", "otbuild", "plan", "r"],
        cwd=project,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert res.returncode == 0, res.stderr
    assert max(len(line) for line in res.stdout.splitlines()) <= 80, res.stdout
    for n in plan_recipe(load_recipe("r", project)).nodes:
        assert res.stdout.count(n.id) == 1, res.stdout
    rows = {
        line.split("│")[1].strip(): line.split("│")[4].strip()
        for line in res.stdout.splitlines()
        if line.startswith("│") and line.split("│")[2].strip()
    }
    assert rows["mix"].startswith("sources/a_rather") and rows["task_filter"] == "mix", res.stdout


def test_audit_an_artifact_by_its_results_path(project, monkeypatch):
    """The README's `results/RECIPE/LABEL/FILE` paths are links into artifacts/: audit follows
    them; a path that is in no artifact is a usage error (2), naming it."""
    from otbuild.hashing import canonical_json
    from otbuild.plan import plan_recipe
    from otbuild.recipe.load import load_recipe
    from otbuild.workflow import write_results

    (project / "recipes" / "good.yaml").write_text(RECIPE)
    monkeypatch.chdir(project)
    plan = plan_recipe(load_recipe("good", project))
    node = next(n for n in plan.nodes if n.stage == "source")
    res = otbuild(project, "stage", "source", "--spec", canonical_json(node.spec()))
    assert res.returncode == 0, res.stderr
    write_results(plan)
    for path in ("results/good/sources/a/tasks.parquet", "results/good/sources/a", f"{node.dir}/tasks.parquet"):
        res = otbuild(project, "audit", path)
        assert res.returncode == 0, path + res.stdout + res.stderr
        assert node.id in res.stdout and '"stage": "source"' in res.stdout
    res = otbuild(project, "audit", "artifacts/source")
    assert res.returncode == 2 and "artifacts/source: not inside an artifact dir" in res.stderr, res.stderr
    for path in ("results/good/manifest.json", "results/good/nope.parquet", "nope"):
        res = otbuild(project, "audit", path)
        assert res.returncode == 2 and path in res.stderr, res.stdout + res.stderr


def test_build_a_recipe_file_outside_recipes(project, tmp_path_factory):
    """RECIPE may be a path: Snakemake is told about the file (its stem is the target); a file
    whose stem names another recipe under recipes/ is refused up front, with the reason."""
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    (elsewhere / "mine.yaml").write_text(RECIPE)
    res = otbuild(project, "build", str(elsewhere / "mine.yaml"), "-n", "--config", "unrelated=1")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "This was a dry-run" in res.stdout + res.stderr and "source" in res.stdout
    (project / "recipes" / "mine.yaml").write_text(RECIPE.replace("seed: 1", "seed: 2"))
    for cmd in ("build", "report"):
        res = otbuild(project, cmd, str(elsewhere / "mine.yaml"), "-n")
        assert res.returncode == 2, res.stderr
        assert "target name 'mine' is taken by" in res.stderr and "recipes/mine.yaml; rename" in res.stderr
    res = otbuild(project, "build", "recipes/mine.yaml", "-n")  # the same file by its path: as by its name
    assert res.returncode == 0, res.stdout + res.stderr


def test_validate_and_plan_refuse_a_file_whose_stem_names_another_recipe(project, tmp_path_factory):
    """Issue 26.2: as `build` does, so that no command accepts what the build would refuse."""
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    (elsewhere / "mine.yaml").write_text(RECIPE)
    (project / "recipes" / "mine.yaml").write_text(RECIPE.replace("seed: 1", "seed: 2"))
    for cmd in ("validate", "plan"):
        res = otbuild(project, cmd, str(elsewhere / "mine.yaml"))
        assert res.returncode == 2 and "target name 'mine' is taken by" in res.stderr, res.stdout + res.stderr
        assert otbuild(project, cmd, "recipes/mine.yaml").returncode == 0


def test_stage_specs_that_are_not_a_plans_are_config_errors(project):
    """Issue 26.3: `otbuild stage NAME --spec` with what a user might type: exit 2, one line
    saying what is wrong, no traceback."""
    cases = {
        "{}": "--spec: required key(s) missing: stage, id, settings, inputs, outdir",
        "nope": "--spec: not JSON",
        "[1]": "--spec: found a JSON list",
        '{"stage": "source", "id": "x", "settings": {}, "inputs": [], "outdir": "o"}': "the spec is of a 'source' node, not a 'mix' one",
        '{"stage": "mix", "id": "x", "settings": {"n": 1}, "inputs": [], "outdir": "o"}': "--spec: settings.total: Field required",
    }
    for spec, said in cases.items():
        res = otbuild(project, "stage", "mix", "--spec", spec)
        assert res.returncode == 2 and said in res.stderr and "Traceback" not in res.stderr, (spec, res.stderr)


def test_show_a_folder_shows_its_only_parquet_or_lists_them(project, built_source):
    """Issue 26.3: `otbuild show results/NAME/LABEL` (an artifact's folder)."""
    res = otbuild(project, "show", str(built_source.parent))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "a folder with 2 parquet files: quarantine.parquet, tasks.parquet" in " ".join(res.stderr.split())
    (built_source.parent / "quarantine.parquet").unlink()
    res = otbuild(project, "show", str(built_source.parent))
    assert res.returncode == 0 and "4 rows" in res.stdout, res.stderr
    res = otbuild(project, "show", str(project))
    assert res.returncode == 2 and "a folder with no parquet file in it" in res.stderr


def test_validate_says_each_warning_once_and_what_it_could_not_check(project):
    """Issue 26.6: an ablation's candidates share a source whose file is not there and a
    reasoning model: each warning once, with the count; `--images` says it could not read the
    source rather than that no task runs in its own image."""
    (project / "recipes" / "abl.yaml").write_text("""
sources:
  a: {kind: harbor-parquet, rank: 1, path: data/none.parquet}
task_filter:
  llm: {engine: openai, base_url: 'http://x/v1', model: gpt-5-nano, kind: askllm, temperature: 0}
  score: {column: llm_score, top_k: 2}
teacher: {engine: oracle, sandbox: podman}
trace_filter: {}
eval: {model: {engine: oracle}, benchmarks: {b: {kind: harbor-parquet, path: data/b.parquet}}}
ablate: {trace_filter.min_turns: [1, 2, 3]}
""")
    res = otbuild(project, "validate", "--images", "abl")
    warnings = [" ".join(w.split()) for w in res.stderr.split("warning: ")[1:]]
    assert warnings == [
        f"{project}/recipes/abl.yaml: sources.a.path: {project}/data/none.parquet does not exist; the build needs it "
        "(3 candidates)",
        f"{project}/recipes/abl.yaml: eval.benchmarks.b.path: {project}/data/b.parquet does not exist; the build "
        "needs it (3 candidates)",
        "task_score: gpt-5-nano is a reasoning model: temperature not sent (only its default is accepted; "
        "docs/engines.md) (3 candidates)",
    ], res.stderr
    said = " ".join(res.stdout.split())
    assert (
        "base images: abl: could not check 2 source(s) whose data is not there yet (sources.a.path, "
        "eval.benchmarks.b.path): their tasks' images are unknown"
    ) in said
    assert "no task runs in its own image" not in said and res.returncode == 0


def test_show_table_and_row(project, built_source):
    res = otbuild(project, "show", str(built_source), "--columns", "path,source")
    assert res.returncode == 0 and "4 rows" in res.stdout and "synthetic-" in res.stdout
    res = otbuild(project, "show", str(built_source), "--row", "1")
    assert res.returncode == 0
    assert "instruction.md" in res.stdout and "solution/solve.sh" in res.stdout
    assert otbuild(project, "show", str(built_source), "--row", "9").returncode == 2
    assert otbuild(project, "show", str(built_source), "--columns", "nope").returncode == 2
    (project / "x.parquet").write_text("not parquet")
    res = otbuild(project, "show", "x.parquet")
    assert res.returncode == 2 and "x.parquet: not a readable parquet file" in res.stderr


def test_export_tasks_writes_harbor_dirs(project, built_source):
    res = otbuild(project, "export", "tasks", str(built_source), "out")
    assert res.returncode == 0, res.stderr
    dirs = sorted((project / "out").iterdir())
    assert len(dirs) == 4
    task = TaskDir.from_dir(dirs[0])
    assert {"instruction.md", "task.toml", "tests/test.sh", "solution/solve.sh"} <= set(task.files)
    assert task.files["tests/test.sh"].executable
    res = otbuild(project, "export", "tasks", str(built_source), "out")  # never overwrites
    assert res.returncode == 2


def test_export_tasks_of_an_upsampled_mix_names_copies_apart(project, built_source):
    out = project / "mix"
    out.mkdir()
    mix.run(MixSettings(n=1, total=10, sources=["a"]), [built_source], out)
    res = otbuild(project, "export", "tasks", str(out / "tasks.parquet"), "out")
    assert res.returncode == 0, res.stderr
    copies = Counter(pq.read_table(out / "tasks.parquet", columns=["path"]).column("path").to_pylist())
    assert sorted(copies.values()) == [2, 2, 3, 3]  # 10 rows from 4 tasks
    expected = {f"{p}-{k}" if k > 1 else p for p, n in copies.items() for k in range(1, n + 1)}
    assert {d.name for d in (project / "out").iterdir()} == expected
    assert all((project / "out" / n / "instruction.md").read_text() for n in expected)


def test_build_dry_run_goes_through_snakemake(project):
    (project / "recipes" / "good.yaml").write_text(RECIPE)
    res = otbuild(project, "build", "good", "-n")
    assert res.returncode == 0, res.stderr
    assert "This was a dry-run" in res.stdout + res.stderr
    (project / "recipes" / "good.yaml").write_text(RECIPE + "mix: {n: 5, total: 1}\n")
    res = otbuild(project, "build", "good", "-n")
    assert res.returncode == 2 and "mix.n: found 5" in res.stderr


@pytest.mark.slow
def test_build_ends_with_what_it_made(project):
    """Issue 26.4: `otbuild build NAME` ends with where the results and the report are and the
    headline numbers (the workflow's success handler, so `snakemake NAME` says the same)."""
    (project / "recipes" / "good.yaml").write_text(
        RECIPE + "teacher: {engine: oracle, shards: 1}\ntrace_filter: {min_turns: 1}\n"
        "eval: {model: {engine: oracle}, repeats: 2, benchmarks: {b: {kind: synthetic, count: 2, seed: 9}}}\n"
    )
    res = otbuild(project, "build", "good", "-n")
    assert res.returncode == 0 and "is built" not in res.stdout + res.stderr  # a dry run made nothing
    res = otbuild(project, "build", "good")
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-3000:]
    said = log[log.index("otbuild: good is built in ") :]
    traces = pq.read_table(project / "results" / "good" / "trace_filter" / "kept.parquet").num_rows
    for line in (
        "  results      results/good/  (manifest.json names every artifact, its id and rows)",
        "  report       results/good/report/report.html",
        "  tasks kept   6 (task_filter)",
        f"  traces kept  {traces} (trace_filter)",
        "  pass@1       b 1 ± 0 (2 repeats x 2 tasks)",
        "  tokens       0 in, 0 out (",
        "  job time     ",
    ):
        assert line in said, (line, said)
    assert "warning:" not in said and (project / "results" / "good" / "report" / "report.html").exists()


def test_errors_are_printed_whole_with_exit_2(project):
    """Brackets in a message are text (an ablation candidate's name), and a bad path is a usage
    error: no traceback, exit 2."""
    (project / "recipes" / "grid.yaml").write_text(
        RECIPE
        + "mix: {n: 1, total: 4}\neval: {model: {engine: oracle}, benchmarks: {b: {kind: synthetic, count: 1}}}\n"
        "ablate:\n  mix.order: [shuffle, '']\n"
    )
    res = otbuild(project, "validate", "grid")
    assert res.returncode == 2 and "error: ablate candidate [mix.order=]: " in res.stderr, res.stderr
    (project / "loop").symlink_to(project / "loop")
    (project / "recipes" / "loop.yaml").write_text("sources:\n  h: {kind: harbor-parquet, rank: 1, path: loop}\n")
    res = otbuild(project, "validate", "loop")
    assert res.returncode == 2 and "loop.yaml: sources.h.path: cannot resolve" in res.stderr, res.stderr
    (project / "artifacts" / "nostage" / "x").mkdir(parents=True)
    for path, why in (
        ("artifacts/mix/0123456789abcdef/tasks.parquet", "no such file or folder"),
        ("artifacts/nostage/x", "not inside an artifact dir"),
        ("loop", "cannot resolve the path"),
    ):
        res = otbuild(project, "audit", path)
        assert res.returncode == 2 and f"error: {path}: {why}" in res.stderr, res.stderr


def test_a_stage_that_makes_nothing_fails_with_its_reason(project):
    (project / "empty" / "not_a_task").mkdir(parents=True)
    spec = (
        '{"id": "0123456789abcdef", "stage": "source", "inputs": [], "outdir": "artifacts/source/0123456789abcdef", '
        f'"settings": {{"name": "h", "kind": "harbor-dir", "path": "{project}/empty", "allow_empty": false}}}}'
    )
    res = otbuild(project, "stage", "source", "--spec", spec)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert (
        f"error: source 'h': no usable item in {project}/empty: 1 quarantined (1 missing instruction.md" in res.stderr
    )
    assert not (project / "artifacts" / "source" / "0123456789abcdef" / "provenance.json").exists()


def test_validate_warns_about_sampling_settings_a_reasoning_model_is_not_sent(project):
    llm = "{engine: openai, base_url: 'http://x/v1', model: MODEL, kind: askllm, temperature: 0}"
    recipe = (
        "sources:\n  a: {kind: synthetic, count: 3}\ntask_filter: {llm: %s, score: {column: llm_score, top_k: 2}}\n"
    )
    (project / "recipes" / "r.yaml").write_text(recipe % llm.replace("MODEL", "gpt-5-nano"))
    res = otbuild(project, "validate", "r")
    assert res.returncode == 0 and "gpt-5-nano is a reasoning model: temperature not sent" in res.stderr, res.stderr
    (project / "recipes" / "r.yaml").write_text(recipe % llm.replace("MODEL", "Qwen/Qwen3-8B"))
    assert "reasoning model" not in otbuild(project, "validate", "r").stderr
