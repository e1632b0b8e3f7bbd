"""bench/rl.py at a tiny size: both weight syncs train on the real vLLM and the table splits each step."""

from __future__ import annotations

import re

import pytest

from otbuild.engines.vllm import vllm_executable
from otbuild.settings.engines import VLLMOptions
from tests.conftest import run_bench

pytestmark = [pytest.mark.slow, pytest.mark.skipif(vllm_executable(VLLMOptions()) is None,
                                                   reason="no vLLM here: make vllm-env (scripts/vllm-env.sh)")]


def test_bench_rl_tiny(tmp_path):
    out = run_bench("rl.py", "--steps", "2", "--tasks", "1", "--samples", "2", "--max-tokens", "8",
                    "--out", str(tmp_path), timeout=900)
    rows = re.findall(r"^\s+(restart|reload)\s+(\d)\s+(start|reload)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", out, re.M)
    assert [(m, s, how) for m, s, how, *_ in rows] == [
        ("restart", "1", "start"), ("restart", "2", "start"), ("reload", "1", "start"), ("reload", "2", "reload")], out
    restart, reload = float(rows[1][3]), float(rows[3][3])
    assert reload < restart, out  # a reload in place costs less than a server start, whatever the machine
    assert re.search(r"^sync after the first step: restart [\d.]+ s, reload [\d.]+ s \(\d+x faster in place\)$", out, re.M)
