"""The stage registry answers what the other parts ask of a stage: a stage registered with its
traits is estimated, shown in the report's funnel and filters, and compared by a rebuild without
any other file naming it; a stage the estimate cannot answer for fails at import."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from otbuild import duck
from otbuild.report.data import Artifact, _group, final_tasks, funnel
from otbuild.rebuild import compare
from otbuild.stages import STAGES, StageDef
from otbuild.stages.task_filter import TaskFilter
from tests.conftest import REPO

DEDUPE = StageDef(
    "dedupe",
    1,
    ("kept.parquet", "rejected.parquet"),
    "otbuild.stages.task_filter",
    TaskFilter,
    tasks=True,
    filter=True,
    volatile={"kept.parquet": ("scored_at",)},
    counts={"tasks_kept": "rows"},
)


@pytest.fixture
def dedupe(monkeypatch):
    monkeypatch.setitem(STAGES, "dedupe", DEDUPE)
    return DEDUPE


def test_a_stage_the_estimate_cannot_answer_for_fails_at_import():
    code = (
        "from otbuild.stages import STAGES, StageDef\n"
        "STAGES['dedupe'] = StageDef('dedupe', 1, ('kept.parquet',), 'x', dict)\n"
        "import otbuild.estimate.model\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=False)
    assert proc.returncode != 0 and "no estimate for stage(s) dedupe" in proc.stderr


def test_every_stage_answers_the_registry_hooks():
    from otbuild.estimate.model import GENERIC, Model
    from otbuild.traces.table import VOLATILE_COLUMNS

    for name, d in STAGES.items():
        assert callable(d.estimate) or (d.estimate in GENERIC and callable(getattr(Model, d.estimate))), name
        assert not (d.tasks and d.traces), f"{name}: a task table or a trace table, not both"
        if d.training:
            assert d.curve and "train_log.jsonl" in d.volatile, name
        if d.trials and "traces.parquet" in d.outputs:  # trials it ran: their clock is in the traces
            assert set(VOLATILE_COLUMNS) <= set(d.volatile["traces.parquet"]), name
    assert funnel() == [
        "source",
        "augment",
        "mix",
        "near_dedup",
        "task_check",
        "difficulty",
        "task_score",
        "skills",
        "task_filter",
        "trace_import",
        "rollout",
        "trace_filter",
    ]


def _artifact(tmp_path, label: str, stage: str, rows: int, stats: dict | None = None) -> Artifact:
    d = tmp_path / stage / label.replace("/", "_")
    d.mkdir(parents=True)
    out = d / STAGES[stage].outputs[0]
    record = {"outputs": [{"path": str(out), "rows": rows}], "stats": stats or {}, "settings": {}}
    return Artifact(label, label, stage, label, d, record)


def test_a_registered_stage_is_in_the_funnel_and_the_filters(tmp_path, dedupe):
    arts = [
        _artifact(tmp_path, "sources/a", "source", 10),
        _artifact(tmp_path, "sources/b", "source", 5),
        _artifact(tmp_path, "dedupe", "dedupe", 12, {"rejected": 3, "rejected_by_reason": {"duplicate": 3}}),
    ]
    g = _group(duck.connect(), None, arts)
    assert [(x.name, x.rows, x.rejected, x.reasons) for x in g.funnel] == [
        ("sources (2)", 15, None, {}),
        ("dedupe", 12, 3, {"duplicate": 3}),
    ]
    assert [a.stage for a in g.filters] == ["dedupe"] and final_tasks(arts).stage == "dedupe"


def test_a_rebuild_sets_aside_what_a_registered_stage_declares_volatile(tmp_path, dedupe):
    built, again = tmp_path / "built", tmp_path / "again"
    for d, at in ((built, "t1"), (again, "t2")):
        d.mkdir()
        pq.write_table(pa.table({"task_id": ["a"], "scored_at": [at]}), d / "kept.parquet")
    record = {"outputs": [{"path": str(built / "kept.parquet")}]}
    o = compare("dedupe", record, built, again)
    assert o.result == "identical" and o.notes == ["kept.parquet: set aside scored_at"]
    pq.write_table(pa.table({"task_id": ["b"], "scored_at": ["t2"]}), again / "kept.parquet")
    assert compare("dedupe", record, built, again).result == "differs"


def test_the_report_checks_a_registered_stage_s_counts_against_its_estimate(tmp_path, dedupe):
    from otbuild.report.costs import Costs
    from otbuild.report.estimate import compare as against_estimate

    span = {"estimate": 10.0, "low": 5.0, "high": 20.0}
    saved = {
        "stages": {
            "dedupe": {
                "stage": "dedupe",
                "built": False,
                "counts": {"tasks_kept": span, "other": span},
                **dict.fromkeys(("requests", "input_tokens", "output_tokens", "cost")),
            }
        }
    }
    rows = against_estimate(saved, [_artifact(tmp_path, "dedupe", "dedupe", 8)], Costs(), tmp_path)
    assert [(r["label"], r["metric"], r["actual"]) for r in rows] == [("dedupe", "tasks_kept", 8)]


def test_the_plan_names_each_input_and_the_job_reads_them_by_name():
    """The paper recipe's task filter reads its tasks and, to decontaminate, the held-out
    benchmarks (both task tables): the spec names which is which; the eval's checkpoint is named
    as such beside its benchmarks."""
    from otbuild.plan import plan_recipe
    from otbuild.recipe.load import load_recipe
    from otbuild.runner import _job

    nodes = {n.label: n for n in plan_recipe(load_recipe("otagent_v2_100k", REPO)).nodes}
    spec = nodes["task_filter"].spec()
    against = nodes["task_filter"].config.decontaminate.against
    assert [i["name"] for i in spec["inputs"]] == ["tasks", *["held_out"] * len(against)]
    _, _, inputs, _ = _job(spec)
    assert [p.parts[-3] for p in inputs.named("held_out")] == ["source"] * len(against)
    assert inputs.named("tasks") == [nodes["task_filter"].inputs[0].main_output]
    names = [i["name"] for i in nodes["eval"].spec()["inputs"]]
    assert names[-1] == "checkpoint" and set(names[:-1]) == {"tasks"}


# Where code outside a stage's own module still names a stage, and why a trait or hook does not
# answer there: (file, stage) -> (how many, why). A new switch on a stage's name fails below.
NAMED = {
    ("otbuild/report/data.py", "mix"): (1, "the report's mix section: tasks per source"),
    ("otbuild/report/data.py", "eval"): (1, "the report's eval section: scores per benchmark"),
    ("otbuild/report/page.py", "mix"): (1, "the report's sections (charts), named as their stages"),
    ("otbuild/report/page.py", "eval"): (1, "the report's sections (charts), named as their stages"),
    ("otbuild/report/__init__.py", "mix"): (1, "the report's sections in its stats"),
    ("otbuild/report/__init__.py", "eval"): (1, "the report's sections in its stats"),
    ("otbuild/cli.py", "sft"): (1, "`otbuild export llamafactory`: the handoff of the SFT stage"),
    ("otbuild/cli.py", "rl"): (1, "`otbuild export skyrl`: the handoff of the RL stage"),
    ("otbuild/train/__main__.py", "sft"): (1, "the trainer's own commands (python -m otbuild.train sft|rl)"),
    ("otbuild/train/__main__.py", "rl"): (1, "the trainer's own commands (python -m otbuild.train sft|rl)"),
    # `otbuild probe` is a recipe of these stages by design: its sources, validated, piloted
    ("otbuild/probe.py", "source"): (1, "`otbuild probe`: its table's tasks per source"),
    ("otbuild/probe.py", "task_check"): (1, "`otbuild probe`: its table's valid share, read from task_check"),
    ("otbuild/probe.py", "difficulty"): (
        3,
        "`otbuild probe`: the teacher's fields its pilot takes, its table's pass rates, the pilot's "
        "trial rates lent to the teacher's estimate",
    ),
}


def python_source(path: Path) -> str:
    """A module's source; a Snakefile's (`Snakefile`, `*.smk`) as the Python Snakemake compiles it
    to (a rule `NAME:` is `@workflow.rule(name='NAME', ...)`, its directives calls)."""
    if path.suffix == ".py":
        return path.read_text()
    from types import SimpleNamespace

    from snakemake.parser import parse

    source = SimpleNamespace(get_path_or_uri=lambda secret_free=True: str(path))
    workflow = SimpleNamespace(sourcecache=SimpleNamespace(open=lambda _: path.open()))
    return parse(source, workflow, {})[0]


def stage_switches(root: Path) -> Counter:
    """(file, stage) -> how often code outside otbuild/stages/ (the Snakemake rules included)
    switches on a stage's name: a literal compared with something named *stage* or with a
    `.name`, a key of STAGES (or of anything *stage*), an argument of a *stage* function (but a
    StageDef's own name: declaring a stage, as the report's module does, is no switch on it), a
    *stage* keyword, a node made or looked up by its stage (a *node* function), a rule named
    after a stage or Snakemake's `checkpoints.NAME`, or one of two or more stage names in a
    tuple, list, set or dict's keys (a table by stage)."""
    names, out = set(STAGES), Counter()
    files = [*root.rglob("*.py"), *root.rglob("*.smk"), *root.rglob("Snakefile")]
    for path in sorted(files):
        if path.parent.name == "stages":
            continue
        src = python_source(path)
        tree = ast.parse(src)

        def text(n: ast.AST) -> str:
            return ast.unparse(n).lower()

        def lits(n: ast.AST) -> list[ast.Constant]:
            return [c for c in ast.walk(n) if isinstance(c, ast.Constant) and c.value in names]

        def about_stage(x: ast.AST) -> bool:
            return "stage" in text(x) or (isinstance(x, ast.Attribute) and x.attr == "name")

        found: dict[int, ast.Constant] = {}
        for n in ast.walk(tree):
            hits: list[ast.Constant] = []
            if isinstance(n, ast.Compare) and any(about_stage(x) for x in (n.left, *n.comparators)):
                hits = [c for x in (n.left, *n.comparators) for c in lits(x)]
            elif isinstance(n, ast.Subscript) and "stage" in text(n.value):
                hits = lits(n.slice)
            elif (
                isinstance(n, ast.Call)
                and text(n.func) != "stagedef"
                and any(w in text(n.func).rsplit(".", 1)[-1] for w in ("stage", "node"))
            ):
                hits = [a for a in (*n.args, *(k.value for k in n.keywords)) if a in lits(a)]
            elif isinstance(n, ast.Call) and text(n.func) in ("workflow.rule", "workflow.checkpoint"):
                hits = [c for k in n.keywords if k.arg == "name" for c in lits(k.value)]
            elif isinstance(n, ast.keyword) and "stage" in (n.arg or ""):
                hits = lits(n.value)
            elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "checkpoints":
                hits = [ast.Constant(n.attr)] if n.attr in names else []
            elif isinstance(n, ast.Tuple | ast.List | ast.Set | ast.Dict):
                elts = n.keys if isinstance(n, ast.Dict) else n.elts
                firsts = [e.elts[0] if isinstance(e, ast.Tuple) and e.elts else e for e in elts]
                table = [e for e in firsts if isinstance(e, ast.Constant) and e.value in names]
                hits = table if len(table) >= 2 else []
            found.update((id(c), c) for c in hits)
        out.update((path.relative_to(root.parent).as_posix(), c.value) for c in found.values())
    return out


def test_code_outside_the_stages_names_a_stage_only_where_no_trait_answers():
    found = stage_switches(REPO / "otbuild")
    allowed = Counter({k: n for k, (n, _) in NAMED.items()})
    new = {k: n - allowed[k] for k, n in found.items() if n > allowed[k]}
    assert not new, f"code switches on a stage's name where a trait or hook should answer: {new}"
    assert sum(found.values()) < 20
    stale = {k for k in NAMED if found[k] < NAMED[k][0]}
    assert not stale, f"NAMED lists more than there is (lower it): {stale}"


def test_the_switch_finder_sees_each_form(tmp_path):
    pkg = tmp_path / "otbuild"
    pkg.mkdir()
    (pkg / "x.py").write_text(
        'if n.stage == "mix": pass\nSTAGES["sft"]\nrun_stage("rl")\n'
        'RATES = {("eval", "k"): 1, ("rank", "k"): 2}\nrow = {"source": 1}\nSTAGE = StageDef("report", 1)\n'
    )
    (pkg / "rules").mkdir()
    (pkg / "rules" / "x.smk").write_text(
        'for d in (d for d in STAGES.values() if d.name != "report"):\n    pass\n\n\n'
        'rule decide:\n    params:\n        stage="decide",\n    run:\n'
        '        WF.node("augment", 1)\n        checkpoints.task_score.get()\n'
    )
    smk = {("otbuild/rules/x.smk", s): n for s, n in (("report", 1), ("decide", 2), ("augment", 1), ("task_score", 1))}
    py = {("otbuild/x.py", s): 1 for s in ("mix", "sft", "rl", "eval", "rank")}
    assert stage_switches(pkg) == Counter(py | smk)
