"""bench/vllm.py at a tiny size: both loads run on one real vLLM server and the table compares them."""

from __future__ import annotations

import re

import pytest

from otbuild.engines.vllm import vllm_executable
from otbuild.settings.engines import VLLMOptions
from tests.conftest import run_bench

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        vllm_executable(VLLMOptions()) is None, reason="no vLLM here: make vllm-env (scripts/vllm-env.sh)"
    ),
]


def test_bench_vllm_tiny(tmp_path):
    out = run_bench(
        "vllm.py",
        "--concurrency",
        "2",  # one level: otbuild 8 times (now, before, ids, captured, [vLLM], captured, ids, before, now)
        "--trials",
        "1",
        "--max-tokens",
        "16",
        "--episodes",
        "2",
        "--eager",
        "--out",
        str(tmp_path),
        timeout=900,
    )
    assert "against `vllm bench serve` on one vllm serve" in out, out
    for c in (
        2,
    ):  # concurrency, requests (2 runs of c trials x 2), prompt tokens, vLLM tok/s, ours, ratio, trials/s, share
        m = re.search(rf"^\s+{c}\s+{4 * c}\s+\d+\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x\s+[\d.]+\s+-?\d+%$", out, re.M)
        assert m, out
        vllm_tok_s, ours, ratio = map(float, m.groups())
        assert vllm_tok_s > 0 and ours > 0 and abs(ours / vllm_tok_s - ratio) < 0.01
    for c in (2,):  # the harness's share before and now: tok/s, shares, their ratio, the capture's cost
        m = re.search(rf"^\s+{c}\s+([\d.]+)\s+([\d.]+)\s+(-?\d+)%\s+(-?\d+)%\s+(-?[\d.]+x|-)\s+-?[\d.]+%$", out, re.M)
        assert m, out
        then, now = float(m[1]), float(m[2])
        assert then > 0 and now > 0 and int(m[4]) <= 100 and int(m[3]) <= 100
    for c in (2,):  # the capture's cost: tok/s without, with the token ids, its cost, with the log-probs too, its cost
        m = re.search(rf"^\s+{c}\s+([\d.]+)\s+([\d.]+)\s+(-?[\d.]+)%\s+([\d.]+)\s+(-?[\d.]+)%$", out, re.M)
        assert m, out
        plain, proxied, proxy_cost, captured, cost = map(float, m.groups())
        assert plain > 0 and proxied > 0 and captured > 0
        for tok_s, printed in ((proxied, proxy_cost), (captured, cost)):  # 1 - ratio, of tok/s rounded to 0.1
            slack = 100 * tok_s / plain * (0.05 / tok_s + 0.05 / plain) + 0.05
            assert abs(100 * (1 - tok_s / plain) - printed) <= slack, out
    assert list(tmp_path.glob("2/rollout-c2-ids/shards/0-of-1.calls.parquet"))
    assert list(tmp_path.glob("3/rollout-c2-capture/shards/0-of-1.calls.parquet"))
    assert list(tmp_path.glob("7/rollout-c2-before/shards/0-of-1.parquet"))
    assert (tmp_path / "vllm-bench-c2.json").is_file() and not list(
        tmp_path.glob("*/rollout-c*/shards/*.partial.jsonl")
    )
