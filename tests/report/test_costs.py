"""Tokens, time and money: LLM usage per model in each LLM stage's record, a job's runtime,
peak memory and GPUs in Snakemake's benchmark files, and the report's tables over both
(otbuild/usage.py, otbuild/report/costs.py)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from otbuild.plan import plan_recipe
from otbuild.recipe.load import load_recipe
from otbuild.settings.recipe import Price
from otbuild.report.costs import gpus, price_of, read_benchmark
from tests.conftest import chat_answer, otbuild, snakemake
from tests.report.test_report import CHROMIUM, chromium, parse

PRICES = "prices:\n  m: {input_per_mtok: 100000, output_per_mtok: 1000000}\n"


def _recipe(base_url: str) -> str:
    return f"""
sources:
  a: {{kind: synthetic, count: 4, seed: 1, families: [files]}}
augment: {{engine: openai, base_url: '{base_url}', model: m, k: 1, shards: 2}}
task_filter:
  llm: {{engine: openai, base_url: '{base_url}', model: m, kind: askllm}}
  score: {{column: llm_score, top_k: 100}}
teacher: {{engine: oracle, shards: 2, concurrency: 2}}
trace_filter: {{min_turns: 1}}
{PRICES}"""


def _rows(html: str, section: str) -> list[list[str]]:
    return parse(html).rows[section]


@pytest.mark.slow
def test_a_build_records_tokens_runtime_and_gpu_hours_and_the_report_shows_them(project, scripted, tmp_path):
    srv = scripted(
        lambda body: (
            200,
            chat_answer(
                "Rating: 50" if "rate" in body["messages"][-1]["content"].lower() else "Do it again, carefully now."
            ),
        )
    )
    (project / "recipes" / "r.yaml").write_text(_recipe(srv.base_url))
    # the profile asks 4 GPUs per node on 2 nodes for each rollout shard (recorded, not enforced locally)
    snakemake(project, "r", "--set-resources", "rollout:gres=gpu:h100:4", "rollout:nodes=2")
    plan = plan_recipe(load_recipe(project / "recipes" / "r.yaml", project))
    node = {n.stage: n for n in plan.nodes}

    # the records: usage per model, as the server counted it (10 prompt tokens, a word per output token)
    rec = lambda stage: json.loads((project / node[stage].dir / "provenance.json").read_text())["stats"]
    assert rec("augment")["llm_usage"] == {
        "openai:m": {"requests": 4, "errors": 0, "input_tokens": 40, "output_tokens": 20, "usage_missing": 0}
    }
    assert rec("task_score")["llm_usage"]["openai:m"]["requests"] == 8  # the 4 tasks and their 4 forms
    rollout = rec("rollout")["llm_usage"]["oracle:oracle"]
    assert rollout["requests"] > 8 and rollout["input_tokens"] == 0 and rollout["errors"] == 0
    assert len(srv.requests) == 4 + 8

    # the benchmark files: one per job, shards and merges apart
    bench = project / "benchmarks"
    for stage in ("source", "mix", "task_filter", "trace_filter", "report"):
        if stage in node:
            assert (bench / stage / f"{node[stage].id}.tsv").is_file(), stage
    assert sorted(p.name for p in (bench / "augment" / node["augment"].id).iterdir()) == [
        "0-of-2.tsv",
        "1-of-2.tsv",
        "merge.tsv",
    ]
    shards = [read_benchmark(bench / "rollout" / node["rollout"].id / f"{k}-of-2.tsv")[0] for k in range(2)]
    merge = read_benchmark(bench / "rollout" / node["rollout"].id / "merge.tsv")[0]
    assert [s["gpus"] for s in shards] == [8, 8] and merge["gpus"] == 0  # the merge asked for no GPU
    assert all(s["s"] > 0 and s["max_rss"] is None or s["max_rss"] > 0 for s in shards)

    # the report: a token table with the cost from the recipe's prices, and GPU-hours per stage
    html = (project / "results" / "r" / "report" / "report.html").read_text()
    tokens = {(r[1], r[2]): r[3:] for r in _rows(html, "tokens")[1:-1]}
    assert tokens[("augment", "openai:m")] == ["–", "4", "0", "40", "20", "24.00"]  # 40 x 0.1 + 20 x 1.0
    # ("served by" –: an endpoint otbuild did not start, whose release it does not know)
    assert tokens[("task_score", "openai:m")][1:3] == ["8", "0"]
    assert tokens[("rollout", "oracle:oracle")][-1] == "–"  # no price, no tokens
    runtimes = {r[1]: r[2:] for r in _rows(html, "runtime")[1:-1]}
    hours = sum(s["s"] for s in shards) * 8 / 3600
    assert runtimes["rollout"][0] == "3" and runtimes["rollout"][3] == "8"  # 2 shards + merge; GPUs
    assert runtimes["rollout"][4] == (f"{hours:,.2f}" if hours >= 0.01 else f"{hours:.2g}")
    assert runtimes["augment"][3] == "0" and runtimes["augment"][4] == "0.00"
    total = _rows(html, "runtime")[-1]
    assert total[0] == "total" and total[-1] == runtimes["rollout"][4]

    # the same tables on the command line, from what is built
    cli = otbuild(project, "costs", "r")
    assert cli.returncode == 0, cli.stderr
    line = next(x for x in cli.stdout.splitlines() if "augment/a" in x)
    assert [c.strip() for c in line.split("│")[3:9]] == ["openai:m", "4", "0", "40", "20", "24.00"]
    assert any("teacher" in x and runtimes["rollout"][4] in x for x in cli.stdout.splitlines())

    if CHROMIUM.exists():  # what a reader sees: the tables are in the rendered page
        page = project / "results" / "r" / "report" / "report.html"
        dom = chromium("--dump-dom", page.resolve().as_uri(), tmp=tmp_path)
        assert dom.returncode == 0, dom.stderr[-3000:]
        shown = parse(dom.stdout)
        assert shown.rows["tokens"] == _rows(html, "tokens") and shown.rows["runtime"] == _rows(html, "runtime")
        assert "Tokens, time and money" in dom.stdout and "GPU-hours" in dom.stdout


def test_prices_change_only_the_report_id(project):
    """A recipe without prices keeps every id (the report's too); prices move the report's alone."""
    base = "sources:\n  a: {kind: synthetic, rank: 1, count: 3}\nmix: {n: 1, total: 3}\n"
    (project / "recipes" / "plain.yaml").write_text(base)
    (project / "recipes" / "priced.yaml").write_text(base + PRICES)
    ids = {
        n: {x.label: x.id for x in plan_recipe(load_recipe(project / "recipes" / f"{n}.yaml", project)).nodes}
        for n in ("plain", "priced")
    }
    assert ids["plain"].keys() == ids["priced"].keys()
    assert [k for k in ids["plain"] if ids["plain"][k] != ids["priced"][k]] == ["report"]
    from otbuild.plan import report_node

    assert "prices" not in report_node("plain", []).identity  # no prices: the id as before


def test_a_bad_price_is_a_config_error_naming_the_key(project):
    from otbuild.errors import ConfigError

    (project / "recipes" / "bad.yaml").write_text(
        "sources:\n  a: {kind: synthetic, count: 3}\nprices:\n  m: {input_per_mtok: -1, output: 2}\n"
    )
    with pytest.raises(ConfigError) as e:
        load_recipe(project / "recipes" / "bad.yaml", project)
    assert "prices.m.input_per_mtok" in str(e.value) and "prices.m.output" in str(e.value)


def test_gpus_from_the_jobs_resources():
    assert gpus({"gres": "gpu:h100:4", "nodes": 4}) == 16
    assert gpus({"gres": "gpu:2"}) == 2
    assert gpus({"gres": "shard:1,gpu:a100:8", "nodes": 3}) == 24
    assert gpus({"gpu": 3}) == 3 and gpus({"gres": "tmpfs:10G"}) == 0 and gpus({}) == 0
    one, two = Price(input_per_mtok=1), Price(input_per_mtok=2)
    assert price_of("vllm:m", {"m": one}) == one and price_of("vllm:m", {"vllm:m": two, "m": Price()}) == two


def test_a_plain_benchmark_file_counts_no_gpus(tmp_path):
    """Without the extended format (no resources column) a job's GPUs are 0; an unsampled
    memory ("NA": a job faster than Snakemake's sampling) is None, not an error."""
    path = tmp_path / "b.tsv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f, delimiter="\t")
        w.writerow(
            ["s", "h:m:s", "max_rss", "max_vms", "max_uss", "max_pss", "io_in", "io_out", "mean_load", "cpu_time"]
        )
        w.writerow(["12.5", "0:00:12", "NA", "NA", "NA", "NA", "NA", "NA", "NA", "NA"])
    assert read_benchmark(Path(path)) == [{"s": 12.5, "max_rss": None, "gpus": 0}]


def test_trace_usage_counts_turns_and_the_request_that_ended_a_trial(tmp_path):
    """A rollout's usage per teacher: a request per assistant turn, plus the failed one of a
    trial the engine gave up on or whose conversation outgrew the context (the errors)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from otbuild.usage import of_traces, of_trial

    rows = [
        {
            "teacher": "vllm:a",
            "n_turns": 5,
            "exception": None,
            "result": "1",
            "n_input_tokens": 500,
            "n_output_tokens": 50,
        },
        {
            "teacher": "vllm:a",
            "n_turns": 2,
            "exception": "EngineError",
            "result": "EngineError",
            "n_input_tokens": 100,
            "n_output_tokens": 10,
        },
        {
            "teacher": "vllm:a",
            "n_turns": 9,
            "exception": None,
            "result": "ContextLengthExceededError",
            "n_input_tokens": 900,
            "n_output_tokens": 90,
        },
        {
            "teacher": "openai:b",
            "n_turns": 1,
            "exception": "SandboxError",
            "result": "SandboxError",
            "n_input_tokens": None,
            "n_output_tokens": None,
        },
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "traces.parquet")
    assert of_traces(tmp_path / "traces.parquet") == {
        "openai:b": {"requests": 1, "errors": 0, "input_tokens": 0, "output_tokens": 0},
        "vllm:a": {"requests": 18, "errors": 2, "input_tokens": 1500, "output_tokens": 150},
    }
    assert [of_trial(r)["requests"] for r in rows] == [5, 3, 10, 1]  # RL's per-trial count agrees
