"""A stage-wise search (docs/search.md): each stage's candidates built and ranked, the winner
decided by the recipe's rules and fixed for the next stage, all in one `snakemake` call.

The slow test builds the search beside the session's smoke build (a copy of its project): its
stage 1 is the smoke's student against the smoke's untrained base, whose artifacts it shares."""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from otbuild.errors import StageError
from otbuild.plan import plan_recipe
from otbuild.recipe.load import load_recipe
from otbuild.stages.decide import DecideSettings
from otbuild.stagekit import Inputs
from otbuild.stages.decide import read_decision, run
from tests.conftest import REPO, job_counts, otbuild, snakemake

RECIPE = "thesis_search"


def finished(log: str) -> Counter:
    """The jobs a run finished, per rule (the job stats it starts with hold only what it knew
    before a checkpoint grew the DAG)."""
    return Counter(re.findall(r"Finished jobid: \d+ \(Rule: (\w+)\)", log))


def _summaries(tmp_path, scores: dict[str, tuple[float | None, float | None, int]]):
    """A ranking and one eval summary per candidate: name -> (partial mean, its stderr, scored trials)."""
    paths = []
    for name, (mean, stderr, trials) in scores.items():
        p = tmp_path / f"{name}.parquet"
        pq.write_table(
            pa.table(
                {
                    "benchmark": ["b"],
                    "mean": [mean],
                    "stderr": [stderr],
                    "partial_mean": [mean],
                    "partial_stderr": [stderr],
                    "repeats": [2],
                    "n_tasks": [trials // 2],
                    "n_excluded": [0],
                }
            ),
            p,
        )
        paths.append(p)
    order = sorted((n for n in scores if scores[n][0] is not None), key=lambda n: -scores[n][0])
    ranking = tmp_path / "ranking.parquet"
    pq.write_table(
        pa.table(
            {
                "candidate": list(scores),
                "rank": [order.index(n) + 1 if n in order else None for n in scores],
                "mean_z": [0.0] * len(scores),
            }
        ),
        ranking,
    )
    return Inputs.of(rank=[ranking], eval=paths)


def _decide(tmp_path, scores, default: str = "a", **rules) -> dict:
    cfg = DecideSettings(
        step=1,
        default=default,
        metric="partial_credit",
        candidates=[{"name": n, "values": {"k": n}} for n in scores],
        **rules,
    )
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    run(cfg, _summaries(tmp_path, scores), out)
    return json.loads((out / "decision.json").read_text())


def test_a_separated_leader_wins(tmp_path):
    d = _decide(tmp_path, {"a": (0.2, 0.02, 200), "b": (0.5, 0.03, 200)}, min_trials=150, margin_se=2.0)
    assert (d["winner"], d["decided"], d["values"]) == ("b", True, {"k": "b"})
    assert d["margin"] == pytest.approx(0.3 / (0.02**2 + 0.03**2) ** 0.5)


def test_too_few_trials_or_no_separation_keep_the_default_and_say_why(tmp_path):
    few = _decide(tmp_path, {"a": (0.2, 0.01, 100), "b": (0.5, 0.01, 100)}, min_trials=150)
    assert (few["winner"], few["decided"]) == ("a", False) and "100 scored trials" in few["reason"]
    close = _decide(tmp_path, {"a": (0.40, 0.05, 200), "b": (0.45, 0.05, 200)}, margin_se=2.0)
    assert (close["winner"], close["decided"], close["leader"]) == ("a", False, "b")
    assert "not more than decision.margin_se (2)" in close["reason"]
    unknown = _decide(tmp_path, {"a": (0.40, None, 200), "b": (0.9, None, 200)}, min_trials=0)
    assert not unknown["decided"]  # no standard error: not separated


def test_strict_makes_an_undecided_stage_an_error(tmp_path):
    with pytest.raises(StageError, match="search stage 1 is undecided .* decision.strict is true"):
        _decide(tmp_path, {"a": (0.40, 0.05, 200), "b": (0.45, 0.05, 200)}, strict=True)
    assert not (tmp_path / "out" / "decision.json").exists()


def test_no_complete_candidate_is_never_a_winner(tmp_path):
    d = _decide(tmp_path, {"a": (None, None, 0), "b": (None, None, 0)}, default="b", min_trials=0)
    assert (d["winner"], d["decided"]) == ("b", False) and "no candidate has a score" in d["reason"]


def _project(project, text: str | None = None):
    shutil.copy(REPO / "recipes" / "smoke.yaml", project / "recipes")
    if text is None:
        shutil.copy(REPO / "recipes" / f"{RECIPE}.yaml", project / "recipes")
    else:
        (project / "recipes" / f"{RECIPE}.yaml").write_text(text)
    return project


@pytest.mark.parametrize(
    "edit, error",
    [
        ({"ablate": {"sft.max_steps": [1, 2]}}, "search: a recipe has `ablate` or `search`, not both"),
        ({"search": [{"sft.max_steps": [0, 1]}, {"sft.max_steps": [2]}]}, "search[1].sft.max_steps: stage 1 already"),
        ({"eval": None}, "search: each stage's candidates are ranked by their eval scores"),
        ({"search": [{"sft.max_stepz": [0, 1]}]}, "search stage 1 candidate [sft.max_stepz=0]: "),
    ],
)
def test_a_search_that_cannot_run_is_refused_naming_the_key(project, edit, error):
    doc = {**yaml.safe_load((REPO / "recipes" / f"{RECIPE}.yaml").read_text()), **edit}
    _project(project, yaml.safe_dump(doc))
    res = otbuild(project, "validate", RECIPE)
    assert res.returncode == 2 and error in res.stdout + res.stderr, res.stdout + res.stderr


def test_the_plan_shows_decided_and_pending_stages_and_a_dry_run_stops_at_the_decision(project):
    _project(project)
    loaded = load_recipe(RECIPE, project)
    plan = plan_recipe(loaded)
    assert [s.step for s in plan.search] == [1] and plan.pending.candidates == ["sft.max_steps=0", "sft.max_steps=1500"]
    assert plan.pending.default == "sft.max_steps=1500"  # the recipe's own value
    full = plan_recipe(loaded, assume_defaults=True)  # as if each default won: stage 2 planned too
    ev = {n.label: n.id for n in full.nodes if n.stage == "eval"}
    assert ev["search/2/eval.temperature=0.5/eval"] == ev["search/1/sft.max_steps=1500/eval"]  # shared
    assert len(set(ev.values())) == 3
    shown = otbuild(project, "plan", RECIPE).stdout
    assert "search stage 1 of 2 (sft.max_steps; 2 candidates): pending: builds sft.max_steps=0, " in shown
    assert (
        "search stage 2 of 2 (eval.temperature): pending: builds eval.temperature=0.5, eval.temperature=0.51 "
        "with the winners so far, once stage 1 is decided"
    ) in shown
    estimate = otbuild(project, "plan", RECIPE, "--estimate")
    assert estimate.returncode == 0 and "worst case" in estimate.stdout, estimate.stdout + estimate.stderr
    _, log = snakemake(project, "-n", RECIPE)
    ran = job_counts(log)
    assert ran["decide"] == 1 and ran["eval"] == 2 and "report" not in ran  # stage 2 is not known yet
    assert "checkpoint jobs, which will result in alteration of the DAG" in log


@pytest.mark.slow
def test_the_search_decides_stage_by_stage_in_one_call_and_rebuilds_only_what_an_edit_changes(smoke_build, tmp_path):
    project = tmp_path / "project"
    shutil.copytree(smoke_build[0], project, symlinks=True)  # the session's build stays as it is
    _project(project)
    ran = finished(snakemake(project, RECIPE)[1])
    out = project / "results" / RECIPE
    # stage 1, the thesis: the trained student earns credit where its untrained base earns none
    base = pq.read_table(out / "search/1/sft.max_steps=0/eval/summary.parquet").to_pylist()[0]
    student = pq.read_table(out / "search/1/sft.max_steps=1500/eval/summary.parquet").to_pylist()[0]
    assert base["repeats"] == student["repeats"] == 3 and base["n_tasks"] == 12
    assert base["mean"] == 0.0 and base["partial_mean"] == 0.0  # random weights do nothing useful
    assert student["mean"] > 0 and student["partial_mean"] > 0.05 and student["partial_stderr"] is not None
    traces = pq.read_table(out / "search/1/sft.max_steps=1500/eval/traces.parquet").to_pylist()
    first = traces[0]["conversations"][0]["content"]
    assert first.startswith("Solve the task in a Linux shell.") and len(first) < 1500  # the compact prompt
    # the path taken: stage 1 decided for the trained student, stage 2 undecided (the default kept)
    taken = json.loads((out / "search.json").read_text())
    assert taken["done"] and [(s["winner"], s["decided"]) for s in taken["stages"]] == [
        ("sft.max_steps=1500", True),
        ("eval.temperature=0.5", False),
    ]
    assert "not more than decision.margin_se (3)" in taken["stages"][1]["reason"]
    # stage 2's candidates carry stage 1's winner; the one equal to it is its artifacts
    plan = plan_recipe(load_recipe(RECIPE, project))
    ids = {n.label: n.id for n in plan.nodes}
    assert ids["search/2/eval.temperature=0.51/sft"] == ids["search/1/sft.max_steps=1500/sft"]
    assert ids["search/2/eval.temperature=0.5/eval"] == ids["search/1/sft.max_steps=1500/eval"]
    # the smoke's artifacts are the search's: its SFT, and its base's eval is stage 1's 0-step candidate
    smoke = {n.label: n.id for n in plan_recipe(load_recipe("smoke", project)).nodes}
    assert (ids["search/1/sft.max_steps=1500/sft"], ids["search/1/sft.max_steps=0/eval"]) == (
        smoke["sft"],
        smoke["base/eval"],
    )
    assert not {"sft", "rollout", "source", "trace_filter"} & set(ran)
    assert ran["eval_merge"] == 2 and ran["rank"] == 2 and ran["decide"] == 2, ran  # 4 candidates, 3 evals, 1 built
    # the winner as a plain recipe: the final candidate's artifacts, every one built
    winner = plan_recipe(load_recipe(out / "winner.yaml", project))
    assert {n.id for n in winner.nodes if n.stage != "report"} == {
        n.id for n in plan.nodes if n.label.startswith("search/2/eval.temperature=0.5/")
    }
    html = (out / "report" / "report.html").read_text()
    assert 'id="search"' in html and "UNDECIDED: default kept" in html and "(chosen)" in html
    audit = otbuild(project, "audit", RECIPE)
    assert audit.returncode == 0 and "search decisions" in audit.stdout, audit.stdout + audit.stderr
    # an edit of stage 2 rebuilds stage 2 onward only: one new eval, its ranking and decision
    text = (project / "recipes" / f"{RECIPE}.yaml").read_text()
    (project / "recipes" / f"{RECIPE}.yaml").write_text(text.replace("[0.5, 0.51]", "[0.5, 0.52]"))
    again = finished(snakemake(project, RECIPE)[1])
    assert again["eval"] == 1 and again["rank"] == 1 and again["decide"] == 1, again
    assert not {"sft", "rollout", "source", "trace_filter"} & set(again)
    assert read_decision(project / plan_recipe(load_recipe(RECIPE, project)).search[0].decide.dir)["decided"]
    # an edit of stage 1 that keeps its winner: its new candidate, ranking and decision, nothing after
    text = (project / "recipes" / f"{RECIPE}.yaml").read_text()
    (project / "recipes" / f"{RECIPE}.yaml").write_text(text.replace("[0, 1500]", "[0, 1500, 1]"))
    again = finished(snakemake(project, RECIPE)[1])
    assert again["sft"] == 1 and again["eval"] == 1 and again["rank"] == 1 and again["decide"] == 1, again
    taken = json.loads((out / "search.json").read_text())
    assert [s["winner"] for s in taken["stages"]] == ["sft.max_steps=1500", "eval.temperature=0.5"]
