"""The stage registry answers what the other parts ask of a stage: a stage registered with its
traits is estimated, shown in the report's funnel and filters, and compared by a rebuild without
any other file naming it; a stage the estimate cannot answer for fails at import."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from otbuild import duck
from otbuild.report.data import Artifact, _group, final_tasks, funnel
from otbuild.rebuild import compare
from otbuild.settings import stages as s
from otbuild.stages import STAGES, StageDef
from tests.conftest import REPO

DEDUPE = StageDef("dedupe", 1, ("kept.parquet", "rejected.parquet"), "otbuild.stages.task_filter", s.TaskFilter,
                  tasks=True, filter=True, volatile={"kept.parquet": ("scored_at",)}, counts={"tasks_kept": "rows"})


@pytest.fixture
def dedupe(monkeypatch):
    monkeypatch.setitem(STAGES, "dedupe", DEDUPE)
    return DEDUPE


def test_a_stage_the_estimate_cannot_answer_for_fails_at_import():
    code = ("from otbuild.stages import STAGES, StageDef\n"
            "STAGES['dedupe'] = StageDef('dedupe', 1, ('kept.parquet',), 'x', dict)\n"
            "import otbuild.estimate.model\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=False)
    assert proc.returncode != 0 and "no estimate for stage(s) dedupe" in proc.stderr


def test_every_stage_answers_the_registry_hooks():
    from otbuild.estimate.model import Model
    from otbuild.traces.table import VOLATILE_COLUMNS

    for name, d in STAGES.items():
        assert callable(getattr(Model, f"_{name}", None)), name
        assert not (d.tasks and d.traces), f"{name}: a task table or a trace table, not both"
        if d.training:
            assert d.curve and "train_log.jsonl" in d.volatile, name
        if d.trials and "traces.parquet" in d.outputs:  # trials it ran: their clock is in the traces
            assert set(VOLATILE_COLUMNS) <= set(d.volatile["traces.parquet"]), name
    assert funnel() == ["source", "augment", "mix", "task_score", "task_filter", "trace_import", "rollout",
                        "trace_filter"]


def _artifact(tmp_path, label: str, stage: str, rows: int, stats: dict | None = None) -> Artifact:
    d = tmp_path / stage / label.replace("/", "_")
    d.mkdir(parents=True)
    out = d / STAGES[stage].outputs[0]
    record = {"outputs": [{"path": str(out), "rows": rows}], "stats": stats or {}, "settings": {}}
    return Artifact(label, label, stage, label, d, record)


def test_a_registered_stage_is_in_the_funnel_and_the_filters(tmp_path, dedupe):
    arts = [_artifact(tmp_path, "sources/a", "source", 10), _artifact(tmp_path, "sources/b", "source", 5),
            _artifact(tmp_path, "dedupe", "dedupe", 12, {"rejected": 3, "rejected_by_reason": {"duplicate": 3}})]
    g = _group(duck.connect(), None, arts)
    assert [(x.name, x.rows, x.rejected, x.reasons) for x in g.funnel] == [
        ("sources (2)", 15, None, {}), ("dedupe", 12, 3, {"duplicate": 3})]
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
    saved = {"stages": {"dedupe": {"stage": "dedupe", "built": False, "counts": {"tasks_kept": span, "other": span},
                                   **dict.fromkeys(("requests", "input_tokens", "output_tokens", "cost"))}}}
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
