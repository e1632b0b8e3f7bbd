"""The cross-benchmark z-score ranking against an independent numpy computation."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from otbuild.stages import rank
from otbuild.stages.rank import RankSettings


def _summaries(tmp_path, table: dict[str, dict[str, float]]) -> list:
    paths = []
    for cand, scores in table.items():
        p = tmp_path / f"{cand}.parquet"
        pq.write_table(
            pa.table({"model": ["m"] * len(scores), "benchmark": list(scores), "mean": list(scores.values())}), p
        )
        paths.append(p)
    return paths


def _rank(tmp_path, table):
    out = tmp_path / "out"
    out.mkdir()
    rank.run(RankSettings(candidates=list(table)), _summaries(tmp_path, table), out)
    return {r["candidate"]: r for r in pq.read_table(out / "ranking.parquet").to_pylist()}


@pytest.mark.parametrize("seed", range(5))
def test_matches_numpy_on_random_tables(tmp_path, seed):
    rng = np.random.default_rng(seed)
    k, b = rng.integers(2, 9), rng.integers(1, 5)
    a = rng.random((k, b)).round(3)
    a[:, 0] = 0.5 if b > 1 else a[:, 0]  # a benchmark where every candidate scores the same
    table = {f"c{i}": {f"b{j}": float(a[i, j]) for j in range(b)} for i in range(k)}
    got = _rank(tmp_path, table)
    sigma = a.std(axis=0)  # population standard deviation (ddof=0)
    z = np.where(sigma > 0, (a - a.mean(axis=0)) / np.where(sigma > 0, sigma, 1), 0.0)
    expected = z.mean(axis=1)
    for i in range(k):
        assert got[f"c{i}"]["mean_z"] == pytest.approx(expected[i], abs=1e-9)
    order = sorted(range(k), key=lambda i: -expected[i])
    assert got[f"c{order[0]}"]["rank"] == 1
    assert all(r["complete"] and r["missing"] == [] for r in got.values())


def test_constant_benchmark_contributes_zero_not_nan(tmp_path):
    got = _rank(tmp_path, {"a": {"x": 0.3, "y": 0.9}, "b": {"x": 0.3, "y": 0.1}})
    assert got["a"]["mean_z"] == pytest.approx(0.5) and got["b"]["mean_z"] == pytest.approx(-0.5)


def test_candidate_missing_a_benchmark_is_flagged_not_ranked(tmp_path):
    got = _rank(tmp_path, {"a": {"x": 0.2, "y": 0.5}, "b": {"x": 0.4, "y": 0.7}, "c": {"x": 0.9}})
    assert got["c"]["complete"] is False and got["c"]["missing"] == ["y"] and got["c"]["rank"] is None
    assert got["b"]["rank"] == 1 and got["a"]["rank"] == 2
    # y's mean and sd come from a and b only
    assert got["a"]["n_benchmarks"] == 2 and got["c"]["n_benchmarks"] == 1


def test_rank_by_partial_credit(tmp_path):
    """`metric: partial_credit` ranks on the summary's partial_mean instead of pass@1."""
    paths = []
    for cand, (mean, partial) in {"a": (0.2, 0.9), "b": (0.4, 0.5)}.items():
        paths.append(tmp_path / f"{cand}.parquet")
        pq.write_table(
            pa.table({"model": ["m"], "benchmark": ["x"], "mean": [mean], "partial_mean": [partial]}), paths[-1]
        )
    for metric, best in (("pass_at_1", "b"), ("partial_credit", "a")):
        out = tmp_path / metric
        out.mkdir()
        stats = rank.run(RankSettings(candidates=["a", "b"], metric=metric), paths, out)
        assert stats["best"] == [best] and stats["metric"] == metric
