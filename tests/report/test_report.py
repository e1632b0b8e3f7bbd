"""The report stage: one self-contained HTML page and a dataset card, with numbers that are the
artifacts' own; rendered in headless Chromium; flagged for `snakemake --report`.

The slow tests build a real project (synthetic sources, oracle teacher, trace filter, eval with
the oracle, an ablation of two candidates) with the real snakemake CLI once per module. SFT and
RL are not in the DAG yet: their artifact dirs are written here by hand in the format of
otbuild/train/sft.py and otbuild/train/rl/ (train_log.jsonl, one line per optimizer step).
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from otbuild.plan import plan_recipe, report_node, report_settings
from otbuild.recipe.load import load_recipe
from otbuild.report import build, charts
from otbuild.report.page import _md_cell
from otbuild.sources.synthetic import generate
from otbuild.stages import STAGES
from tests.conftest import make_project, snakemake, write_source

CHROMIUM = Path("/usr/bin/chromium")

RECIPE = """
description: report test <script>alert("x")</script>
sources:
  alpha: {kind: synthetic, rank: 1, count: 12, seed: 1, families: [files, archive]}
  beta: {kind: synthetic, rank: 2, count: 8, seed: 2, families: [text, data]}
  leak: {kind: table, rank: 3, path: leak.csv, columns: {instruction: q}}  # two tasks' copies
mix: {n: 2, total: 20, order: shuffle, seed: 0}
task_filter: {dedup: true, instruction_chars: {min: 40, max: 8000}, sample: {n: 12, seed: 0},
              decontaminate: {against: [leak], ngram: 64}}
teacher: {engine: oracle, shards: 1, concurrency: 4}
trace_filter: {min_turns: 7}
eval:
  benchmarks:
    heldout: {kind: synthetic, count: 4, seed: 999}
    extra: {kind: synthetic, count: 3, seed: 7, families: [text, data]}
  repeats: 2
  concurrency: 4
  model: {engine: oracle}
"""
# max_episodes 3 is too few for some tasks: the candidates score differently (z = +1 / -1)
ABLATE = "extends: rep\nablate:\n  eval.max_episodes: [50, 3]\n"


# --- helpers ---------------------------------------------------------------------------------


class _Sections(HTMLParser):
    """Table rows (cell texts) and notes under each <h3 id>/<section id> of the page."""

    def __init__(self):
        super().__init__()
        self.rows: dict[str, list[list[str]]] = {}
        self.notes: dict[str, list[str]] = {}
        self.svgs: dict[str, int] = Counter()
        self.cur, self.section = "top", "top"
        self.cell: list[str] | None = None
        self.row: list[str] | None = None
        self.note: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("h3", "section") and a.get("id"):
            self.cur = a["id"]
        if tag == "h2":
            self.cur = self.section
        if tag == "section" and a.get("id"):
            self.section = a["id"]
        if tag == "tr":
            self.row = []
        if tag in ("td", "th") and self.row is not None:
            self.cell = []
        if tag == "p" and a.get("class") == "note":
            self.note = []
        if tag == "svg":
            self.svgs[self.cur] += 1
        if tag == "br" and self.cell is not None:
            self.cell.append(" ")

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.row.append(" ".join("".join(self.cell).split()))
            self.cell = None
        if tag == "tr" and self.row is not None:
            self.rows.setdefault(self.cur, []).append(self.row)
            self.row = None
        if tag == "p" and self.note is not None:
            self.notes.setdefault(self.cur, []).append("".join(self.note).strip())
            self.note = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)
        if self.note is not None:
            self.note.append(data)


def parse(html: str) -> _Sections:
    p = _Sections()
    p.feed(html)
    return p


def table(p: _Sections, section: str) -> dict[str, list[str]]:
    """Rows of a section's tables keyed by their first cell (header rows included)."""
    return {r[0]: r[1:] for r in p.rows[section]}


def rec(d: Path) -> dict:
    return json.loads((d / "provenance.json").read_text())


def rows_of(d: Path) -> int:
    return rec(d)["outputs"][0]["rows"]


def assert_self_contained(html: str) -> None:
    assert "<script" not in html.lower() and "<link" not in html.lower() and "<img" not in html.lower()
    assert "@import" not in html and "url(" not in html and not re.search(r"\ssrc\s*=\s*[\"']", html)
    assert set(re.findall(r"https?://[^\s\"'<>]+", html)) <= {"http://www.w3.org/2000/svg"}


def fake_training(project: Path, stage: str, steps: int, flat: bool = False, label: str | None = None) -> dict:
    """A checkpoint dir as otbuild/train writes it: train_log.jsonl + checkpoint.json + record.
    `flat`: an RL run without a learning signal (reward, loss and grad norm 0 at every step).
    `label`: another node than the stage's own (its id from the label)."""
    d = project / "artifacts" / stage / ("5f" * 8 if stage == "sft" else "7d" * 8 if flat else "6e" * 8)
    if label:
        d = d.with_name(label.encode().hex()[:16])
    d.mkdir(parents=True, exist_ok=True)
    lines = []
    for s in range(1, steps + 1):
        if flat:
            lines.append(
                {"step": s, "reward_mean": 0.0, "pass_rate": 0.0, "loss": 0.0, "grad_norm": 0.0, "kl": 0.0, "lr": 5e-6}
            )
        elif stage == "sft":  # otbuild/train/sft.py's keys
            lines.append(
                {
                    "step": s,
                    "epoch": round(s / 10, 4),
                    "loss": round(3.0 * math.exp(-s / 12) + 0.4, 6),
                    "lr": 4e-5 * min(1, s / 3),
                    "grad_norm": 1.0 / s,
                    "tokens": 900,
                    "supervised_tokens": 300,
                    "tokens_seen": 900 * s,
                    "supervised_tokens_seen": 300 * s,
                    "time": 0.5 * s,
                    "tokens_per_second": 1800.0 + s,
                }
            )
        else:  # otbuild/train/rl/'s keys
            lines.append(
                {
                    "step": s,
                    "reward_mean": round(0.2 + 0.6 * s / steps, 6),
                    "pass_rate": 0.5,
                    "loss": -0.01 * s,
                    "grad_norm": 0.3,
                    "kl": 0.0,
                    "lr": 5e-6,
                }
            )
    (d / "train_log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    tracking = (
        {"tensorboard": {"files": ["events.out.tfevents.1.host.1.0.sft"]}}
        if stage == "sft"
        else {"wandb": {"project": "lab", "id": f"rl-{d.name}", "dir": "/runs/wandb/offline-run-1-rl", "offline": True}}
    )
    (d / "checkpoint.json").write_text(json.dumps({"kind": stage, "steps": steps, "tracking": tracking}))
    (d / "provenance.json").write_text(
        json.dumps(
            {
                "stage": stage,
                "id": d.name,
                "settings": {},
                "inputs": [],
                "stats": {
                    "steps": steps,
                    **(
                        {
                            "llm_usage": {
                                "transformers:policy": {
                                    "requests": 8 * steps,
                                    "errors": 0,
                                    "input_tokens": 900 * steps,
                                    "output_tokens": 60 * steps,
                                }
                            }
                        }
                        if stage == "rl"
                        else {}
                    ),
                },
                "outputs": [{"path": str(d.relative_to(project) / "checkpoint.json"), "sha256": "0", "bytes": 1}],
            }
        )
    )
    return {"label": label or stage, "stage": stage, "id": d.name, "dir": str(d.relative_to(project)), "log": lines}


def fake_eval_of_zeros(
    project: Path, mean: float | None = 0.0, stderr: float | None = 0.0, label: str = "eval"
) -> dict:
    """An eval dir whose every trial scored 0 (the summary.parquet of otbuild/sql/eval_summary.sql);
    or the eval `label` of this mean ± stderr."""
    import pyarrow as pa

    d = project / "artifacts" / "eval" / ("0e" * 8 if label == "eval" else label.encode().hex()[:16])
    d.mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.Table.from_pylist(
            [
                {
                    "model": "transformers:artifacts/rl/" + "7d" * 8,
                    "benchmark": "heldout",
                    "mean": mean,
                    "stderr": stderr,
                    "partial_mean": mean,
                    "partial_stderr": stderr,
                    "repeats": 3,
                    "n_tasks": 6,
                    "n_exceptions": 0,
                    "n_task_failures": 0,
                    "n_timed_out": 0,
                    "n_excluded": 0,
                }
            ]
        ),
        d / "summary.parquet",
    )
    (d / "provenance.json").write_text(
        json.dumps({"stage": "eval", "id": d.name, "settings": {}, "inputs": [], "stats": {}, "outputs": []})
    )
    return {"label": label, "stage": "eval", "id": d.name, "dir": str(d.relative_to(project))}


def headline_and_page(project: Path, nodes: list[dict]):
    """The headline and the report page of a recipe whose plan nodes are `nodes` (in `project`)."""
    from otbuild.report.costs import collect
    from otbuild.report.data import artifacts
    from otbuild.report.headline import headline

    cfg = STAGES["report"].config({"recipe": "r", "nodes": nodes})
    cwd = Path.cwd()
    os.chdir(project)
    try:
        arts = artifacts(cfg.nodes)
        head = headline("r", arts, collect(arts, None))
        build(cfg, project / "report")
    finally:
        os.chdir(cwd)
    return head, (project / "report" / "report.html").read_text()


def test_a_run_that_warned_about_its_health_is_flagged_in_its_section(tmp_path):
    """A rollout merged with health.on_broken: warn (its trials one turn each): the report says
    so at the top and in the trace set's section, with the numbers its stats hold."""
    from otbuild.settings.stages import RolloutSettings
    from otbuild.stages import rollout
    from otbuild.traces.table import write_traces
    from tests.stagekit.test_failures import row

    d = tmp_path / "artifacts" / "rollout" / ("1a" * 8)
    write_traces(d / "shards" / "0-of-1.parquet", [row(str(i % 2), reward=i % 2, n_turns=1) for i in range(20)])
    cfg = RolloutSettings(engine="openai", base_url="http://127.0.0.1:9/v1", model="m", health={"on_broken": "warn"})
    stats = rollout.run(cfg, [], d)
    outputs = [{"path": str(d / "traces.parquet"), "rows": 20}]
    (d / "provenance.json").write_text(
        json.dumps({"stage": "rollout", "id": d.name, "settings": {}, "inputs": [], "stats": stats, "outputs": outputs})
    )
    node = {"label": "teacher", "stage": "rollout", "id": d.name, "dir": str(d.relative_to(tmp_path))}
    head, html = headline_and_page(tmp_path, [node])
    said = "The run looks broken: its 20 trials average 1 turns (health.max_mean_turns: 1.5)."
    assert head.warnings == [f"teacher: {said}"]
    traces = re.sub(r"<[^>]+>", "", html.split('id="recipe-traces"')[1].split("<h3")[0])
    assert said in traces and html.count('<p class="flag">') == 2  # at the top and in its section


def chromium(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp / 'chromium-profile'}",
            "--enable-logging=stderr",
            "--v=0",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


# --- a real project, built once ----------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """rep (one recipe with every section but training from the DAG, SFT and RL dirs added by
    hand) and rep_ablate (two candidates ranked), reports made by the report stage."""
    project = make_project(tmp_path_factory.mktemp("report_project"))
    copied = [next(generate(12, 1, ["files", "archive"], None)), next(generate(8, 2, ["text", "data"], None))]
    with open(project / "leak.csv", "w", newline="") as f:  # what decontamination must catch
        csv.writer(f).writerows([["q"], *([r.task.instruction] for r in copied)])
    (project / "recipes" / "rep.yaml").write_text(RECIPE)
    (project / "recipes" / "rep_ablate.yaml").write_text(ABLATE)
    snakemake(project, "rep", "rep_ablate")

    cwd = Path.cwd()
    os.chdir(project)  # stages run from the project root (artifact paths are relative)
    try:
        plans = {n: plan_recipe(load_recipe(project / "recipes" / f"{n}.yaml", project)) for n in ("rep", "rep_ablate")}
        nodes = {n: [x for x in p.nodes if x.stage != "report"] for n, p in plans.items()}
        # rep: through build() with SFT and RL dirs added to the nodes
        sft, rl = fake_training(project, "sft", 40), fake_training(project, "rl", 12)
        settings = report_settings("rep", nodes["rep"], resolved=plans["rep"].recipe.data).model_dump()
        settings["description"] = 'report test <script>alert("x")</script>'
        settings["nodes"] += [{k: v for k, v in t.items() if k != "log"} for t in (sft, rl)]
        settings["prices"] = {"policy": {"input_per_mtok": 1000.0, "output_per_mtok": 10000.0}}  # MODEL alone
        rep_out = project / "artifacts" / "report" / "rep"
        rep_stats = build(STAGES["report"].config(settings), rep_out)
        # flat: the same recipe, but its RL run learned nothing and its eval scored 0 everywhere
        flat_rl, zeros = fake_training(project, "rl", 3, flat=True), fake_eval_of_zeros(project)
        flat = report_settings("flat", [n for n in nodes["rep"] if n.stage != "eval"]).model_dump()
        flat["nodes"] += [{k: v for k, v in t.items() if k != "log"} for t in (sft, flat_rl, zeros)]
        build(STAGES["report"].config(flat), project / "artifacts" / "report" / "flat")
        # rep_ablate: as the rule will run it, a report node's spec through the stage runner
        from otbuild.runner import run_spec

        node = report_node("rep_ablate", nodes["rep_ablate"])
        record = run_spec(node.spec(), rule="report")
    finally:
        os.chdir(cwd)
    return {
        "project": project,
        "plans": plans,
        "nodes": nodes,
        "sft": sft,
        "rl": rl,
        "rep": rep_out,
        "flat": project / "artifacts" / "report" / "flat",
        "rep_stats": rep_stats,
        "ablate": project / node.dir,
        "node": node,
        "record": record,
    }


def _node_dir(built, recipe, label) -> Path:
    n = next(x for x in built["nodes"][recipe] if x.label == label)
    return built["project"] / n.dir


# --- the page ----------------------------------------------------------------------------


@pytest.mark.slow
def test_every_section_with_the_artifacts_numbers(built):
    html = (built["rep"] / "report.html").read_text()
    p = parse(html)
    assert_self_contained(html)
    assert built["rep_stats"]["sections"] == {
        "funnel": True,
        "mix": True,
        "traces": True,
        "sft": True,
        "rl": True,
        "eval": True,
        "ranking": False,
    }
    d = lambda label: _node_dir(built, "rep", label)

    # funnel: each step's rows are its provenance row count; filters show their rejections
    funnel = table(p, "recipe-funnel")
    sources = rows_of(d("sources/alpha")) + rows_of(d("sources/beta")) + rows_of(d("sources/leak"))
    assert funnel["sources (3) sources/alpha, sources/beta, sources/leak"][1] == str(sources)
    for label in ("mix", "task_filter", "teacher", "trace_filter"):
        assert funnel[label][1] == f"{rows_of(d(label)):,}", label
    for label in ("task_filter", "trace_filter"):
        stats = rec(d(label))["stats"]
        assert funnel[label][2] == str(stats["rejected"]) and stats["rejected"] > 0
        shown = {
            r.replace("contaminated by leak", "contaminated by leak (exact 2)"): n
            for r, n in stats["rejected_by_reason"].items()
        }  # which rules found the leaks
        assert funnel[label][3] == " ".join(f"{r}: {n}" for r, n in sorted(shown.items()))
    assert "min_turns" in rec(d("trace_filter"))["stats"]["rejected_by_reason"]
    assert rec(d("task_filter"))["stats"]["rejected_by_reason"]["contaminated by leak"] == 2
    assert rec(d("task_filter"))["stats"]["contaminated"] == {"leak": {"exact": 2, "ngram": 0, "fuzzy": 0}}

    # mix per source: counted in the mix parquet
    mixed = Counter(pq.read_table(d("mix") / "tasks.parquet", columns=["source"]).column("source").to_pylist())
    mix = table(p, "recipe-mix")
    assert {v[0]: int(v[1]) for k, v in mix.items() if k != "rank"} == dict(mixed)

    # trace set: the turn histogram and reward distribution of the kept traces
    kept = pq.read_table(d("trace_filter") / "kept.parquet", columns=["n_turns", "reward"]).to_pylist()
    turns = {k: int(v[0]) for k, v in table(p, "recipe-traces").items() if k not in ("turns", "mean")}
    assert turns == {str(t): n for t, n in Counter(r["n_turns"] for r in kept).items()}
    assert min(r["n_turns"] for r in kept) >= 7
    rewards = {k: int(v[0]) for k, v in table(p, "recipe-reward").items() if re.fullmatch(r"[-\d.e]+", k)}
    assert sum(rewards.values()) == len(kept) and rewards == {
        f"{r:.3g}": n for r, n in Counter(x["reward"] for x in kept).items()
    }

    # training curves: the logs' steps and values
    sft = table(p, "recipe-sft")
    assert sft["steps"] == ["40"] and sft["last"] == [charts.num(built["sft"]["log"][-1]["loss"])]
    assert sft["min"] == [charts.num(min(x["loss"] for x in built["sft"]["log"]))]
    assert sft["tokens_seen"] == [f"{900 * 40:,}"]
    rl = table(p, "recipe-rl")
    assert rl["steps"] == ["12"] and rl["last"] == [charts.num(built["rl"]["log"][-1]["reward_mean"])]
    assert rl["step"][:3] == ["reward_mean", "loss", "pass_rate"]
    # below each curve: lr, grad norm, tokens/s as logged; where TensorBoard and wandb have them
    html = (built["rep"] / "report.html").read_text()
    for title in (
        "SFT lr per step",
        "SFT grad_norm per step",
        "SFT tokens_per_second per step",
        "RL lr per step",
        "RL grad_norm per step",
    ):
        assert f"<title>{title}</title>" in html, title
    assert "RL tokens_per_second" not in html  # not in that log: no empty chart
    assert f"tensorboard --logdir {built['sft']['dir']}</code> (1 event file)" in html
    assert "run <code>rl-" + "6e" * 8 + "</code>, offline in" in html
    assert "wandb sync /runs/wandb/offline-run-1-rl" in html

    # eval: mean and stderr, partial credit and its stderr per benchmark from summary.parquet
    summary = pq.read_table(d("eval") / "summary.parquet").to_pylist()
    ev = table(p, "recipe-eval")
    for r in summary:
        assert ev[r["benchmark"]][:3] == [r["model"], charts.num(r["mean"]), charts.num(r["stderr"])]
        assert ev[r["benchmark"]][3:5] == [charts.num(r.get("partial_mean")), charts.num(r.get("partial_stderr"))]
        assert ev[r["benchmark"]][6] == str(r["n_tasks"])

    # one chart per section, each an inline SVG; no section is marked missing
    for section in ("recipe-funnel", "recipe-mix", "recipe-traces", "recipe-reward", "recipe-eval"):
        assert p.svgs[section] == 1, section
    assert p.svgs["recipe-sft"] == 1 + 3 and p.svgs["recipe-rl"] == 1 + 2  # the curve and its panels
    assert not any(v for k, v in p.notes.items() if k != "rebuilds"), p.notes  # nothing rebuilt yet here
    assert p.notes["rebuilds"] and "Not rebuilt yet" in p.notes["rebuilds"][0]
    # the rl run's rollout tokens (12 steps) at the recipe's price of `policy`: 10.8 + 7.2
    assert table(p, "tokens")["rl"] == ["rl", "transformers:policy", "–", "96", "0", "10,800", "720", "18.00"]
    # data text is escaped
    assert "report test &lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in html


@pytest.mark.slow
def test_the_page_leads_with_the_result(built):
    """Issue 26.5: the headline first (tasks and traces kept, pass@1 ± stderr per benchmark,
    tokens, cost, job time), titled by the recipe, its resolved settings, ids linked to records."""
    html = (built["rep"] / "report.html").read_text()
    p = parse(html)
    d = lambda label: _node_dir(built, "rep", label)
    assert "<title>rep: otbuild report</title>" in html
    assert (
        html.index('<section id="headline">')
        < html.index('<section id="settings">')
        < html.index('<section id="recipe">')
    )  # first in <main>
    head = p.rows["headline"]
    summary = pq.read_table(d("eval") / "summary.parquet").to_pylist()
    assert head[0] == ["tasks kept", "traces kept", *[f"pass@1 {r['benchmark']}" for r in summary]]
    assert head[1][:2] == [f"{rows_of(d('task_filter'))} task_filter", f"{rows_of(d('trace_filter'))} trace_filter"]
    for cell, r in zip(head[1][2:], summary):
        assert cell.startswith(
            f"{charts.num(r['mean'])} ± {charts.num(r['stderr'])} {r['repeats']} repeats × {r['n_tasks']} tasks"
        ), cell
    costs = built["rep_stats"]["costs"]
    assert (
        f"tokens {costs['input_tokens']:,} in, {costs['output_tokens']:,} out ({costs['requests']:,} requests)"
        in re.sub(r"<[^>]+>", "", html)
    )
    assert "cost 18.00" in re.sub(r"<[^>]+>", "", html) and "job time " in html
    assert 'class="flag"' not in html  # nothing degenerate here
    # the resolved recipe, as recipe.resolved.yaml holds it
    pre = re.search(r'<section id="settings">.*?<pre>(.*?)</pre>', html, re.DOTALL).group(1)
    assert (
        yaml.safe_load(
            pre.replace("&#34;", '"')
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&#39;", "'")
            .replace("&amp;", "&")
        )
        == built["plans"]["rep"].recipe.data
    )
    # SFT time has its unit
    assert table(p, "recipe-sft")["time (s)"] == [charts.num(built["sft"]["log"][-1]["time"])]
    # every artifact id links to its record, from the page and from the results view alike
    links = dict(re.findall(r'<td class="mono"><a href="([^"]+)">([0-9a-f]+)</a></td>', html))
    assert len(links) == len(built["nodes"]["rep"]) + 2  # + the SFT and RL dirs
    view = built["project"] / "results" / "rep" / "report"  # what `otbuild report` prints
    for href, id in links.items():
        for base in (built["rep"], view):  # as a browser resolves it: by the page's path, not its link's target
            target = Path(os.path.normpath(base / href))
            assert target.name == "provenance.json" and json.loads(target.read_text())["id"] == id, href


@pytest.mark.slow
def test_degenerate_results_are_flagged(built):
    """An RL run whose reward, loss and grad norm are 0 at every step, an eval that scored 0 on
    every trial: flagged at the top and in their sections."""
    html = (built["flat"] / "report.html").read_text()
    p = parse(html)
    flags = re.findall(r'<p class="flag">(.*?)</p>', html, re.DOTALL)
    text = [re.sub(r"<[^>]+>", "", f) for f in flags]
    rl = (
        "rl: No learning signal: loss and grad norm are 0 at all 3 steps (reward_mean is 0 at every step: "
        "no rollout passed, so every advantage is 0): the policy did not change."
    )
    ev = "eval: heldout: every trial scored 0 (3 repeats x 6 tasks; none passed its verifier)"
    assert len(flags) == 4 and sum(rl in t for t in text) == 2 and sum(ev in t for t in text) == 2
    assert html.index(flags[0]) < html.index('<section id="recipe">')  # at the top, then in the sections
    section = lambda name: re.sub(r"<[^>]+>", "", html.split(f'id="recipe-{name}"')[1].split("<h3")[0])
    assert rl in section("rl") and ev in section("eval") and "Degenerate" not in section("sft")
    assert p.rows["recipe-rl"]  # the curve and its tables are shown as always


def test_the_headline_flags_what_says_nothing_and_sets_the_student_beside_its_base(tmp_path):
    """Without a build: an RL run with no learning signal and an eval that scored 0 everywhere
    are flagged; with `eval.base` the student's pass@1 is said beside its untrained base's (the
    build's summary, the page's headline, the eval section), flagged where it is not above it."""
    from otbuild.summary import _part_lines

    def said(*made: dict) -> tuple[list[str], list[str], str]:
        """(summary lines, warnings, page) of a recipe whose artifacts are `made`."""
        head, html = headline_and_page(tmp_path, [{k: v for k, v in m.items() if k != "log"} for m in made])
        return _part_lines(head.parts[0], "  "), head.warnings, html

    sft = fake_training(tmp_path, "sft", 4)
    lines, warnings, _ = said(sft, fake_training(tmp_path, "rl", 3, flat=True), fake_eval_of_zeros(tmp_path))
    assert lines == ["  pass@1       heldout 0 ± 0 (3 repeats x 6 tasks)"]
    assert warnings == [
        (
            "rl: No learning signal: loss and grad norm are 0 at all 3 steps (reward_mean is 0 at every "
            "step: no rollout passed, so every advantage is 0): the policy did not change."
        ),
        (
            "eval: heldout: every trial scored 0 (3 repeats x 6 tasks; none passed its verifier): "
            "this score says nothing about the model."
        ),
    ]

    rl, base_sft = fake_training(tmp_path, "rl", 3), fake_training(tmp_path, "sft", 0, label="base/sft")
    base = fake_eval_of_zeros(tmp_path, label="base/eval")  # the untrained base scores 0: no flag for it
    lines, warnings, html = said(base_sft, base, sft, rl, fake_eval_of_zeros(tmp_path, 0.25, 0.05))
    assert lines == ["  pass@1       heldout student 0.25 ± 0.05 vs base 0 ± 0 (3 repeats x 6 tasks)"]
    assert warnings == [] and 'class="flag"' not in html
    assert "student <b>0.25</b> ± 0.05 vs base <b>0</b> ± 0<br>" in html  # the headline's cell
    p = parse(html)
    assert [r[:3] for r in p.rows["recipe-eval"][1:]] == [
        ["heldout", "transformers:artifacts/rl/" + "7d" * 8, "0.25"],
        ["heldout (untrained base)", "transformers:artifacts/rl/" + "7d" * 8, "0"],
    ]
    assert table(p, "recipe-sft")["steps"] == ["4"]  # the student's curve, not its base's (0 steps)

    _, warnings, html = said(
        sft,
        rl,
        base_sft,
        fake_eval_of_zeros(tmp_path, 0.3, 0.1, label="base/eval"),
        fake_eval_of_zeros(tmp_path, 0.25, 0.05),
    )
    assert warnings == [
        (
            "eval: heldout: the student (0.25 ± 0.05) does not score above its untrained base "
            "(0.3 ± 0.1): training did not help on it."
        )
    ]
    assert html.count('<p class="flag">') == 2  # at the top and in the eval section
    _, warnings, _ = said(
        sft,
        rl,
        base_sft,
        fake_eval_of_zeros(tmp_path, None, None, label="base/eval"),
        fake_eval_of_zeros(tmp_path, 0.25, 0.05),
    )
    assert warnings == [
        (
            "base/eval: heldout: no trial was scored: all 18 were left out as infrastructure failures "
            "or not run (the eval's log says why)."
        )
    ]


@pytest.mark.slow
def test_ablation_ranking_and_funnel_per_candidate(built):
    html = (built["ablate"] / "report.html").read_text()
    p = parse(html)
    assert_self_contained(html)
    rank = next(n for n in built["nodes"]["rep_ablate"] if n.stage == "rank")
    ranking = pq.read_table(built["project"] / rank.dir / "ranking.parquet").to_pylist()
    got = {r[1]: r for r in p.rows["ranking"] if r[0].isdigit()}  # rank, candidate, mean z, ...
    assert {r["candidate"] for r in ranking} == set(got) == {"eval.max_episodes=50", "eval.max_episodes=3"}
    for r in ranking:
        assert [got[r["candidate"]][0], got[r["candidate"]][2]] == [str(r["rank"]), charts.num(r["mean_z"])]
    assert {r["candidate"]: r["mean_z"] for r in ranking} == pytest.approx(
        {"eval.max_episodes=50": 1.0, "eval.max_episodes=3": -1.0}
    )
    # the mean-z chart: one bar per candidate, the negative one drawn as such
    svg = re.search(r'<section id="ranking">.*?(<svg.*?</svg>)', html, re.DOTALL).group(1)
    assert svg.count('class="c-bar"') == 1 and svg.count('class="c-bar-neg"') == 1
    # a funnel per candidate, its numbers the shared artifacts' records
    for cand in ("eval.max_episodes=50", "eval.max_episodes=3"):
        sid = re.sub(r"[^a-z0-9_-]+", "-", cand.lower())
        funnel = table(p, f"{sid}-funnel")
        tf = (
            built["project"]
            / next(n for n in built["nodes"]["rep_ablate"] if n.label == f"candidates/{cand}/trace_filter").dir
        )
        assert funnel["trace_filter"][1] == str(rows_of(tf))
        assert p.svgs[f"{sid}-funnel"] == 1 and p.svgs[f"{sid}-eval"] == 1
        # sections without artifacts: one line each, not an error
        assert p.notes[f"{sid}-sft"] == ["No SFT checkpoint in this recipe."]
        assert p.notes[f"{sid}-rl"] == ["No RL checkpoint in this recipe."]
    z = {(r[0], r[1]): r[6] for r in p.rows["ranking"] if len(r) == 7 and r[0].startswith("eval.")}
    assert z[("eval.max_episodes=3", "heldout")] == "-1"


@pytest.mark.slow
def test_report_stage_record_and_content_address(built, monkeypatch):
    if "report" not in STAGES:  # until the owner registers the stage (see docs/reports.md)
        monkeypatch.setitem(STAGES, "report", REPORT_STAGE)
    record, node = built["record"], built["node"]
    assert record["stage"] == "report" and record["id"] == node.id
    assert [Path(o["path"]).name for o in record["outputs"]] == ["report.html", "dataset_card.md"]
    unique = {n.id for n in built["nodes"]["rep_ablate"]}
    assert len(record["inputs"]) == len(unique) == len(node.inputs)
    assert record["stats"]["sections"]["ranking"] and record["stats"]["groups"] == 2
    assert record["stats"]["artifacts_without_record"] == []
    # the same plan gives the same id; a changed artifact id gives another
    again = report_node("rep_ablate", built["nodes"]["rep_ablate"])
    assert again.id == node.id
    other = report_node("rep", built["nodes"]["rep"])
    assert other.id != node.id


# --- the dataset card --------------------------------------------------------------------


@pytest.mark.slow
def test_dataset_card_lists_sources_counts_filters_teacher_licence(built):
    card = (built["rep"] / "dataset_card.md").read_text()
    d = lambda label: _node_dir(built, "rep", label)
    front = card.split("---\n")[1]
    assert "license: unknown" in front and "- n<1K" in front
    assert "# rep: trace set" in card
    assert f"| rows (traces) | {rows_of(d('trace_filter'))} |" in card
    for name in ("alpha", "beta"):
        r = rec(d(f"sources/{name}"))
        row = rf"^\| {name} \| synthetic \| .*count={r['settings']['count']}.* \| {r['outputs'][0]['rows']} \| 0 \| "
        assert re.search(row + r"not recorded \|$", card, re.MULTILINE), name
    for label in ("task_filter", "trace_filter"):
        stats = rec(d(label))["stats"]
        assert f"**{label}** ({label}):" in card
        assert f"Kept {stats['kept']}, rejected {stats['rejected']}." in card
        for reason, n in stats["rejected_by_reason"].items():  # with the rules that found leaks
            assert re.search(rf"\| {re.escape(reason)}( \(exact 2\))? \| {n} \|", card), reason
    assert "`min_turns: 7`" in card
    teacher = rec(d("teacher"))["stats"]
    assert "engine `oracle`" in card and f"Trials {teacher['trials']}: passed {teacher['passed']}" in card
    assert "## Licence" in card and "report test &lt;script&gt;" in card

    ablate = (built["ablate"] / "dataset_card.md").read_text()
    assert "ranked best by mean cross-benchmark\nz-score: **eval.max_episodes=50**" in ablate
    assert ablate.count("## Candidate ") == 2


# --- headless Chromium -------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is absent (apt-get install -y chromium)")
@pytest.mark.parametrize("which", ["rep", "ablate", "flat"])
def test_renders_in_headless_chromium(built, which, tmp_path):
    page = built[which] / "report.html"
    url = page.resolve().as_uri()
    dom = chromium("--dump-dom", url, tmp=tmp_path)
    assert dom.returncode == 0, dom.stderr[-3000:]
    errors = [x for x in dom.stderr.splitlines() if "Uncaught" in x or "ERROR:CONSOLE" in x]
    assert errors == []
    n_svg = len(re.findall(r"<svg\b", page.read_text()))
    assert len(re.findall(r'<svg [^>]*class="chart"', dom.stdout)) == n_svg >= 7
    assert dom.stdout.count("<rect ") >= 10
    assert "contaminated by leak (exact 2): 2" in dom.stdout  # decontamination counts by rule, in the funnel
    if which == "rep":  # the training curves
        assert dom.stdout.count("<polyline ") == 2 + 3 + 2  # the curves and their panels
    shown = parse(dom.stdout)
    # the headline leads: tasks and traces kept and pass@1 per benchmark, for each candidate
    head = shown.rows["headline"]
    benchmarks = ["pass@1 heldout"] if which == "flat" else ["pass@1 extra", "pass@1 heldout"]
    assert head[0] == ["candidate"] * (which == "ablate") + ["tasks kept", "traces kept", *benchmarks]
    assert len(head) == 1 + (2 if which == "ablate" else 1) and all(" ± " in r[-1] for r in head[1:])
    assert dom.stdout.index('id="headline"') < dom.stdout.index("Row-count funnel")
    flagged = re.findall(r'<p class="flag">(.*?)</p>', dom.stdout, re.DOTALL)
    if which == "flat":  # flagged at the top and in the RL and eval sections
        rl_section = dom.stdout.split('id="recipe-rl"')[1].split("<h3")[0]
        assert len(flagged) == 4 and '<p class="flag"><b>Degenerate result.</b> rl: No learning signal' in rl_section
        assert "every trial scored 0" in dom.stdout.split('id="recipe-eval"')[1].split("<h3")[0]
    else:
        assert flagged == []
    # tokens per stage and model, runtime and GPU-hours per stage
    assert shown.rows["tokens"][0] == [
        "artifact",
        "stage",
        "model",
        "served by",
        "requests",
        "errors",
        "input tokens",
        "output tokens",
        "cost",
    ]
    assert {r[1] for r in shown.rows["tokens"][1:-1]} == {
        "rollout",
        *([] if which == "flat" else ["eval"]),
        *(["rl"] if which != "ablate" else []),
    }
    assert shown.rows["tokens"][-1][0] == "total"
    assert shown.rows["runtime"][0][-2:] == ["GPUs", "GPU-hours"]
    ran = {"source", "mix", "rollout", *([] if which == "flat" else ["eval"])}  # flat's eval is made by hand
    assert ran <= {r[1] for r in shown.rows["runtime"][1:-1]}
    shot = tmp_path / "shot.png"
    res = chromium("--window-size=1280,2400", "--hide-scrollbars", f"--screenshot={shot}", url, tmp=tmp_path)
    assert res.returncode == 0 and shot.exists(), res.stderr[-3000:]
    assert [x for x in res.stderr.splitlines() if "Uncaught" in x or "ERROR:CONSOLE" in x] == []
    assert png_size(shot) == (1280, 2400) and shot.stat().st_size > 50_000  # drawn, not blank
    # at 1280 px: every table fits its column (the eval's repeats, tasks and exceptions are
    # seen, not scrolled to), and no axis label of a chart lies over its tick labels
    measured = tmp_path / "measured.html"
    measured.write_text(page.read_text().replace("</body>", f"{MEASURE}</body>"))
    dom = chromium("--window-size=1280,2400", "--dump-dom", measured.resolve().as_uri(), tmp=tmp_path)
    problems = json.loads(re.search(r'<pre id="layout">(.*?)</pre>', dom.stdout, re.DOTALL).group(1))
    assert problems == [], problems
    assert '<th class="n">repeats</th><th class="n">tasks</th><th class="n">exceptions</th>' in dom.stdout
    keep = os.environ.get("OTBUILD_REPORT_SCREENSHOTS")
    if keep:  # to look at it: OTBUILD_REPORT_SCREENSHOTS=/some/dir
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / f"{which}.png")


# Run in a copy of a page (the page itself has no script): what does not fit at the window's
# width, and axis labels that overlap a tick label, as the browser lays them out.
MEASURE = """<script>
const out = [];
document.querySelectorAll(".wide").forEach(w => {
  if (w.scrollWidth > w.clientWidth + 1) out.push(`overflow: ${w.closest("section").id} ${w.scrollWidth} > ${w.clientWidth}`);
});
const hit = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
document.querySelectorAll("svg.chart").forEach(svg => {
  const ticks = [...svg.querySelectorAll(".c-tick")];
  svg.querySelectorAll(".c-axis-label").forEach(label => ticks.forEach(t => {
    if (hit(label.getBoundingClientRect(), t.getBoundingClientRect()))
      out.push(`overlap: ${svg.getAttribute("aria-label")}: ${label.textContent} over tick ${t.textContent}`);
  }));
});
const pre = document.createElement("pre");
pre.id = "layout";
pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script>"""


# --- Snakemake's report() ----------------------------------------------------------------

SNAKEFILE = """
from otbuild.report import CAPTIONS

RECIPES = {{"r0": "rep"}}


def _recipe(wc):
    return RECIPES[wc.id]


rule all:
    input: "artifacts/report/r0/report.html"


rule report:
    input: "src/report.html", "src/dataset_card.md"
    output:
        html=report("artifacts/report/{{id}}/report.html", caption=str(CAPTIONS / "report.report.rst"),
                    category="Results", subcategory=_recipe,
                    labels=lambda wc: {{"recipe": _recipe(wc), "file": "report.html"}}),
        card=report("artifacts/report/{{id}}/dataset_card.md", caption=str(CAPTIONS / "report.dataset_card.rst"),
                    category="Results", subcategory=_recipe,
                    labels=lambda wc: {{"recipe": _recipe(wc), "file": "dataset_card.md"}}),
    params:
        recipe=_recipe,
    shell:
        "cp {{input[0]}} {{output.html}} && cp {{input[1]}} {{output.card}}"
"""


@pytest.mark.slow
def test_snakemake_report_carries_page_and_card_with_captions(built, tmp_path):
    """The report() flags of docs/reports.md's rule (captions, category, subcategory and labels
    from functions of the wildcards) on the produced files; `snakemake --report` takes them."""
    (tmp_path / "src").mkdir()
    shutil.copy(built["rep"] / "report.html", tmp_path / "src")
    shutil.copy(built["rep"] / "dataset_card.md", tmp_path / "src")
    (tmp_path / "Snakefile").write_text(SNAKEFILE.format())
    run = lambda *a: subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "1", *a],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    res = run()
    assert res.returncode == 0, res.stderr[-3000:]
    res = run("--report", "out.html")
    assert res.returncode == 0, res.stderr[-3000:]
    log = res.stdout + res.stderr
    assert "Adding report.html" in log and "Adding dataset_card.md" in log
    out = (tmp_path / "out.html").read_text()
    assert "otbuild report of recipe <strong>rep</strong>: the row-count funnel" in out
    assert 'Dataset card (<tt class=\\"docutils literal\\">README.md</tt> style) of recipe <strong>rep</strong>' in out
    assert '"Results"' in out


# --- fast checks (no snakemake) ------------------------------------------------------------


def test_charts_escape_and_draw():
    svg = charts.bars([("<script>a&b</script>", 2.0), ("neg", -1.0)], errors=[0.5, None], title="t <x>")
    assert "<script>" not in svg and "&lt;script&gt;a&amp;b&lt;/script&gt;" in svg and "t &lt;x&gt;" in svg
    assert svg.count('class="c-bar"') == 1 and svg.count('class="c-bar-neg"') == 1 and 'class="c-err"' in svg
    assert 'class="c-axis"' in svg  # the zero line between negative and positive bars
    col = charts.columns([("5", 9), ("7", 8), ("<9>", 0)], title="h")
    assert col.count("<rect") == 3 and "&lt;9&gt;" in col
    ln = charts.line([(1, 3.0), (2, 2.0), (3, float("nan")), (4, 1.0)], title="loss")
    assert ln.count("<circle") == 3 and "<polyline" in ln
    assert charts.line([(i, i) for i in range(5000)], title="l").count(",") < 1100  # thinned
    assert charts.nice_ticks(0, 9, 4, integer=True)[-1] >= 9 and charts.nice_ticks(-1.2, 0.7)[0] <= -1.2
    assert [charts.num(x) for x in (1234, 1.0, 0.5, 0.1234, 12.345, None, 2e-5)] == [
        "1,234",
        "1",
        "0.5",
        "0.123",
        "12.3",
        "–",
        "2.00e-05",
    ]
    assert _md_cell("a|b\n<c>`d`") == "a\\|b &lt;c&gt;\\`d\\`"


def test_task_only_recipe_omits_trace_sections_and_escapes_data(tmp_path, monkeypatch):
    """Stages run in process (no snakemake): sources -> mix -> task_filter. A hand-made source
    artifact carries a licence and hostile text in its metadata and quarantine reasons."""
    monkeypatch.chdir(tmp_path)
    nodes = _run_in_process(
        tmp_path,
        "t",
        (
            "sources:\n  a: {kind: synthetic, rank: 1, count: 6, seed: 1}\n  b: {kind: synthetic, rank: 2, count: 4, seed: 2}\n"
            "mix: {n: 2, total: 8}\ntask_filter: {dedup: true, sample: {n: 5}}\n"
        ),
    )
    hostile = tmp_path / "artifacts" / "source" / "x"
    hostile.mkdir(parents=True)
    write_source(hostile / "tasks.parquet", "evil", ["one task", "two task"], license=["<b>MIT|x</b>", "<b>MIT|x</b>"])
    (hostile / "provenance.json").write_text(
        json.dumps(
            {
                "stage": "source",
                "settings": {"name": "evil", "kind": "table"},
                "stats": {"quarantined": 1, "quarantined_by_reason": {"<img src=x onerror=alert(1)>": 1}},
                "outputs": [{"path": str(hostile / "tasks.parquet"), "rows": 2}],
            }
        )
    )
    settings = report_settings("t", nodes).model_dump()
    settings["nodes"].insert(0, {"label": "sources/evil", "stage": "source", "id": "x", "dir": str(hostile)})
    stats = build(STAGES["report"].config(settings), tmp_path / "out")
    assert stats["sections"] == {
        "funnel": True,
        "mix": True,
        "traces": False,
        "sft": False,
        "rl": False,
        "eval": False,
        "ranking": False,
    }
    html = (tmp_path / "out" / "report.html").read_text()
    p = parse(html)
    assert_self_contained(html)
    assert p.notes["recipe-traces"] == [
        "No trace set in this recipe (no teacher or trace imports): the funnel ends at the task set."
    ]
    assert p.notes["recipe-sft"] and p.notes["recipe-rl"] and p.notes["recipe-eval"]
    tf = next(n for n in nodes if n.stage == "task_filter")
    assert table(p, "recipe-funnel")["task_filter"][1] == str(rows_of(tmp_path / tf.dir))
    assert "&lt;img src=x onerror=alert(1)&gt;: 1" in html  # the quarantine reason, escaped
    assert table(p, "recipe-funnel")["sources (3) sources/evil, sources/a, sources/b"][1:3] == ["12", "1"]
    card = (tmp_path / "out" / "dataset_card.md").read_text()
    assert "# t: task set" in card and f"| rows (tasks) | {rows_of(tmp_path / tf.dir)} |" in card
    assert "license: <b>MIT|x</b>" in card.split("---\n")[1]  # YAML front matter (a string)
    front = yaml.safe_load(card.split("---\n")[1])  # the Hub's dataset card metadata
    assert (front["task_categories"], front["language"]) == (["text-generation"], ["en"])
    assert "| evil | table |" in card and "&lt;b&gt;MIT\\|x&lt;/b&gt; (2)" in card
    assert "No teacher: this is a task set." in card


def test_a_trace_set_that_kept_nothing_is_reported_not_a_crash(tmp_path, monkeypatch):
    """A trace filter that keeps 0 rows (every trace failed, say): the report says so."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "chats.jsonl").write_text(
        json.dumps({"messages": [{"role": "user", "content": "do it"}, {"role": "assistant", "content": "done"}]})
        + "\n"
    )
    nodes = _run_in_process(
        tmp_path,
        "z",
        ("trace_imports:\n  chats: {kind: messages-jsonl, path: chats.jsonl}\ntrace_filter: {min_turns: 5}\n"),
    )
    build(report_settings("z", nodes), tmp_path / "out")
    p = parse((tmp_path / "out" / "report.html").read_text())
    assert "No traces: this trace set has 0 rows (the funnel says where they went)." in p.notes["recipe-traces"]
    assert table(p, "recipe-funnel")["trace_filter"][1] == "0"
    assert "| rows (traces) | 0 |" in (tmp_path / "out" / "dataset_card.md").read_text()


def _run_in_process(project, name: str, recipe: str) -> list:
    """Write recipes/NAME.yaml and run its stages but the report in this process (no
    snakemake); the plan's nodes that ran."""
    from otbuild.runner import run_spec

    (project / "recipes").mkdir()
    (project / "recipes" / f"{name}.yaml").write_text(recipe)
    plan = plan_recipe(load_recipe(project / "recipes" / f"{name}.yaml", project))
    nodes = [n for n in plan.nodes if n.stage != "report"]
    for n in nodes:
        run_spec(n.spec())
    return nodes


def test_the_report_shows_what_publishing_would_redact_per_table(tmp_path, monkeypatch):
    """A task set with a key in its instruction and tests/test.sh (task_binary) and a trace set
    in which the agent echoed a token: the report's Secrets table counts, per table and per
    pattern, what `otbuild publish` would redact from it (the same counts as publish's
    manifest); a clean table says "none found"; the stage's stats total them."""
    from click.testing import CliRunner

    from otbuild.cli import main
    from otbuild.tasks.table import TaskRecord, write_tasks
    from tests.tasks.test_redact import HF, _leaky_task

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))

    def report(name: str, recipe: str) -> tuple[dict, dict]:
        shutil.rmtree(tmp_path / "recipes", ignore_errors=True)
        stats = build(report_settings(name, _run_in_process(tmp_path, name, recipe)), tmp_path / "out" / name)
        return table(parse((tmp_path / "out" / name / "report.html").read_text()), "recipe-secrets"), stats

    def chats(*answers: str) -> None:
        (tmp_path / "chats.jsonl").write_text(
            "".join(
                json.dumps(
                    {"messages": [{"role": "user", "content": "print the token"}, {"role": "assistant", "content": a}]}
                )
                + "\n"
                for a in answers
            )
        )

    (tmp_path / "data").mkdir()
    write_tasks(tmp_path / "data" / "t.parquet", [TaskRecord(_leaky_task(), True)], source="t")
    secrets, stats = report(
        "t", "sources:\n  t: {kind: harbor-parquet, rank: 1, path: data/t.parquet}\ntask_filter: {}\n"
    )
    # the instruction column, and instruction.md and tests/test.sh in task_binary
    assert secrets["task_filter"] == ["1", "api_key_sk: 2 github_token: 1"]
    assert stats["secrets_found"] == {"api_key_sk": 2, "github_token": 1}
    res = CliRunner().invoke(main, ["publish", "t", "task_filter", "--repo", "o/t", "--dry-run", "--out", "hub"])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "hub" / "manifest.json").read_text())["redacted"] == stats["secrets_found"]
    traces = "trace_imports:\n  chats: {kind: messages-jsonl, path: chats.jsonl}\ntrace_filter: {min_turns: 1}\n"
    chats(f"echo {HF}", "done")
    secrets, stats = report("c", traces)
    assert secrets["trace_filter"] == ["2", "hf_token: 1"] and stats["secrets_found"] == {"hf_token": 1}
    chats("done")
    secrets, stats = report("d", traces)
    assert secrets["trace_filter"] == ["1", "none found"] and stats["secrets_found"] == {}
