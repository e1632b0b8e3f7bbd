"""The trace path at scale: shards keep to their own files, every stage streams (0, 1 and many
rows), and realistic traces go through an import and the trace filter in bounded memory."""

from __future__ import annotations

import builtins
import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from otbuild.stages.trace_filter import TraceFilter
from otbuild.stages import rollout, trace_filter, trace_import
from otbuild.stagekit import shard_path
from otbuild.settings.stages import RolloutSettings
from otbuild.stages import STAGES
from otbuild.train.export import export_llamafactory

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
from scale import measured  # noqa: E402
from tracegen import write_messages_jsonl, write_partials  # noqa: E402


def tasks_table(path: Path, n: int) -> Path:
    pq.write_table(pa.table({"task_id": pa.array([f"t{i}" for i in range(n)], pa.string())}), path)
    return path


def finished_rollout(tmp_path: Path, n: int, shards: int, written_with: int | None = None) -> tuple[dict, Path, Path]:
    """A rollout whose n trials all finished (partial files present, as after a kill)."""
    tasks = tasks_table(tmp_path / "tasks.parquet", n)
    outdir = tmp_path / "rollout"
    write_partials(outdir / "shards", n, written_with or shards)
    return RolloutSettings(engine="oracle", shards=shards), tasks, outdir


def test_a_shard_never_opens_another_shards_partial_file(tmp_path, monkeypatch, capsys):
    settings, tasks, outdir = finished_rollout(tmp_path, 9, 3)
    opened = []
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda f, *a, **k: opened.append(Path(f).name) or real_open(f, *a, **k))
    rollout.run_shard(settings, [tasks], outdir, 1)
    assert "shard 1: 3 trials, 3 already done, 0 to run" in capsys.readouterr().out
    assert {n for n in opened if n.endswith(".partial.jsonl")} == {"1-of-3.partial.jsonl"}
    assert pq.read_table(shard_path(outdir, 3, 1), columns=["task"]).column(0).to_pylist() == [
        f"task-{t // 2:06d}" for t in (1, 4, 7)
    ]


def test_a_restart_with_another_shard_count_reuses_every_finished_trial(tmp_path, capsys):
    """Trials finished under shards: 3 are taken over by the shards of a run with shards: 2."""
    settings, tasks, outdir = finished_rollout(tmp_path, 7, 2, written_with=3)
    for k in range(2):
        rollout.run_shard(settings, [tasks], outdir, k)
    out = capsys.readouterr().out
    assert "shard 0: 4 trials, 4 already done, 0 to run" in out and "shard 1: 3 trials, 3 already done" in out
    stats = rollout.run(settings, [tasks], outdir)
    assert not list((outdir / "shards").glob("*.partial.jsonl"))  # the stale ones too
    got = pq.read_table(outdir / "traces.parquet", columns=["trial_name"]).column(0).to_pylist()
    assert got == [f"task-{t // 2:06d}__{t % 2}" for t in range(7)]  # each trial once, in trial order
    assert stats["trials"] + stats["subagent_traces"] == 7


@pytest.mark.parametrize("n", [0, 1, 5])
def test_few_rows_pass_through_every_trace_stage(tmp_path, n):
    settings, tasks, outdir = finished_rollout(tmp_path, n, 3)
    for k in range(3):
        rollout.run_shard(settings, [tasks], outdir, k)
    stats = rollout.run(settings, [tasks], outdir)
    traces = outdir / "traces.parquet"
    assert pq.read_table(traces).num_rows == n
    assert stats["trials"] + stats["subagent_traces"] == n

    src = tmp_path / "chats.jsonl"
    write_messages_jsonl(src, n)
    imp = trace_import.run(
        STAGES["trace_import"].config(
            {"name": "chats", "kind": "messages-jsonl", "path": str(src), "allow_empty": n == 0}
        ),
        [],
        tmp_path / "imp",
    )
    assert imp["traces"] == n and pq.read_table(tmp_path / "imp" / "traces.parquet").num_rows == n

    tf = trace_filter.run(TraceFilter(), [traces, tmp_path / "imp" / "traces.parquet"], tmp_path / "tf")
    kept = pq.read_table(tmp_path / "tf" / "kept.parquet")
    rejected = pq.read_table(tmp_path / "tf" / "rejected.parquet")
    assert (
        tf["kept"] == kept.num_rows
        and tf["rejected"] == rejected.num_rows
        and kept.num_rows + rejected.num_rows == 2 * n
    )
    assert rejected.column_names[-2:] == ["reason", "rejected_by"]
    exported = export_llamafactory([tmp_path / "tf" / "kept.parquet"], tmp_path / "lf")
    assert exported["rows"] == kept.num_rows == len(json.loads((tmp_path / "lf" / "otbuild_sft.json").read_text()))


def test_the_filter_keeps_input_order_and_rejects_with_reasons(tmp_path):
    """The wide rows are streamed once, in order; each lands in kept or rejected by its reason."""
    settings, tasks, outdir = finished_rollout(tmp_path, 300, 4)
    for k in range(4):
        rollout.run_shard(settings, [tasks], outdir, k)
    rollout.run(settings, [tasks], outdir)
    rows = pq.read_table(outdir / "traces.parquet", columns=["trial_name", "n_turns", "timed_out"]).to_pylist()
    stats = trace_filter.run(TraceFilter(), [outdir / "traces.parquet"], tmp_path / "tf")
    kept = pq.read_table(tmp_path / "tf" / "kept.parquet").to_pylist()
    rejected = pq.read_table(tmp_path / "tf" / "rejected.parquet").to_pylist()
    order = [r["trial_name"] for r in rows]
    for part in (kept, rejected):
        names = [r["trial_name"] for r in part]
        assert names == sorted(names, key=order.index)
    assert all(r["n_turns"] >= 5 and not r["timed_out"] for r in kept)
    assert {r["reason"].split(":")[0] for r in rejected} >= {"min_turns", "timed_out", "duplicate"}
    assert stats["rejected_by_reason"]["min_turns"] == sum(1 for r in rejected if r["reason"].startswith("min_turns"))


@pytest.mark.slow
def test_5000_realistic_traces_import_and_filter_under_2gb(tmp_path):
    """~110 KB traces (5-100 turns, <think> blocks, terminal outputs): the import and the trace
    filter with default settings finish, and neither process goes over 2 GB."""
    src = tmp_path / "chats.jsonl"
    write_messages_jsonl(src, 5000)
    spec = {
        "stage": "trace_import",
        "id": "i" * 16,
        "outdir": str(tmp_path / "imp"),
        "inputs": [],
        "settings": {"name": "chats", "kind": "messages-jsonl", "path": str(src)},
    }
    code, rss = measured(
        [sys.executable, "-m", "otbuild", "stage", "trace_import", "--spec", json.dumps(spec)], tmp_path / "import.log"
    )
    assert code == 0, (tmp_path / "import.log").read_text()
    assert rss < 2048, f"trace_import peaked at {rss:.0f} MB"
    traces = tmp_path / "imp" / "traces.parquet"
    assert pq.read_metadata(traces).num_rows == 5000
    src.unlink()
    spec = {
        "stage": "trace_filter",
        "id": "f" * 16,
        "outdir": str(tmp_path / "tf"),
        "inputs": [{"id": "i" * 16, "stage": "trace_import", "path": str(traces)}],
        "settings": TraceFilter().model_dump(),
    }
    code, rss = measured(
        [sys.executable, "-m", "otbuild", "stage", "trace_filter", "--spec", json.dumps(spec)], tmp_path / "filter.log"
    )
    assert code == 0, (tmp_path / "filter.log").read_text()
    assert rss < 2048, f"trace_filter peaked at {rss:.0f} MB"
    kept, rejected = (pq.read_metadata(tmp_path / "tf" / f).num_rows for f in ("kept.parquet", "rejected.parquet"))
    assert kept + rejected == 5000 and 3500 < kept < 5000


def test_validate_refuses_a_rollout_that_overcommits_its_job(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from otbuild.cli import main

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    profile = tmp_path / "small"
    profile.mkdir()
    (profile / "config.yaml").write_text('set-resources:\n  rollout:\n    mem_mb: "6000 * attempt"\n')
    res = CliRunner().invoke(main, ["validate", "--profile", str(profile), "smoke"])
    assert res.exit_code == 2, res.output
    assert "teacher: concurrency 2 x limits.memory_mb 4096 = 8192 MB is more than the job's 6000 MB" in res.output
    assert "lower concurrency to 1 or limits.memory_mb to 3000, or give the job more memory" in res.output
    (profile / "config.yaml").write_text("set-resources:\n  rollout:\n    mem_mb: 64000\n")
    assert CliRunner().invoke(main, ["validate", "--profile", str(profile), "smoke"]).exit_code == 0
    assert CliRunner().invoke(main, ["validate", "--profile", "slurm", "otagent_v2_100k"]).exit_code == 0
    # an eval that leaves concurrency unset runs its engine's default (transformers: 2) at once
    (profile / "config.yaml").write_text("set-resources:\n  eval:\n    mem_mb: 6000\n")
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "smoke.yaml").write_text(Path("recipes/smoke.yaml").read_text())
    (recipes / "unset.yaml").write_text(
        "extends: smoke\neval: {concurrency: null, serve_with: transformers, engine_args: null}\n"
    )
    res = CliRunner().invoke(main, ["validate", "--profile", str(profile), str(recipes / "unset.yaml")])
    assert res.exit_code == 2 and "eval: concurrency 2 x limits.memory_mb 4096 = 8192 MB" in res.output, res.output


def test_duckdb_memory_and_spill_dir_come_from_the_job(monkeypatch, tmp_path):
    from otbuild import duck, jobs

    for var in (
        "OTBUILD_DUCKDB_MEMORY",
        "OTBUILD_JOB_MEM_MB",
        "SLURM_MEM_PER_NODE",
        "OTBUILD_DUCKDB_TEMP",
        "SLURM_TMPDIR",
    ):
        monkeypatch.delenv(var, raising=False)
    assert jobs.duckdb_memory() == "1024MB"
    monkeypatch.setenv("SLURM_MEM_PER_NODE", "16000")
    monkeypatch.setenv("SLURM_TMPDIR", str(tmp_path))
    assert jobs.duckdb_memory() == "12000MB" and jobs.spill_dir() == tmp_path / "otbuild-duckdb"
    with duck.connect() as con:
        limit, temp = con.execute(
            "SELECT current_setting('memory_limit'), current_setting('temp_directory')"
        ).fetchall()[0]
    assert limit.startswith("11.1") and temp == str(tmp_path / "otbuild-duckdb")
    monkeypatch.setenv("OTBUILD_DUCKDB_MEMORY", "3GB")
    assert jobs.duckdb_memory() == "3GB"
