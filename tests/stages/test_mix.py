"""Mix stage (DuckDB): Top-N quotas, balanced upsampling, order, determinism."""

from collections import Counter

import duckdb
import pytest

from otbuild.stages import mix
from otbuild.stages.mix import MixSettings
from tests.conftest import write_source


def _sources(tmp_path, sizes):
    return [
        write_source(tmp_path / f"s{i}.parquet", f"s{i}", [f"task {i}-{j} do something" for j in range(n)])
        for i, n in enumerate(sizes)
    ]


def _run(tmp_path, inputs, total, order="shuffle", seed=0, name="out"):
    out = tmp_path / name
    out.mkdir()
    settings = {
        "n": len(inputs),
        "total": total,
        "order": order,
        "seed": seed,
        "sources": [f"s{i}" for i in range(len(inputs))],
    }
    mix.run(MixSettings(**settings), inputs, out)
    return duckdb.sql(f"SELECT * FROM '{out / 'tasks.parquet'}'").fetchdf()


def test_exact_quotas_with_remainder_to_best_ranked(tmp_path):
    df = _run(tmp_path, _sources(tmp_path, [50, 50, 50]), total=32)
    assert len(df) == 32
    assert Counter(df["source"]) == {"s0": 11, "s1": 11, "s2": 10}
    assert not df["mix_upsampled"].any()
    assert df.groupby("source")["task_id"].nunique().to_dict() == {"s0": 11, "s1": 11, "s2": 10}


def test_short_source_is_upsampled_evenly_and_recorded(tmp_path):
    df = _run(tmp_path, _sources(tmp_path, [40, 3]), total=20)
    short = df[df["source"] == "s1"]
    assert len(short) == 10
    # 10 slots over 3 tasks: every task 3 or 4 times, copies numbered, first copy not upsampled
    assert sorted(Counter(short["task_id"]).values()) == [3, 3, 4]
    assert set(short["mix_copy"]) == {0, 1, 2, 3}
    assert (short["mix_upsampled"] == (short["mix_copy"] > 0)).all()
    assert (short["mix_rank"] == 2).all() and (df[df["source"] == "s0"]["mix_rank"] == 1).all()


def test_round_robin_interleaves_sources(tmp_path):
    df = _run(tmp_path, _sources(tmp_path, [10, 10, 10]), total=9, order="round_robin")
    assert list(df["source"]) == ["s0", "s1", "s2"] * 3


def test_seeded_and_deterministic(tmp_path):
    inputs = _sources(tmp_path, [30, 30])
    a = _run(tmp_path, inputs, 20, seed=1, name="a")
    b = _run(tmp_path, inputs, 20, seed=1, name="b")
    c = _run(tmp_path, inputs, 20, seed=2, name="c")
    assert list(a["task_id"]) == list(b["task_id"])
    assert list(a["task_id"]) != list(c["task_id"])
    assert set(a["source"]) == {"s0", "s1"}
    # shuffled: not simply one source after the other
    assert list(a["source"]) != sorted(a["source"])


def test_empty_source_is_a_clear_error(tmp_path):
    inputs = [*_sources(tmp_path, [5]), write_source(tmp_path / "empty.parquet", "s1", [])]
    with pytest.raises(mix.MixError, match="'s1'.*no tasks"):
        _run(tmp_path, inputs, 4)
