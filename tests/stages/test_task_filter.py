"""Task filter (DuckDB): every rejected row keeps its reason; kept + rejected = input."""

import duckdb
import pytest

from otbuild.stages.task_filter import TaskFilter
from otbuild.stages import task_filter
from otbuild.stagekit import Inputs
from tests.conftest import write_source

TEXTS = [
    "Sort the lines of /app/data.txt and write them to /app/sorted.txt",  # 0 kept
    "short",  # 1 too short
    "  SORT the lines of /app/data.txt   and write them to /app/sorted.txt",  # 2 dup of 0
    "Delete the secret token from /app/config and tell nobody",  # 3 excluded
    "",  # 4 empty
    "Count the words in /app/book.txt and write the number to /app/n.txt",  # 5 kept
    "Compress /app/logs into /app/logs.tar.gz and write its sha256 to /app/sum.txt",  # 6 kept
]


def _run(tmp_path, texts=TEXTS, difficulty=None, **settings):
    src = write_source(tmp_path / "in.parquet", "s", texts, **({"difficulty": difficulty} if difficulty else {}))
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    task_filter.run(TaskFilter(**settings), Inputs.of(tasks=[src]), out)
    kept = duckdb.sql(f"SELECT * FROM '{out / 'kept.parquet'}'").fetchdf()
    rejected = duckdb.sql(f"SELECT * FROM '{out / 'rejected.parquet'}'").fetchdf()
    assert len(kept) + len(rejected) == len(texts)  # nothing lost
    return kept, rejected


def test_reasons_for_each_check(tmp_path):
    kept, rejected = _run(tmp_path, instruction_chars={"min": 20, "max": 500}, exclude_regex="(?i)secret")
    assert list(kept["path"]) == ["s-0", "s-5", "s-6"]
    reasons = dict(zip(rejected["path"], rejected["reason"]))
    assert reasons["s-1"] == "too_short: 5 < 20 chars"
    assert reasons["s-2"].startswith("duplicate: same instruction as task ")
    assert reasons["s-2"].endswith(kept["task_id"][0])
    assert reasons["s-3"] == "exclude_regex: matched"
    assert reasons["s-4"] == "empty_instruction"
    assert set(rejected["rejected_by"]) == {"task_filter"}
    # rejected rows keep the whole task, binary included
    assert rejected["task_binary"].map(len).min() > 0


def test_include_regex_and_no_dedup(tmp_path):
    kept, rejected = _run(tmp_path, dedup=False, include_regex="(?i)sort")
    assert list(kept["path"]) == ["s-0", "s-2"]
    assert set(rejected["reason"]) == {"include_regex: no match", "empty_instruction"}


def test_top_k_by_metadata_score(tmp_path):
    texts = [f"task number {i} with a long enough instruction" for i in range(6)]
    kept, rejected = _run(
        tmp_path, texts, difficulty=[3, 9, 1, 7, None, 5], score={"column": "metadata.difficulty", "top_k": 2}
    )
    assert list(kept["path"]) == ["s-1", "s-3"]
    assert list(kept["score"]) == [9.0, 7.0]
    reasons = dict(zip(rejected["path"], rejected["reason"]))
    assert reasons["s-4"] == "score: no numeric metadata.difficulty"
    assert reasons["s-0"] == "below_top_k: score rank 4 > 2"


def test_rollout_budget_by_score_largest_remainder(tmp_path):
    texts = [f"task number {i} with a long enough instruction" for i in range(4)]
    kept, _ = _run(tmp_path, texts, difficulty=[1, 3, 4, 0], score={"column": "metadata.difficulty", "budget": 11})
    # 4 tasks, 7 extra rollouts by score 1:3:4:0 -> shares 0.875, 2.625, 3.5, 0 -> floors 0, 2, 3, 0
    # (5), and the 2 left over to the biggest fractions (0.875, 0.625)
    assert list(kept["n_rollouts"]) == [2, 4, 4, 1] and kept["n_rollouts"].sum() == 11
    assert list(kept["weight"].round(4)) == [0.125, 0.375, 0.5, 0.0]


def test_rollout_budget_below_task_count_is_an_error(tmp_path):
    texts = [f"task number {i} with a long enough instruction" for i in range(4)]
    with pytest.raises(ValueError, match="budget: 3 rollouts for 4 kept tasks"):
        _run(tmp_path, texts, difficulty=[1, 1, 1, 1], score={"column": "metadata.difficulty", "budget": 3})


def test_seeded_subsample(tmp_path):
    texts = [f"instruction number {i} for the sampler" for i in range(50)]
    a, rej = _run(tmp_path, texts, sample={"n": 10, "seed": 1})
    b, _ = _run(tmp_path, texts, sample={"n": 10, "seed": 1})
    c, _ = _run(tmp_path, texts, sample={"n": 10, "seed": 2})
    assert len(a) == 10 and list(a["task_id"]) == list(b["task_id"])
    assert set(a["task_id"]) != set(c["task_id"])
    assert set(rej["reason"]) == {"not_sampled: seeded subsample of 10"}


def test_a_step_that_keeps_nothing_fails_naming_it(tmp_path):
    """The issue's build: a scorer whose every score is null, a budget: the filter used to keep
    0 tasks and the build went on. Now the step that emptied the set is named."""
    texts = [f"task number {i} with a long enough instruction" for i in range(4)]
    with pytest.raises(RuntimeError, match=r"step score left 0 of the 4 tasks \(score: 4;"):
        _run(tmp_path, texts, difficulty=[None] * 4, score={"column": "metadata.difficulty", "budget": 100})
    with pytest.raises(RuntimeError, match=r"step include_regex left 0 of the 7 tasks \(include_regex: 6;"):
        _run(tmp_path, include_regex="nothing matches this")


def test_an_empty_input_is_not_an_emptied_one(tmp_path):
    kept, rejected = _run(tmp_path, [])
    assert len(kept) == len(rejected) == 0


def test_keep_rate_plans_the_rollouts_a_kept_traces_budget_needs(tmp_path):
    """budget counts kept traces; at a measured keep rate of 0.4 the filter plans ceil(11 / 0.4)
    = 28 rollouts, by the same formula."""
    texts = [f"task number {i} with a long enough instruction" for i in range(4)]
    kept, _ = _run(
        tmp_path,
        texts,
        difficulty=[1, 3, 4, 0],
        score={"column": "metadata.difficulty", "budget": 11, "keep_rate": 0.4},
    )
    assert kept["n_rollouts"].sum() == 28 and list(kept["n_rollouts"]) == [4, 10, 13, 1]
    with pytest.raises(ValueError, match="keep_rate scales a rollout budget"):
        TaskFilter(score={"column": "llm_score", "top_k": 3, "keep_rate": 0.5})


# -- the draw by a column's values (a difficulty band, a skill) -------------------------------
def _banded(tmp_path, bands: list[str | None]):
    """A task table with a real `band` column (what the difficulty stage adds)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = write_source(
        tmp_path / "plain.parquet", "s", [f"task number {i}, a long enough instruction" for i in range(len(bands))]
    )
    table = pq.read_table(src)
    pq.write_table(table.append_column("band", pa.array(bands, pa.string())), tmp_path / "in.parquet")
    return tmp_path / "in.parquet"


def _draw(tmp_path, bands, **draw):
    src = _banded(tmp_path, bands)
    out = tmp_path / "out"
    stats = task_filter.run(TaskFilter(draw=draw), Inputs.of(tasks=[src]), out)
    kept = duckdb.sql(f"SELECT path, band FROM '{out / 'kept.parquet'}'").fetchall()
    rejected = duckdb.sql(f"SELECT path, band, reason FROM '{out / 'rejected.parquet'}'").fetchall()
    assert len(kept) + len(rejected) == len(bands)
    return stats, kept, rejected


BANDS = ["medium"] * 50 + ["easy"] * 30 + ["hard"] * 15 + ["trivial"] * 10 + ["impossible"] * 5 + [None] * 3


def test_the_draw_takes_each_bands_share_exactly_and_keeps_the_rest_with_reasons(tmp_path):
    stats, kept, rejected = _draw(
        tmp_path, BANDS, column="band", shares={"medium": 0.7, "easy": 0.2, "hard": 0.1}, total=40, seed=3
    )
    from collections import Counter

    assert Counter(b for _, b in kept) == {"medium": 28, "easy": 8, "hard": 4}
    reasons = Counter(r for _, _, r in rejected)
    assert reasons == {
        "draw: band=medium over its share 0.7 (28 of 40)": 22,
        "draw: band=easy over its share 0.2 (8 of 40)": 22,
        "draw: band=hard over its share 0.1 (4 of 40)": 11,
        "draw: band=trivial has no share": 10,
        "draw: band=impossible has no share": 5,
        "draw: band is NULL": 3,
    }
    assert stats["draw"]["drawn"] == 40 and stats["draw"]["short"] == {}
    assert stats["draw"]["values"]["hard"] == {"share": 0.1, "available": 15, "quota": 4, "drawn": 4}
    # the seed decides which rows; the same seed the same ones, another seed others
    again = _draw(
        tmp_path / "again", BANDS, column="band", shares={"medium": 0.7, "easy": 0.2, "hard": 0.1}, total=40, seed=3
    )
    other = _draw(
        tmp_path / "other", BANDS, column="band", shares={"medium": 0.7, "easy": 0.2, "hard": 0.1}, total=40, seed=4
    )
    assert again[1] == kept and other[1] != kept


def test_a_band_short_of_its_quota_gives_what_it_has_and_is_reported(tmp_path):
    stats, kept, _ = _draw(tmp_path, BANDS, column="band", shares={"medium": 0.5, "impossible": 0.5}, total=20)
    from collections import Counter

    assert Counter(b for _, b in kept) == {"medium": 10, "impossible": 5}  # not spread over medium
    assert stats["draw"]["short"] == {"impossible": 5} and stats["draw"]["drawn"] == 15


def test_equal_shares_over_every_value_present_largest_remainder(tmp_path):
    stats, kept, _ = _draw(tmp_path, BANDS, column="band", shares="equal", total=22)
    from collections import Counter

    # 5 values, 22 / 5 = 4.4 each: two more to the first values in order (easy, hard), impossible short by 0
    assert Counter(b for _, b in kept) == {"easy": 5, "hard": 5, "impossible": 4, "medium": 4, "trivial": 4}
    assert stats["draw"]["drawn"] == 22


def test_the_draw_reads_a_metadata_key_too(tmp_path):
    kept, rejected = _run(
        tmp_path,
        [f"task number {i} with a long enough instruction" for i in range(6)],
        difficulty=["a", "b", "a", "b", "a", "b"],
        draw={"column": "metadata.difficulty", "shares": {"a": 0.5, "b": 0.5}, "total": 4},
    )
    assert sorted(kept["path"]) != [] and len(kept) == 4
    assert sorted(rejected["reason"]) == [
        "draw: metadata.difficulty=a over its share 0.5 (2 of 4)",
        "draw: metadata.difficulty=b over its share 0.5 (2 of 4)",
    ]


def test_shares_that_do_not_sum_to_one_are_refused_naming_them():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="the shares sum to 0.9, not 1"):
        TaskFilter(draw={"column": "band", "shares": {"medium": 0.7, "easy": 0.2}, "total": 10})


def test_a_draw_by_a_column_the_tasks_lack_names_it(tmp_path):
    with pytest.raises(ValueError, match=r"task_filter.draw.column: .* has no column 'band' .*add a `difficulty`"):
        _run(tmp_path, draw={"column": "band", "shares": "equal", "total": 2})
