"""`otbuild publish`: a built artifact as a Hub-ready dataset folder that `datasets` loads."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

from otbuild.cli import main
from otbuild.plan import plan_recipe
from otbuild.publish import hub_folder
from otbuild.recipe.load import load_recipe
from otbuild.report.page import size_category
from otbuild.runner import run_spec

RECIPE = """
description: synthetic tasks, filtered
sources:
  synth: {kind: synthetic, rank: 1, count: 2100, seed: 3}
task_filter: {instruction_chars: {min: 10}}
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "r.yaml").write_text(RECIPE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return tmp_path


def _plan():
    return plan_recipe(load_recipe("r", Path.cwd()))


def _build():
    for n in _plan().nodes:
        if n.stage in ("source", "task_filter"):
            run_spec(n.spec())


def test_the_folder_loads_with_datasets_and_its_card_names_the_recipe_and_ids(project):
    from datasets import load_dataset

    _build()
    result = CliRunner().invoke(
        main, ["publish", "r", "task_filter", "--repo", "otbuild/r-tasks", "--dry-run", "--out", "hub"]
    )
    assert result.exit_code == 0, result.output
    nodes = {n.label: n for n in _plan().nodes}
    kept = nodes["task_filter"].main_output
    ds = load_dataset(str(project / "hub"), split="train")
    assert ds.num_rows == pq.read_metadata(kept).num_rows > 2000
    assert ds.column_names == pq.read_schema(kept).names
    assert ds[0]["task_id"] == pq.read_table(kept, columns=["task_id"]).column(0)[0].as_py()
    card = (project / "hub" / "README.md").read_text()
    header = yaml.safe_load(card.split("---\n")[1])
    assert header["configs"][0]["data_files"][0]["path"] == "data/train-*.parquet"
    assert "recipe\n`r`" in card or "recipe `r`" in card.replace("\n", " ")
    assert nodes["task_filter"].id in card and nodes["sources/synth"].id in card
    manifest = json.loads((project / "hub" / "manifest.json").read_text())
    assert manifest["artifact"]["id"] == nodes["task_filter"].id
    assert [u["id"] for u in manifest["upstream"]] == [nodes["sources/synth"].id]
    for f in manifest["files"]:
        assert hashlib.sha256((project / "hub" / f["path"]).read_bytes()).hexdigest() == f["sha256"]
    assert yaml.safe_load((project / "hub" / "recipe.resolved.yaml").read_text())["sources"]["synth"]["count"] == 2100


def test_the_card_has_the_hub_metadata_and_the_reports_license(project):
    from huggingface_hub import DatasetCard

    from tests.conftest import write_source

    _build()
    plan = _plan()
    hub_folder(plan, "task_filter", project / "hub", "otbuild/r-tasks")
    data = DatasetCard((project / "hub" / "README.md").read_text()).data  # what the Hub reads
    assert (data.license, data.task_categories, data.language) == ("unknown", ["text-generation"], ["en"])
    assert data.size_categories == ["1K<n<10K"]  # > 2000 rows
    # a source whose tasks record a licence: the card says it, as the report's card does
    source = {n.label: n for n in plan.nodes}["sources/synth"]
    write_source(source.main_output, "synth", ["one task here", "two tasks here"], license=["mit", "mit"])
    hub_folder(plan, "task_filter", project / "hub2", "otbuild/r-tasks")
    assert DatasetCard((project / "hub2" / "README.md").read_text()).data.license == "mit"


def test_size_categories_are_the_hubs_and_a_bound_opens_its_bucket():
    """One rule for publish's card and the report's: each count gets one of the Hub's names."""
    cases = {
        0: "n<1K",
        999: "n<1K",
        1_000: "1K<n<10K",
        9_999: "1K<n<10K",
        10_000: "10K<n<100K",
        100_000: "100K<n<1M",
        999_999: "100K<n<1M",
        1_000_000: "1M<n<10M",
        9_999_999: "1M<n<10M",
        10_000_000: "10M<n<100M",
        99_999_999: "10M<n<100M",
        100_000_000: "100M<n<1B",
        10**9: "1B<n<10B",
        10**10: "10B<n<100B",
        10**11: "100B<n<1T",
        10**12: "n>1T",
    }
    assert {n: size_category(n) for n in cases} == cases


def test_big_tables_are_sharded_and_nothing_is_written_over(project):
    _build()
    manifest = hub_folder(_plan(), "task_filter", project / "hub", "otbuild/r", max_shard_bytes=1)
    assert [f["path"] for f in manifest["files"]] == [
        "data/train-00000-of-00003.parquet",
        "data/train-00001-of-00003.parquet",
        "data/train-00002-of-00003.parquet",
    ]  # 1024-row batches
    assert sum(f["rows"] for f in manifest["files"]) == pq.read_metadata(_plan().nodes[-2].main_output).num_rows
    again = CliRunner().invoke(
        main, ["publish", "r", "task_filter", "--repo", "otbuild/r", "--dry-run", "--out", "hub"]
    )
    assert again.exit_code == 2 and "exists" in again.output


def test_errors_name_what_is_wrong(project):
    run = CliRunner().invoke
    assert "is not built" in run(main, ["publish", "r", "task_filter", "--repo", "o/n", "--dry-run"]).output
    assert "no artifact 'nope'" in run(main, ["publish", "r", "nope", "--repo", "o/n", "--dry-run"]).output
    bad = run(main, ["publish", "r", "task_filter", "--repo", "not a repo", "--dry-run"])
    assert bad.exit_code == 2 and "expected ORG/NAME" in bad.output
    no_token = run(main, ["publish", "r", "task_filter", "--repo", "o/n"])
    assert no_token.exit_code == 2 and "no Hugging Face token" in no_token.output
    assert not (project / "publish").exists()
