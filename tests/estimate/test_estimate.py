"""`otbuild plan --estimate`: counts that follow the plan, the paper's SFT figure scaled to the
100K recipe and checked against profiles/slurm, assumptions named with how far each moves the
total, bad input refused; and (slow) a pilot's estimate of a 2x larger variant against that
variant's real build (docs/estimate.md)."""

from __future__ import annotations

import json
import math
import shutil
import time

import pytest
import yaml

from otbuild.span import Span, mean_span, rate_span, ratio_span
from tests.conftest import REPO, make_project, otbuild, snakemake


def _estimate(project, *args) -> dict:
    proc = otbuild(project, "plan", "--estimate", *args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def paper(tmp_path):
    project = make_project(tmp_path)
    shutil.copy(REPO / "recipes" / "otagent_v2_100k.yaml", project / "recipes")
    return project


def test_the_paper_sft_figure_scaled_to_the_100k_recipe_is_flagged_against_the_profile(paper):
    """160 GPU-hours per 10K-trace 8B SFT (7 epochs) scaled to 32B, 100K traces and 5 epochs:
    ~4,570 GPU-hours, ~12 days on profiles/slurm's 16 GPUs, which grant 48 h x 2 attempts."""
    est = _estimate(paper, "otagent_v2_100k", "--profile", "slurm")
    sft = est["stages"]["sft"]
    assert sft["counts"]["traces"]["estimate"] == 100_000
    assert sft["counts"]["tokens_to_train_on"]["estimate"] == 100_000 * 16_000 * 5
    assert 4_400 < sft["gpu_hours"]["estimate"] < 4_700
    assert sft["gpu_hours"]["low"] < sft["gpu_hours"]["estimate"] < sft["gpu_hours"]["high"]
    days = sft["wall_seconds"]["estimate"] / 86400
    assert 11 < days < 12.5, days
    assert sft["jobs"][0]["gpus"] == 16 and sft["jobs"][0]["runtime_s"] == 48 * 3600 and sft["jobs"][0]["attempts"] == 2
    flag = next(f for f in est["profile_flags"] if f.startswith("sft:"))
    assert "retries: 5" in flag and "48 GPUs (nodes: 12 of 4)" in flag and "set-resources.sft.runtime" in flag
    # the counts follow the plan: mix total, ceil(budget / keep_rate) rollouts, repeats x benchmarks
    st = est["stages"]
    assert st["mix"]["counts"]["tasks"]["estimate"] == 50_000
    assert st["task_filter"]["counts"]["rollouts_planned"]["estimate"] == 100_000
    assert st["teacher"]["counts"]["trials"]["estimate"] == 100_000
    assert st["task_score"]["requests"]["estimate"] == 50_000
    assert st["eval"]["counts"]["trials"]["estimate"] == 3 * 3 * 100  # assumed 100 tasks per benchmark
    teacher_jobs = st["teacher"]["jobs"][0]
    assert teacher_jobs["count"] == 64 and teacher_jobs["gpus"] == 4
    # every rate here is assumed (no pilot): each is named with how far it moves the total
    assumed = {f"{a['stage']}.{a['rate']}": a for a in est["assumptions"]}
    for key in (
        "sft.gpu_seconds_per_token",
        "sft.tokens_per_trace",
        "rollout.seconds_per_trial",
        "trace_filter.keep_rate",
        "source.tasks",
    ):
        assert key in assumed, sorted(assumed)
    top = est["assumptions"][0]
    assert (
        top["totals_at_high"]["gpu_hours"] > est["total"]["gpu_hours"]["estimate"] > top["totals_at_low"]["gpu_hours"]
    )
    assert all(r["assumed"] for s in st.values() for r in s["rates"])
    assert any("keep rate is assumed" in w for w in est["warnings"])
    assert (paper / ".otbuild" / "estimates" / "otagent_v2_100k.json").is_file()


def test_counts_follow_the_plan(tmp_path):
    project = make_project(tmp_path)
    (project / "recipes" / "r.yaml").write_text(
        yaml.safe_dump(
            {
                "sources": {
                    "a": {"kind": "synthetic", "rank": 1, "count": 30, "seed": 1},
                    "b": {"kind": "synthetic", "rank": 2, "count": 10, "seed": 2},
                },
                "mix": {"n": 2, "total": 40},
                "task_filter": {
                    "score": {"column": "metadata.difficulty", "budget": 90, "keep_rate": 0.8},
                    "sample": {"n": 20},
                },
                "teacher": {
                    "engine": "openai",
                    "model": "m",
                    "base_url": "http://127.0.0.1:9/v1",
                    "shards": 3,
                    "max_episodes": 4,
                    "max_tokens": 100,
                    "concurrency": 5,
                },
                "trace_filter": {"sample": {"n": 50}},
                "sft": {"model": {"kind": "tiny"}, "epochs": 3, "cutoff_len": 2000},
                "prices": {"m": {"input_per_mtok": 1.0, "output_per_mtok": 10.0}},
            }
        )
    )
    est = _estimate(project, "r")
    st = est["stages"]
    assert st["sources/a"]["counts"]["tasks"]["estimate"] == 30
    assert st["task_filter"]["counts"]["tasks_kept"]["estimate"] == 20  # sample.n caps 40 x keep rate
    assert st["task_filter"]["counts"]["rollouts_planned"]["estimate"] == math.ceil(90 / 0.8)
    teacher = st["teacher"]
    assert teacher["counts"]["trials"]["estimate"] == 113
    # requests = trials x turns, the assumed 30 turns capped at max_episodes 4
    assert teacher["requests"] == {"estimate": 452, "low": 452, "high": 452}
    assert teacher["output_tokens"]["estimate"] == 452 * 100  # 1,500 assumed, capped at max_tokens
    cost = teacher["input_tokens"]["estimate"] * 1.0 / 1e6 + teacher["output_tokens"]["estimate"] * 10.0 / 1e6
    assert teacher["cost"]["estimate"] == pytest.approx(cost, abs=0.01)
    assert [j["count"] for j in teacher["jobs"]] == [3, 1]  # three shards and the merge
    # the trace filter keeps the recipe's planned rate (0.8) of 113 up to sample.n = 50
    assert st["trace_filter"]["counts"]["traces_kept"]["estimate"] == 50
    sft = st["sft"]["counts"]
    assert sft["tokens_to_train_on"]["estimate"] == 50 * 2000 * 3  # 16K tokens a trace, cut at cutoff_len
    assert est["total"]["cost"]["estimate"] == pytest.approx(cost, abs=0.01)


def test_bad_input_is_exit_2_naming_what(tmp_path):
    project = make_project(tmp_path)
    shutil.copy(REPO / "recipes" / "smoke.yaml", project / "recipes")
    proc = otbuild(project, "plan", "--estimate", "smoke", "--from", "smoke")
    assert proc.returncode == 2
    assert "the pilot is not built" in proc.stderr and "sources/synth_files (artifacts/source/" in proc.stderr
    for args, says in (
        (["--from", "nosuch"], "nosuch.yaml: no such recipe"),
        (["--profile", "nosuch"], "--profile nosuch"),
    ):
        proc = otbuild(project, "plan", "--estimate", "smoke", *args)
        assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    proc = otbuild(project, "plan", "smoke", "--json")
    assert proc.returncode == 2 and "go with --estimate" in proc.stderr
    assert not (project / ".otbuild" / "estimates").exists()


def test_ranges_from_a_sample():
    assert mean_span([2.0, 2.0, 2.0]) == Span(2.0, 2.0, 2.0)
    wide, narrow = mean_span([1.0, 3.0] * 5), mean_span([1.0, 3.0] * 50)
    assert wide.low < narrow.low < 2.0 < narrow.high < wide.high
    small, big = rate_span(6, 10), rate_span(600, 1000)  # Wilson: narrower with the sample
    assert small.low < big.low < 0.6 < big.high < small.high and small.high <= 1.0
    assert (Span(1, 0.5, 2) * Span(10, 10, 10)).cap(15) == Span(10, 5, 15)
    pooled = ratio_span([100.0, 1000.0], [1.0, 5.0])  # tokens of a 1-request and a 5-request trial
    assert pooled.estimate == 1100 / 6 and pooled.low < pooled.estimate < pooled.high


def test_a_pilot_measures_every_filter_s_keep_rate_by_its_reasons():
    """Any filter stage's record gives its keep rate; its caps count as kept, drops that follow
    from an earlier stage are left out (StageDef.keep_rate_reasons)."""
    from types import SimpleNamespace

    from otbuild.estimate.pilot import _keep_rate

    def rate(stage, kept, reasons):
        stats = {"kept": kept, "rejected": sum(reasons.values()), "rejected_by_reason": reasons}
        m = _keep_rate(SimpleNamespace(stage=stage), stats, "pilot")["keep_rate"]
        return m.rate().value.estimate, m.n

    assert rate("near_dedup", 90, {"near_duplicate": 10}) == (0.9, 100)
    assert rate("task_filter", 50, {"not_sampled": 30, "too_short": 20}) == (0.8, 100)
    assert rate("trace_filter", 40, {"duplicate": 50, "too_few_turns": 10}) == (0.8, 50)
    assert _keep_rate(SimpleNamespace(stage="near_dedup"), {}, "pilot") == {}


@pytest.mark.slow
def test_a_pilot_s_estimate_of_a_2x_variant_holds_when_it_is_built(tmp_path, monkeypatch):
    """The pilot is smoke without RL, built here; `bigger` has 2x its tasks (48), two samples per
    task, 12 held-out tasks x 2 repeats. Estimated from the pilot before it is built, then built
    right after it (the same machine load: its times are the pilot's): trials, requests and tokens
    within 10 %, wall time within 35 %; the report shows both columns."""
    from otbuild.report.estimate import compare, load_saved
    from otbuild.plan import plan_recipe
    from otbuild.recipe.load import load_recipe
    from otbuild.report import costs
    from otbuild.report.data import artifacts

    project = make_project(tmp_path)
    recipe = yaml.safe_load((REPO / "recipes" / "smoke.yaml").read_text())
    del recipe["rl"]  # the eval serves the SFT checkpoint
    # the estimate is tested, not the student: a short SFT (6 steps of 8 traces), no untrained
    # base, and answers not held to the JSON frame: an untrained student held to it ends its
    # trials after a number of turns only chance decides (requests 20-27 % apart, measured),
    # while free it fills every turn to max_tokens until max_episodes, as the pilot's did
    recipe["sft"] |= {"max_steps": 6, "global_batch_size": 8}
    recipe["eval"]["base"], recipe["task_filter"]["sample"] = False, {"n": 24, "seed": 0}
    recipe["harness"]["constrained_decoding"] = False
    # and no wall-clock cap on an eval trial: the smoke's 10 s cuts trials by the machine's load
    # (a loaded machine's first answers come after it: trials of 0 turns), which no rate predicts
    recipe["eval"]["agent_timeout_sec"] = 300
    recipe["eval"]["benchmarks"]["heldout"]["count"] = 6
    (project / "recipes" / "pilot.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    recipe["sources"]["synth_files"]["count"], recipe["sources"]["synth_more"]["count"] = 90, 48
    recipe["mix"]["total"], recipe["task_filter"]["sample"]["n"] = 120, 48
    recipe["teacher"]["samples_per_task"] = 2
    recipe["eval"]["benchmarks"]["heldout"]["count"], recipe["eval"]["repeats"] = 12, 2
    (project / "recipes" / "bigger.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    snakemake(project, "pilot")
    est = _estimate(project, "bigger", "--from", "pilot")
    assert est["pilots"] == ["pilot"]
    assert est["stages"]["teacher"]["counts"]["trials"]["estimate"] == 96
    assert not any(r["assumed"] for s in est["stages"].values() for r in s["rates"]), "a rate was not measured"
    # the same teacher without its verifier: the pilot's trials less their verifier's seconds, said in a note
    (project / "recipes" / "unverified.yaml").write_text(
        yaml.safe_dump({**recipe, "teacher": {**recipe["teacher"], "verify": False}}, sort_keys=False)
    )
    verified, unverified = (
        est["stages"]["teacher"],
        _estimate(project, "unverified", "--from", "pilot")["stages"]["teacher"],
    )
    assert any(x.startswith("teacher.verify: false: no verifier runs; the pilot's took") for x in unverified["notes"])
    assert {r["rate"] for r in unverified["rates"]} >= {"verifier_s_per_trial", "unverified_seconds_per_trial"}
    assert unverified["job_seconds"]["estimate"] < verified["job_seconds"]["estimate"]

    start = time.monotonic()
    snakemake(project, "bigger")
    wall = time.monotonic() - start

    monkeypatch.chdir(project)  # records name their files relative to the project
    cfg = plan_recipe(load_recipe("bigger", project)).nodes[-1].config
    arts = artifacts(cfg.nodes)
    rows = compare(load_saved("bigger"), arts, costs.collect(arts, cfg.prices))
    got = {(r["label"], r["metric"]): r for r in rows}

    def err(label, metric):
        return abs(got[(label, metric)]["error"])

    errors = {
        k: err(*k)
        for k in (
            ("teacher", "trials"),
            ("eval", "trials"),
            ("teacher", "requests"),
            ("total", "requests"),
            ("sft", "tokens_to_train_on"),
        )
    }
    tokens = sum(got[("total", k)]["estimate"] for k in ("input_tokens", "output_tokens"))
    actual = sum(got[("total", k)]["actual"] for k in ("input_tokens", "output_tokens"))
    errors["total tokens"] = abs(tokens - actual) / actual
    errors["wall"] = abs(est["total"]["wall_s"]["estimate"] - wall) / wall
    print(
        "estimate errors:",
        {k: f"{v:.1%}" for k, v in errors.items()},
        f"wall {wall:.0f} s",
        {f"{k[0]}.{k[1]}": f"{r['error']:+.1%}" for k, r in got.items() if r["error"] is not None},
    )
    assert all(v <= 0.10 for k, v in errors.items() if k != "wall"), errors
    assert errors["wall"] <= 0.35, errors
    html = (project / "results" / "bigger" / "report" / "report.html").read_text()
    assert "Estimate and actual" in html and "tokens_to_train_on" in html
    again = _estimate(project, "bigger", "--from", "pilot")  # now built: costs nothing
    assert all(s["built"] for s in again["stages"].values()) and again["total"]["requests"]["high"] == 0


def test_a_pilot_s_sft_rate_on_gpus_scales_to_the_target_s_parameters(paper, monkeypatch):
    """An 8B pilot trained on GPUs measured its device-seconds per token: the 32B target takes
    that rate x 4 (measured, not assumed); its own tokens per trace stay an assumption."""
    from otbuild.estimate.pilot import Measured, Pilot
    from otbuild.estimate.profile import find_profile
    from otbuild.estimate.run import estimate
    from otbuild.plan import plan_recipe
    from otbuild.recipe.load import load_recipe

    monkeypatch.chdir(paper)
    pilot = Pilot(
        "p8b",
        paper,
        {
            ("sft", "train:Qwen3-8B"): {
                "gpu_seconds_per_token": Measured(
                    "gpu_seconds_per_token",
                    "device-s per token",
                    "pilot p8b: sft",
                    span=Span(1e-4, 9e-5, 1.2e-4),
                    n=40,
                    per=8.0,
                )
            }
        },
    )
    est = estimate(plan_recipe(load_recipe("otagent_v2_100k", paper)), [pilot], find_profile("slurm", paper))
    sft = next(s for s in est.stages if s.stage == "sft")
    rate = next(r for r in sft.rates if r.name == "gpu_seconds_per_token")
    assert not rate.assumed and rate.value == Span(4e-4, 3.6e-4, 4.8e-4) and "x 4 for 32B" in rate.source
    tokens = sft.counts["tokens_to_train_on"].estimate
    assert sft.gpu_hours.estimate == pytest.approx((30 + tokens * 4e-4 / 16) * 16 / 3600)
