"""Reproducible rebuilds: fixed file times in trials, the comparison `otbuild audit --rebuild`
makes (volatile columns set aside, differences named), two builds of the smoke (its student
trained briefly) from separate projects giving the same bytes, and the audit passing on a
fresh build and failing after a deliberate change to a stage's output."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from otbuild.hashing import file_sha256
from otbuild.provenance import read_record
from otbuild.rebuild import cheap, compare, sampled
from otbuild.report.page import VOLATILE_BEGIN, VOLATILE_END
from otbuild.sandbox.layout import FILE_TIME, file_time, stamp_tree
from tests.conftest import REPO, make_project, otbuild, snakemake


def test_laid_out_files_carry_a_fixed_time(tmp_path, monkeypatch):
    (tmp_path / "app" / "sub").mkdir(parents=True)
    (tmp_path / "app" / "sub" / "f.txt").write_text("x")
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    stamp_tree(tmp_path)
    assert {p.stat().st_mtime for p in [tmp_path, *tmp_path.rglob("*")]} == {FILE_TIME}
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    assert file_time() == 1700000000


def _record(d: Path, names: list[str]) -> dict:
    return {"outputs": [{"path": str(d / n)} for n in names]}


def _traces(path: Path, dates: list[str], rewards: list[float], metadata: list[dict] | None = None) -> None:
    meta = [json.dumps(m, sort_keys=True) for m in metadata or [{}] * 3]
    pq.write_table(pa.table({"task_id": ["a", "b", "c"], "date": dates, "reward": rewards, "metadata": meta}), path)


def test_compare_sets_volatile_columns_aside_and_names_the_rest(tmp_path):
    built, again = tmp_path / "built", tmp_path / "again"
    built.mkdir(), again.mkdir()
    _traces(built / "traces.parquet", ["d1", "d2", "d3"], [1.0, 0.0, 1.0])
    _traces(again / "traces.parquet", ["e1", "e2", "e3"], [1.0, 0.0, 1.0])
    o = compare("rollout", _record(built, ["traces.parquet"]), built, again)
    assert o.result == "identical" and o.notes == ["traces.parquet: set aside date"]
    _traces(again / "traces.parquet", ["e1", "e2", "e3"], [1.0, 1.0, 1.0])
    o = compare("rollout", _record(built, ["traces.parquet"]), built, again)
    assert o.result == "differs" and o.differences == ["traces.parquet: column reward differs, first at row 1"]
    # an LLM-sampled stage: rewards may differ (noted), task ids may not
    o = compare("rollout", _record(built, ["traces.parquet"]), built, again, is_sampled=True)
    assert o.result == "sampled" and not o.is_finding
    assert sampled("rollout", {"engine": "vllm"}) and not sampled("rollout", {"engine": "oracle"})
    assert cheap("rollout", {"engine": "oracle"}) and cheap("mix", {}) and not cheap("sft", {})


def test_compare_sets_volatile_metadata_keys_aside_at_any_depth(tmp_path):
    """The verifier's seconds (the trial's, each step's) are measurements; the rest of the
    metadata is not."""
    built, again = tmp_path / "built", tmp_path / "again"
    built.mkdir(), again.mkdir()

    def meta(seconds: float, stop: str = "done") -> list[dict]:
        return [{"verifier_s": seconds, "stop_reason": stop, "steps": [{"name": "a", "verifier_s": seconds}]}] * 3

    _traces(built / "traces.parquet", ["d"] * 3, [1.0] * 3, meta(0.5))
    _traces(again / "traces.parquet", ["d"] * 3, [1.0] * 3, meta(0.7))
    o = compare("trace_filter", _record(built, ["traces.parquet"]), built, again)
    assert o.result == "identical" and o.notes == ["traces.parquet: set aside metadata (verifier_s, timings)"]
    _traces(again / "traces.parquet", ["d"] * 3, [1.0] * 3, meta(0.7, stop="timeout"))
    o = compare("trace_filter", _record(built, ["traces.parquet"]), built, again)
    assert o.differences == ["traces.parquet: column metadata differs, first at row 0"]


def test_compare_json_lines_text_regions_and_files(tmp_path):
    built, again = tmp_path / "built", tmp_path / "again"
    built.mkdir(), again.mkdir()
    (built / "train_log.jsonl").write_text('{"step": 1, "loss": 2.0, "time": 1.5}\n')
    (again / "train_log.jsonl").write_text('{"step": 1, "loss": 2.0, "time": 9.1}\n')
    page = "<h1>r</h1>\n{b}\n<p>runtime {t}</p>\n{e}\n<p>rows {n}</p>\n"
    (built / "report.html").write_text(page.format(b=VOLATILE_BEGIN, e=VOLATILE_END, t=3, n=5))
    (again / "report.html").write_text(page.format(b=VOLATILE_BEGIN, e=VOLATILE_END, t=4, n=5))
    (built / "events.out.tfevents.1.host.1.0.sft").write_bytes(b"a")
    (again / "events.out.tfevents.2.host.2.0.sft").write_bytes(b"b")
    (built / "model.safetensors").write_bytes(b"w")
    (again / "model.safetensors").write_bytes(b"w")
    names = ["model.safetensors", "train_log.jsonl", "report.html", "events.out.tfevents.1.host.1.0.sft"]
    assert compare("sft", _record(built, names), built, again).result == "identical"
    (again / "report.html").write_text(page.format(b=VOLATILE_BEGIN, e=VOLATILE_END, t=4, n=6))
    (again / "train_log.jsonl").write_text('{"step": 1, "loss": 2.5, "time": 9.1}\n')
    (again / "model.safetensors").write_bytes(b"v")
    o = compare("sft", _record(built, names), built, again)
    assert o.differences == [
        "model.safetensors: bytes differ",
        "train_log.jsonl: key(s) loss differ at line 1",
        "report.html: differs from line 5: '<p>rows 5</p>'",
    ]


def test_rebuild_options_are_usage_errors_without_rebuild(tmp_path):
    assert otbuild(tmp_path, "audit", "smoke", "mix").returncode == 2
    assert otbuild(tmp_path, "audit", "smoke", "--all").returncode == 2


# -- end to end: two builds, and the audit ------------------------------------------------------
# the smoke recipe with its student trained briefly and no RL (whose rollouts vLLM samples: no
# two builds of it compare byte for byte), each build a third of the smoke's time
SHORT = (
    "extends: smoke\ntask_filter: {sample: {n: 24, seed: 0}}\nsft: {max_steps: 100}\nrl: null\n"
    "eval: {base: false, benchmarks: {heldout: {count: 6}}}\n"
)


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory) -> tuple[Path, Path]:
    """`short` built twice, each in a project of its own (two clones, as two users build it)."""
    projects = []
    for name in ("first", "second"):
        project = make_project(tmp_path_factory.mktemp(name))
        shutil.copy(REPO / "recipes" / "smoke.yaml", project / "recipes")
        (project / "recipes" / "short.yaml").write_text(SHORT)
        snakemake(project, "short")
        projects.append(project)
    return projects[0], projects[1]


@pytest.mark.slow
def test_two_builds_give_the_same_bytes(two_builds):
    """Byte for byte but for the declared volatile parts, except what a model server sampled:
    where vLLM is installed the smoke serves its student on it (`auto`), which promises no
    determinism; the eval is then compared as sampled (its rows and key columns), and the
    report that counts its tokens is left out."""
    from otbuild.rebuild import sampled

    first, second = two_builds
    dirs = sorted(p.relative_to(first) for p in (first / "artifacts").glob("*/*"))
    assert dirs == sorted(p.relative_to(second) for p in (second / "artifacts").glob("*/*"))
    records = {d: read_record(first / d) for d in dirs}
    how = {d: sampled(r["stage"], r["settings"], r.get("stats")) for d, r in records.items()}
    served = any(how.values())  # a server sampled some answers: the report counts their tokens
    outcomes = {
        str(d): compare(r["stage"], r, first / d, second / d, how[d])
        for d, r in records.items()
        if not (served and r["stage"] == "report")
    }
    assert {d: o.differences for d, o in outcomes.items() if o.result not in ("identical", "sampled")} == {}
    assert len(outcomes) >= len(dirs) - 2
    # byte for byte but for the declared volatile columns, files and regions
    aside = {note for o in outcomes.values() if o.result == "identical" for note in o.notes}
    assert all("set aside" in n for n in aside), aside


@pytest.mark.slow
def test_audit_rebuild_passes_then_names_a_changed_output(two_builds):
    second = two_builds[1]
    res = otbuild(second, "audit", "--rebuild", "short")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "all 8 rebuilt artifact(s) match" in res.stdout
    assert not any((second / ".otbuild" / "rebuild").glob("*/*/*"))  # matched: removed
    mix = next((second / "artifacts" / "mix").iterdir())
    assert json.loads((mix / ".rebuild.json").read_text())["result"] == "identical"
    report = next((second / "artifacts" / "report").iterdir())
    for name in ("report.html", "dataset_card.md"):
        assert "rebuilt at (UTC)" in (report / name).read_text()
    assert otbuild(second, "audit", "--verify", "short").returncode == 0  # the records still hold
    # a stage that made other bytes than its rebuild: one task's instruction changed, its record
    # updated (so the lineage audit still passes), as a nondeterministic stage would leave it
    tasks = mix / "tasks.parquet"
    table = pq.read_table(tasks)
    instructions = table.column("instruction").to_pylist()
    instructions[3] += " (changed)"
    pq.write_table(
        table.set_column(table.schema.get_field_index("instruction"), "instruction", pa.array(instructions)), tasks
    )
    record = read_record(mix)
    record["outputs"][0].update(sha256=file_sha256(tasks, cached=False), bytes=os.path.getsize(tasks))
    (mix / "provenance.json").write_text(json.dumps(record))
    res = otbuild(second, "audit", "--rebuild", "short", "mix")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "tasks.parquet: column instruction differs, first at row 3" in res.stdout
    assert any((second / ".otbuild" / "rebuild" / "mix").iterdir())  # kept for a look
