"""The paper's thesis in miniature (issue 11), the small version of `thesis_smoke`: on a CPU a
tiny student trained on oracle traces earns credit on held-out tasks (another seed) where its
untrained base earns none, and the ablation's ranking says so. ~5 minutes on 2 cores."""

import shutil

import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, snakemake

pytestmark = pytest.mark.slow

SMALL = """
extends: thesis_smoke
sft: {save_steps: 1500}
eval:
  benchmarks:
    heldout: {count: 10}
  repeats: 2
  max_episodes: 6
  rank_by: partial_credit
"""


def test_a_tiny_student_learns_what_its_base_cannot(project):
    shutil.copy(REPO / "recipes" / "thesis_smoke.yaml", project / "recipes")
    (project / "recipes" / "thesis_small.yaml").write_text(SMALL)
    snakemake(project, "thesis_small")
    out = project / "results" / "thesis_small"
    summary = {c: pq.read_table(out / "candidates" / c / "eval" / "summary.parquet").to_pylist()[0]
               for c in ("sft.max_steps=0", "sft.max_steps=1500")}
    base, student = summary["sft.max_steps=0"], summary["sft.max_steps=1500"]
    assert base["repeats"] == student["repeats"] == 2 and base["n_tasks"] == 10
    assert base["mean"] == 0.0 and base["partial_mean"] == 0.0  # random weights do nothing useful
    # measured: 0.3 pass@1 in both repeats (3 of 10 tasks solved); the base solves none
    assert student["mean"] > 0 and student["partial_mean"] > 0.05 and student["partial_stderr"] is not None
    traces = pq.read_table(out / "candidates" / "sft.max_steps=1500" / "eval" / "traces.parquet").to_pylist()
    first = traces[0]["conversations"][0]["content"]
    assert first.startswith("Solve the task in a Linux shell.") and len(first) < 1500  # the compact prompt
    ranking = {r["candidate"]: r for r in pq.read_table(out / "ranking" / "ranking.parquet").to_pylist()}
    assert ranking["sft.max_steps=1500"]["rank"] == 1 and ranking["sft.max_steps=0"]["rank"] == 2
    html = (out / "report" / "report.html").read_text()
    assert "partial credit" in html and "Ranking" in html
