"""Decontamination (task_filter.decontaminate): training tasks that overlap an eval benchmark's
instructions are rejected naming the benchmark task; checked against a plain Python version on
the real dev data."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from bench.decontaminate import reference  # the rule pair by pair, in plain Python
from otbuild.errors import ConfigError
from otbuild.plan import plan_recipe
from otbuild.recipe.load import load_recipe
from otbuild.stages.task_filter import TaskFilter
from otbuild.sources import read_source
from otbuild.stages import task_filter
from otbuild.stagekit import Inputs
from otbuild.stages import STAGES
from otbuild.tasks.table import TaskRecord, write_tasks
from tests.conftest import DATA, make_task


def _read(kind: str, path: Path) -> list[TaskRecord]:
    return [
        r
        for r in read_source(STAGES["source"].config({"name": kind.replace("-", "_"), "kind": kind, "path": str(path)}))
        if isinstance(r, TaskRecord)
    ]


def _filter(tmp_path: Path, train: Path, refs: list[Path], **decontaminate) -> tuple[list[dict], list[dict], dict]:
    out = tmp_path / "out"
    out.mkdir()
    stats = task_filter.run(
        TaskFilter(dedup=False, decontaminate=decontaminate), Inputs.of(tasks=[train], held_out=refs), out
    )
    kept = duckdb.sql(f"SELECT * FROM '{out / 'kept.parquet'}'").fetchall()
    rejected = duckdb.sql(f"SELECT path, reason, rejected_by FROM '{out / 'rejected.parquet'}'").fetchall()
    return kept, rejected, stats


@pytest.mark.skipif(not DATA.is_dir(), reason=f"dev data not found at {DATA}")
@pytest.mark.parametrize("ngram,min_shared", [(13, 1), (8, 3)])
def test_matches_a_plain_python_version_on_the_real_data(tmp_path, ngram, min_shared):
    swe = _read("swe-instances", DATA / "swebench_verified" / "instances.jsonl")
    tb2 = _read("harbor-dir", DATA / "terminal_bench_tasks" / "harbor_format" / "tb2_ot_fewshots")
    train = [
        *_read("stackexchange", DATA / "stackexchange"),
        *_read("harbor-dir", DATA / "terminal_bench_tasks" / "harbor_format" / "termigen_no_solution"),
        *_read("swe-instances", DATA / "swesmith"),
    ]
    # leaks as they happen: a benchmark task copied whole, reworded in case and punctuation,
    # quoted inside a longer task, and a few of its words only
    leaked = [
        make_task("copy", swe[0].task.instruction),
        make_task("recased", tb2[1].task.instruction.upper().replace(".", " ! ")),
        make_task("quoted", "Solve this for our repo.\n\n" + " ".join(swe[5].task.instruction.split()[40:80])),
        make_task("few_words", "Please " + " ".join(tb2[2].task.instruction.split()[:7]) + " and stop."),
    ]
    train = [*train[:100], *leaked, *train[100:]]
    write_tasks(tmp_path / "train.parquet", train, source="train")
    write_tasks(tmp_path / "swe.parquet", swe, source="swebench_verified")
    write_tasks(tmp_path / "tb2.parquet", tb2, source="tb2")

    kept, rejected, stats = _filter(
        tmp_path,
        tmp_path / "train.parquet",
        [tmp_path / "swe.parquet", tmp_path / "tb2.parquet"],
        against=["swebench_verified", "tb2"],
        ngram=ngram,
        min_shared=min_shared,
    )
    expected = reference(
        [r.task.instruction for r in train],
        [
            ("swebench_verified", [(r.task.name, r.task.instruction) for r in swe]),
            ("tb2", [(r.task.name, r.task.instruction) for r in tb2]),
        ],
        ngram,
        min_shared,
    )
    paths = [r.task.name for r in train]
    assert {path: reason for path, reason, _ in rejected} == {paths[i]: reason for i, reason in expected.items()}
    assert len(kept) + len(rejected) == len(train) > 600  # nothing lost
    assert {"copy", "recased", "quoted"} <= {path for path, _, _ in rejected}
    reasons = dict((p, r) for p, r, _ in rejected)
    assert reasons["copy"] == f"contaminated by swebench_verified: same instruction as task {swe[0].task.name}"
    assert reasons["recased"] == f"contaminated by tb2: same instruction as task {tb2[1].task.name}"
    assert reasons["quoted"].startswith("contaminated by swebench_verified: ")
    assert reasons["quoted"].endswith(f"-grams with task {swe[5].task.name}")
    assert "few_words" not in reasons or ngram <= 8  # 7 shared words are no 13-gram
    by_benchmark = stats["rejected_by_reason"]  # what the provenance and the report's funnel count
    assert set(by_benchmark) <= {"contaminated by swebench_verified", "contaminated by tb2"}
    assert sum(by_benchmark.values()) == len(rejected)


def test_every_other_step_still_applies_and_rejected_rows_stay_whole(tmp_path):
    bench = ["Write a bash script that prints the five largest files under /data with their sizes in bytes"]
    train = [
        "short",
        "Please write a bash script that prints the five largest files under /data with their sizes in bytes, sorted",
        "Count the words in /app/book.txt and write the number to /app/n.txt",
        "write a BASH script that prints the five largest files under /data, with their sizes in bytes!!",
    ]
    from tests.conftest import write_source

    out = tmp_path / "out"
    out.mkdir()
    settings = TaskFilter(instruction_chars={"min": 10}, decontaminate={"against": ["held"], "ngram": 5})
    stats = task_filter.run(
        settings,
        Inputs.of(
            tasks=[write_source(tmp_path / "t.parquet", "t", train)],
            held_out=[write_source(tmp_path / "b.parquet", "held", bench)],
        ),
        out,
    )
    rejected = duckdb.sql(
        f"SELECT path, reason, octet_length(task_binary) > 0 FROM '{out / 'rejected.parquet'}'"
    ).fetchall()
    assert rejected == [
        ("t-0", "too_short: 5 < 10 chars", True),
        ("t-1", "contaminated by held: 13 shared 5-grams with task held-0", True),
        ("t-3", "contaminated by held: same instruction as task held-0", True),
    ]
    assert duckdb.sql(f"SELECT path FROM '{out / 'kept.parquet'}'").fetchall() == [("t-2",)]
    assert stats["rejected_by_reason"] == {"contaminated by held": 2, "too_short": 1}


RECIPE = """
sources:
  a: {kind: synthetic, rank: 1, count: 10, seed: 1}
  b: {kind: synthetic, rank: 2, count: 10, seed: 2}
mix: {n: 1, total: 10}
task_filter: {dedup: true}
eval: {benchmarks: {held: {kind: synthetic, count: 3, seed: 9}}, model: {engine: oracle}}
"""


def _plan(tmp_path: Path, text: str):
    (tmp_path / "recipes").mkdir(exist_ok=True)
    (tmp_path / "recipes" / "r.yaml").write_text(text)
    return {n.label: n for n in plan_recipe(load_recipe("r", tmp_path)).nodes}


def test_the_benchmark_becomes_an_input_of_the_task_filter_only_when_asked(tmp_path):
    plain = _plan(tmp_path, RECIPE)
    assert [i.label for i in plain["task_filter"].inputs] == ["mix"]
    assert "decontaminate" not in plain["task_filter"].identity
    held = _plan(tmp_path, RECIPE.replace("{dedup: true}", "{dedup: true, decontaminate: {against: [held, b]}}"))
    tf = held["task_filter"]
    assert [i.label for i in tf.inputs] == ["mix", "benchmarks/held", "sources/b"]
    assert tf.inputs[1].id == held["benchmarks/held"].id  # the eval's own benchmark node
    assert tf.id != plain["task_filter"].id and held["mix"].id == plain["mix"].id
    assert tf.identity["decontaminate"] == {"against": ["held", "b"]}  # defaults stay out of the id
    spelled = _plan(tmp_path, RECIPE.replace("{dedup: true}", "{decontaminate: {against: [held, b], ngram: 13}}"))
    assert spelled["task_filter"].id == tf.id
    other = _plan(tmp_path, RECIPE.replace("{dedup: true}", "{decontaminate: {against: [held, b], ngram: 8}}"))
    assert other["task_filter"].id != tf.id


def test_an_unknown_name_is_a_config_error(tmp_path):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "r.yaml").write_text(RECIPE.replace("{dedup: true}", "{decontaminate: {against: [helt]}}"))
    with pytest.raises(ConfigError, match="'helt' is neither a benchmark in eval.benchmarks nor a source"):
        load_recipe("r", tmp_path)


@pytest.mark.parametrize("name", ["otagent_v2_100k", "otagent_v2_10k"])
def test_the_paper_recipes_decontaminate_against_their_benchmarks(name):
    from tests.conftest import REPO

    plan = {n.label: n for n in plan_recipe(load_recipe(name, REPO)).nodes}
    against = [i.label for i in plan["task_filter"].inputs if i.label.startswith("benchmarks/")]
    assert against == [i.label for i in plan["eval"].inputs if i.label.startswith("benchmarks/")]
    assert len(against) == 3


@pytest.mark.slow
def test_a_real_build_decontaminates_against_a_source_it_does_not_mix(project):
    """snakemake builds the held-out set for the task filter alone, and the filter's rejections
    are the rule's, benchmark task named."""
    import csv
    import random

    from tests.conftest import snakemake

    rng = random.Random(7)  # made-up instructions of distinct words: only the copies overlap
    vocab = [f"w{i}" for i in range(5000)]
    train = [" ".join(rng.sample(vocab, 40)) for _ in range(30)]
    held = [train[3], train[11], "Please " + train[20], *(" ".join(rng.sample(vocab, 40)) for _ in range(3))]
    for name, texts in (("train", train), ("held", held)):
        with open(project / f"{name}.csv", "w", newline="") as f:
            csv.writer(f).writerows([["q"], *([t] for t in texts)])
    (project / "recipes" / "r.yaml").write_text("""
sources:
  train: {kind: table, rank: 1, path: train.csv, columns: {instruction: q}}
  held: {kind: table, rank: 2, path: held.csv, columns: {instruction: q}}
mix: {n: 1, total: 30}
task_filter: {dedup: false, decontaminate: {against: [held], ngram: 13}}
""")
    jobs, _ = snakemake(project, "r", "--cores", "1")
    assert jobs["source"] == 2 and jobs["task_filter"] == 1
    nodes = {n.label: n for n in plan_recipe(load_recipe("r", project)).nodes}
    tf, held = nodes["task_filter"], nodes["sources/held"]
    record = json.loads((project / tf.provenance).read_text())
    assert [i["id"] for i in record["inputs"]] == [nodes["mix"].id, held.id]
    mixed = pq.read_table(project / nodes["mix"].main_output, columns=["path", "instruction"]).to_pydict()
    bench = pq.read_table(project / held.main_output, columns=["path", "instruction"]).to_pydict()
    expected = reference(mixed["instruction"], [("held", list(zip(bench["path"], bench["instruction"])))], 13)
    rejected = pq.read_table(project / tf.dir / "rejected.parquet", columns=["path", "reason"]).to_pydict()
    assert len(expected) == 3 and dict(zip(rejected["path"], rejected["reason"])) == {
        mixed["path"][i]: r for i, r in expected.items()
    }
    assert record["stats"]["rejected_by_reason"] == ({"contaminated by held": len(expected)} if expected else {})


def test_the_fuzzy_pass_finds_reworded_tasks_and_counts_per_benchmark_and_rule(tmp_path):
    """OpenThoughts-Agent's second rule: rapidfuzz ratio or partial_ratio >= 0.8. Here only on
    the pairs the pre-filter keeps; on this data it agrees with scoring every pair."""
    from tests.conftest import write_source

    held = [
        "Write a bash script that prints the five largest files under the data directory with their sizes in bytes "
        "and writes the list to the file report txt in the home directory",
        "Configure nginx so that it serves the static site in srv www on port 8080 and returns a custom "
        "404 page for missing paths then reload the service",
    ]
    other = ["Count the words in the book under app and write the number of distinct words to the file n txt"]
    train = [
        # one word in six changed: no 13-gram survives, the texts are still ~90% alike (ratio)
        "Write a shell script that prints the five biggest files under the data folder with their size in bytes "
        "and saves the list to the file report txt in the home directory",
        # the same rewording inside a longer task (partial_ratio)
        "Our team needs help with a server. Configure nginx so it serves the static site in srv www on port 8080 and "
        "gives a custom 404 page for missing paths then restart the service. Thanks a lot for your help with this.",
        held[0],  # a copy: the exact rule names it first
        "Count the words in the book under app and write the number of unique words into the file n txt",
        "Train a small convolutional network on the images in data and report its accuracy on the held out split",
    ]
    out = tmp_path / "out"
    out.mkdir()
    refs = [write_source(tmp_path / "h.parquet", "held", held), write_source(tmp_path / "o.parquet", "other", other)]
    stats = task_filter.run(
        TaskFilter(dedup=False, decontaminate={"against": ["held", "other"], "fuzzy": 0.8}),
        Inputs.of(tasks=[write_source(tmp_path / "t.parquet", "t", train)], held_out=refs),
        out,
    )
    reasons = dict(duckdb.sql(f"SELECT path, reason FROM '{out / 'rejected.parquet'}'").fetchall())
    assert reasons["t-0"].startswith("contaminated by held: fuzzy ratio 0.") and reasons["t-0"].endswith(
        "with task held-0"
    )
    assert reasons["t-1"].startswith("contaminated by held: fuzzy partial_ratio 0.")
    assert reasons["t-1"].endswith("with task held-1")
    assert reasons["t-2"] == "contaminated by held: same instruction as task held-0"
    assert reasons["t-3"] == "contaminated by other: 1 shared 13-grams with task other-0"  # n-grams before fuzzy
    assert "t-4" not in reasons
    expected = reference(
        train, [("held", list(zip(["held-0", "held-1"], held))), ("other", [("other-0", other[0])])], 13, fuzzy=0.8
    )
    assert reasons == {f"t-{i}": r for i, r in expected.items()}  # the pre-filter lost nothing here
    assert stats["contaminated"] == {
        "held": {"exact": 1, "ngram": 0, "fuzzy": 2},
        "other": {"exact": 0, "ngram": 1, "fuzzy": 0},
    }
    assert stats["rejected_by_reason"] == {"contaminated by held": 3, "contaminated by other": 1}
    # without the fuzzy pass the reworded tasks stay; the counts say so per rule
    out2 = tmp_path / "out2"
    out2.mkdir()
    stats = task_filter.run(
        TaskFilter(dedup=False, decontaminate={"against": ["held", "other"]}),
        Inputs.of(tasks=[tmp_path / "t.parquet"], held_out=refs),
        out2,
    )
    assert stats["contaminated"] == {
        "held": {"exact": 1, "ngram": 0, "fuzzy": 0},
        "other": {"exact": 0, "ngram": 1, "fuzzy": 0},
    }


def test_the_fuzzy_setting_keeps_ids_and_its_knobs_need_it(tmp_path):
    base = _plan(tmp_path, RECIPE.replace("{dedup: true}", "{decontaminate: {against: [held]}}"))["task_filter"]
    fuzzy = _plan(tmp_path, RECIPE.replace("{dedup: true}", "{decontaminate: {against: [held], fuzzy: 0.8}}"))[
        "task_filter"
    ]
    assert fuzzy.id != base.id and fuzzy.identity["decontaminate"] == {"against": ["held"], "fuzzy": 0.8}
    with pytest.raises(ValueError, match="set fuzzy with them"):
        TaskFilter(decontaminate={"against": ["held"], "fuzzy_ngram": 3})
    with pytest.raises(ValueError):
        TaskFilter(decontaminate={"against": ["held"], "fuzzy": 1.5})
