"""near_dedup: MinHash LSH over normalised instructions, candidates checked exactly. On the real
dev pile (Stack Exchange titles, SWE-bench and SWE-smith issues, TermiGen tasks) with twins made
by small edits of real texts: each twin is dropped naming its kept twin and their similarity, a
pair under the threshold and the pile's own related tasks are kept, a benchmark's twin is dropped
as such; the greedy rule, the guard, and the plan that wires the benchmarks."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pytest

from otbuild.errors import ConfigError
from otbuild.plan import plan_recipe
from otbuild.recipe.load import load_recipe
from otbuild.sources import read_source
from otbuild.stagekit import Inputs
from otbuild.stages import STAGES, near_dedup
from otbuild.stages.near_dedup import NearDedup
from otbuild.tasks.table import TaskRecord, write_tasks
from tests.conftest import DATA, make_task, write_source
from tests.stages.test_decontaminate import RECIPE, _plan  # two sources, a mix, a task filter, a benchmark


def _read(kind: str, path: Path) -> list[TaskRecord]:
    cfg = STAGES["source"].config({"name": kind.replace("-", "_"), "kind": kind, "path": str(path)})
    return [r for r in read_source(cfg) if isinstance(r, TaskRecord)]


def _jaccard(a: str, b: str, k: int = 5) -> float:
    """The rule, written out apart from the stage: 5-character shingles of the lower-cased text
    with its whitespace runs made one space."""

    def grams(t: str) -> set[str]:
        t = re.sub(r"\s+", " ", t.lower()).strip()
        return {t[i : i + k] for i in range(len(t) - k + 1)}

    x, y = grams(a), grams(b)
    return len(x & y) / len(x | y)


def _run(tmp_path: Path, tasks: list[Path], held: list[Path] = (), **settings) -> tuple[dict, dict, list]:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    stats = near_dedup.run(NearDedup(**settings), Inputs.of(tasks=tasks, held_out=list(held)), out)
    rejected = dict(duckdb.sql(f"SELECT path, reason FROM '{out / 'rejected.parquet'}'").fetchall())
    kept = [p for (p,) in duckdb.sql(f"SELECT path FROM '{out / 'kept.parquet'}'").fetchall()]
    return stats, rejected, kept


def _edit(text: str, *swaps: tuple[str, str], tail: str = "") -> str:
    for old, new in swaps:
        assert old in text, old
        text = text.replace(old, new, 1)
    return text + tail


@pytest.mark.skipif(not DATA.is_dir(), reason=f"dev data not found at {DATA}")
def test_real_twins_are_dropped_naming_their_kept_twin_and_nothing_else_is(tmp_path):
    se = _read("stackexchange", DATA / "stackexchange")
    swe = _read("swe-instances", DATA / "swebench_verified" / "instances.jsonl")
    smith = _read("swe-instances", DATA / "swesmith")
    termigen = _read("harbor-dir", DATA / "terminal_bench_tasks" / "harbor_format" / "termigen_no_solution")
    tb2 = _read("harbor-dir", DATA / "terminal_bench_tasks" / "harbor_format" / "tb2_ot_fewshots")
    text = {r.task.name: r.task.instruction for r in [*se, *swe, *smith, *termigen, *tb2]}

    # twins as a pool meets them: a SWE-smith issue generated again with a few words changed
    # (in another source), a Stack Exchange title re-posted in other case and spacing, a
    # TermiGen task with a sentence added; a TermiGen task with its second half replaced is
    # related, not a twin; a SWE-bench Verified issue lightly reworded is a benchmark's twin
    sm, tg, tg2, bench = smith[2].task.name, termigen[3].task.name, termigen[5].task.name, swe[7].task.name
    t_sm = text[sm]
    twins = {
        "smith-regen": (
            _edit(t_sm, *(("the ", "a ") for _ in range(3)), tail="\nThanks for looking into this!"),
            f"task {sm} of swesmith",
        ),
        "se-repost": (
            "  " + text["superuser-335396"].upper().replace(" ", "   "),
            "task superuser-335396 of stackexchange",
        ),
        "tg-plus": (text[tg] + "\nMake sure the output file ends with a newline.", f"task {tg} of termigen"),
        "swe-reworded": (
            _edit(text[bench], ("doesn't set", "does not set"), ("anymore", "any more")),
            f"swebench_verified task {bench}",
        ),
    }
    half = text[tg2][: len(text[tg2]) // 2] + text[termigen[6].task.name][len(text[tg2]) // 2 :]
    sims = {
        name: _jaccard(t, text[sm if name == "smith-regen" else tg if name == "tg-plus" else bench])
        for name, (t, _) in twins.items()
        if name != "se-repost"
    }
    assert all(0.8 <= s < 1 for s in sims.values()), sims  # real edits, not copies
    assert _jaccard(half, text[tg2]) < 0.8 and _jaccard(text["superuser-335396"], text["superuser-125728"]) > 0.5

    write_tasks(tmp_path / "se.parquet", se, source="stackexchange")
    write_tasks(tmp_path / "smith.parquet", smith, source="swesmith")
    write_tasks(tmp_path / "termigen.parquet", termigen, source="termigen")
    planted = [make_task(name, t) for name, (t, _) in twins.items()] + [make_task("tg-half", half)]
    write_tasks(tmp_path / "planted.parquet", planted, source="planted")
    write_tasks(tmp_path / "swe.parquet", swe, source="swebench_verified")
    write_tasks(tmp_path / "tb2.parquet", tb2, source="tb2")

    stats, rejected, kept = _run(
        tmp_path,
        [tmp_path / f"{n}.parquet" for n in ("se", "smith", "termigen", "planted")],
        [tmp_path / "swe.parquet", tmp_path / "tb2.parquet"],
        against=["swebench_verified", "tb2"],
    )
    # exactly the planted twins go, each naming the kept task it copies and their exact similarity
    assert set(rejected) == set(twins), rejected
    for name, (t, twin) in twins.items():
        reason, sim = rejected[name].split(": jaccard ")[0], float(rejected[name].split("jaccard ")[1].split(" ")[0])
        assert rejected[name].endswith(f" with {twin}"), rejected[name]
        assert reason == ("near_benchmark" if name == "swe-reworded" else "near_duplicate")
        original = twin.split(" ")[1] if name != "swe-reworded" else bench
        assert sim == pytest.approx(_jaccard(t, text[original]), abs=5e-4)
    # the real pile loses nothing: its related pairs (0.57 at most) and the half-replaced task stay
    assert {"superuser-335396", "superuser-125728", "tg-half", sm, tg} <= set(kept)
    assert len(kept) == len(se) + len(smith) + len(termigen) + 1
    assert stats["rejected_by_reason"] == {"near_benchmark": 1, "near_duplicate": 3}
    assert stats["near_benchmark"] == {"swebench_verified": 1, "tb2": 0}
    assert stats["lsh"]["bands"] * stats["lsh"]["rows_per_band"] <= 128


def test_a_chain_keeps_both_ends_and_the_earliest_of_a_group(tmp_path):
    """A ~ B and B ~ C but A and C apart: B goes (naming A), C stays; in a group of twins the
    first in input order stays and each other one names its most similar kept twin."""
    words = [f"w{i:03d}" for i in range(160)]
    a = " ".join(words)
    b = " ".join(words[:150] + [f"q{i}" for i in range(150, 160)])
    c = " ".join(words[:138] + [f"z{i}" for i in range(138, 150)] + [f"q{i}" for i in range(150, 160)])
    assert _jaccard(a, b) >= 0.8 and _jaccard(b, c) >= 0.8 and _jaccard(a, c) < 0.8, (
        _jaccard(a, b),
        _jaccard(b, c),
        _jaccard(a, c),
    )
    g = "Rotate the nginx access logs nightly, keep fourteen compressed copies and reload nginx without dropping them."
    write_source(tmp_path / "x.parquet", "x", [a, b, c, g, g.replace("fourteen", "fifteen"), g + " "])
    stats, rejected, kept = _run(tmp_path, [tmp_path / "x.parquet"])
    assert kept == ["x-0", "x-2", "x-3"]
    assert rejected["x-1"] == f"near_duplicate: jaccard {_jaccard(a, b):.3f} with task x-0 of x"
    assert rejected["x-5"] == "near_duplicate: jaccard 1.000 with task x-3 of x"
    assert rejected["x-4"].endswith("with task x-3 of x")
    assert stats["lsh"]["rounds"] >= 2


def test_dropping_most_tasks_fails_naming_why_unless_allowed(tmp_path):
    base = "Write a bash script that finds every log file under /var/log older than seven days and gzips it."
    forms = [base, *(base.replace("seven", f"{n}") for n in range(10, 19))]
    write_source(tmp_path / "x.parquet", "x", forms)
    with pytest.raises(
        RuntimeError, match=r"9 of the 10 tasks \(90.0%\) are near-duplicates.*near_duplicate: 9.*task x-0 of x: 9"
    ):
        _run(tmp_path, [tmp_path / "x.parquet"])
    stats, _, kept = _run(tmp_path, [tmp_path / "x.parquet"], max_dropped_fraction=1.0)
    assert kept == ["x-0"] and stats["rejected"] == 9


def test_empty_and_short_instructions_are_kept_apart(tmp_path):
    write_source(tmp_path / "x.parquet", "x", ["", "", "ls", "ls", "  LS "])
    _, rejected, kept = _run(tmp_path, [tmp_path / "x.parquet"], max_dropped_fraction=1.0)
    assert kept == ["x-0", "x-1", "x-2"] and set(rejected) == {"x-3", "x-4"}


def test_the_section_plans_the_stage_between_the_mix_and_the_filter_with_its_benchmarks(tmp_path):
    plain = _plan(tmp_path, RECIPE)
    assert "near_dedup" not in plain
    nodes = _plan(tmp_path, RECIPE + "near_dedup: {against: [held]}\n")
    nd = nodes["near_dedup"]
    assert [i.label for i in nd.inputs] == ["mix", "benchmarks/held"]
    assert nd.inputs[1].id == nodes["benchmarks/held"].id  # the eval's own benchmark node
    assert [i["name"] for i in nd.spec()["inputs"]] == ["tasks", "held_out"]
    assert [i.label for i in nodes["task_filter"].inputs] == ["near_dedup"]
    assert nodes["mix"].id == plain["mix"].id and nodes["task_filter"].id != plain["task_filter"].id
    assert nd.identity == {"against": ["held"]}  # defaults stay out of the id
    spelled = _plan(tmp_path, RECIPE + "near_dedup: {against: [held], threshold: 0.8, num_perm: 128, shingle: 5}\n")
    assert spelled["near_dedup"].id == nd.id
    assert _plan(tmp_path, RECIPE + "near_dedup: {against: [held], threshold: 0.9}\n")["near_dedup"].id != nd.id
    guard = _plan(tmp_path, RECIPE + "near_dedup: {against: [held], max_dropped_fraction: 0.9}\n")
    assert guard["near_dedup"].id == nd.id  # how it fails is not what it makes
    alone = _plan(tmp_path, RECIPE + "near_dedup: {}\n")["near_dedup"]
    assert [i.label for i in alone.inputs] == ["mix"]


def test_an_unknown_benchmark_is_a_config_error(tmp_path):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "r.yaml").write_text(RECIPE + "near_dedup: {against: [helt]}\n")
    with pytest.raises(ConfigError, match="near_dedup.against.*'helt' is neither a benchmark in eval.benchmarks"):
        load_recipe("r", tmp_path)


def test_its_estimate_is_rows_in_times_a_keep_rate(tmp_path):
    from otbuild.estimate.profile import find_profile
    from otbuild.estimate.run import estimate

    (tmp_path / "recipes").mkdir(exist_ok=True)
    (tmp_path / "recipes" / "r.yaml").write_text(RECIPE + "near_dedup: {against: [held]}\n")
    est = estimate(plan_recipe(load_recipe("r", tmp_path)), [], find_profile(None, tmp_path), tmp_path)
    st = next(s for s in est.stages if s.stage == "near_dedup")
    assert st.counts["tasks_in"].estimate == 10  # the benchmark's 3 are not counted
    assert st.counts["tasks_kept"].estimate == pytest.approx(10 * 0.95, abs=1)
