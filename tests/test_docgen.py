"""The generated docs are what the code makes now: docs/recipe-reference.md (the settings
models), docs/cli.md (the click commands), README.md's stage table and docs/architecture.md's
stage map (the stage registry)."""

from __future__ import annotations

import sys

from otbuild import docgen
from otbuild.recipe.schema import Recipe
from tests.conftest import REPO


def test_the_generated_docs_are_current():
    stale = [str(p.relative_to(REPO)) for p in docgen.stale(REPO)]
    assert not stale, f"{', '.join(stale)} differ from what the code makes: run `{docgen.REGENERATE}` and commit them"


def test_the_recipe_reference_has_every_key_of_every_section():
    text = docgen.recipe_reference()
    for model in docgen.walk(Recipe):
        section = text.split(f"\n### {model.__name__}\n", 1)[1].split("\n### ", 1)[0]
        missing = [key for key in model.model_fields if f"| `{key}` |" not in section]
        assert not missing, (model.__name__, missing)
    assert "| `min_turns` | int (>= 0) | `5` |" in text
    assert "| `shards` | int (>= 1, <= 10000) | `1` | *execution only*; separate Snakemake jobs" in text
    assert "[VLLMOptions](#vllmoptions)" in text and "\n### VLLMOptions\n" in text  # engine_args' launch options
    assert "](#searchcandidate)" not in text  # no link to a section that is not there


def test_the_cli_reference_has_every_command():
    text = docgen.cli_reference()
    for name in ("init", "validate", "plan", "build", "audit", "export llamafactory", "ingest harbor-job"):
        assert f"\n## `otbuild {name}`\n" in text, name
    assert "| `--estimate` |" in text and "| `-n, --dry-run` |" in text and "| `--help` |" not in text
    assert "\n## `otbuild stage NAME`\n" in text and "`otbuild stage rollout`" not in text
    assert all(
        f"- `{d.name}`: Run the '{d.name}' stage (version {d.version})." in text for d in docgen.built_in_stages()
    )


def test_the_stage_table_is_the_registry_in_order():
    rows = docgen.stage_table().splitlines()[2:]
    assert [r.split("|")[2].strip(" `") for r in rows] == [d.name for d in docgen.built_in_stages()]
    assert "| `teacher` | `rollout` | `artifacts/rollout/<id>/`: traces.parquet | `RolloutSettings` |" in rows
    assert "| `task_filter.llm` | `task_score` |" in docgen.stage_table()
    assert rows[-1].startswith("| - | `report` |")  # no recipe key of its own


def test_the_stage_map_is_the_registry_in_order_with_its_shape():
    rows = docgen.stage_map().splitlines()[2:]
    assert [r.split("|")[2].strip(" `") for r in rows] == [d.name for d in docgen.built_in_stages()]
    for d, row in zip(docgen.built_in_stages(), rows, strict=True):
        name, module = docgen.settings_model(d)
        assert f"| `artifacts/{d.name}/<id>/` | `{name}` (`{module}`) |" in row
        assert getattr(sys.modules[module], name) is d.settings
        assert all(kind in row.split("|")[5] for kind in d.consumes)
        assert f"`{d.outputs[0]}`" in row.split("|")[6]
    rollout = next(r for r in rows if "| `rollout` |" in r)
    assert rollout.startswith("| `teacher` | `rollout` |") and rollout.endswith("| tasks | traces: `traces.parquet` |")
    assert "| checkpoint, tasks | checkpoint: `checkpoint.json`" in docgen.stage_map()
    assert (
        docgen.MAP_BEGIN + "\n" + docgen.stage_map() + docgen.MAP_END in (REPO / "docs" / "architecture.md").read_text()
    )
