"""Skill tags: one tag per task from a fixed list, asked of a real OpenAI-compatible endpoint (the
stand-in server), read strictly; sharded, resumable after kill -9, and built by snakemake."""

from collections import Counter

import pyarrow.parquet as pq
import pytest

from otbuild.stages import skills
from otbuild.stages.skills import Skills, pick
from tests.conftest import chat_answer, write_source
from tests.stages.test_llm_stages import _build, _prompt, _stage_proc, kill_mid_shard

TAGS = ("file-operations", "text-processing", "networking")
TEXTS = [
    "Sort the lines of /app/a.txt into /app/b.txt",
    "Count the words in /app/book.txt",
    "Compress /app/logs into /app/logs.tar.gz",
    "Find the port nginx listens on",
]


def _cfg(srv, **kw) -> Skills:
    return Skills(engine="openai", base_url=srv.base_url, model="m", tags=TAGS, **kw)


def test_each_task_gets_the_tag_its_answer_names_and_no_guess(tmp_path, scripted):
    answers = {
        "Sort": "text-processing",
        "Count": "The task counts words.\n\n**Text-Processing**",  # the last line, any case
        "Compress": "compression",  # not in the list
        "port": "networking or file-operations",  # two tags
    }
    srv = scripted(lambda body: (200, chat_answer(next(v for k, v in answers.items() if k in _prompt(body)))))
    src = write_source(tmp_path / "in.parquet", "s", TEXTS)
    stats = _build(skills, _cfg(srv), [src], tmp_path / "out")
    rows = pq.read_table(tmp_path / "out" / "tasks.parquet").to_pylist()
    assert [r["instruction"] for r in rows] == TEXTS
    assert [r["skill"] for r in rows] == ["text-processing", "text-processing", None, None]
    assert rows[2]["skill_response"] == "compression"
    assert stats["skills"] == {"text-processing": 2} and stats["tagged"] == 2
    assert stats["untagged"] == {"names no tag of the list": 1, "names several tags": 1}
    assert stats["untagged_examples"]["names no tag of the list"] == "compression"
    prompt = _prompt(srv.requests[0]["body"])
    assert all(f"- {t}\n" in prompt for t in TAGS) and "Sort the lines" in prompt


def test_the_answer_is_read_strictly():
    assert pick("`networking`", TAGS) == ("networking", "")
    assert pick("I would say it is mostly networking.", TAGS) == ("networking", "")
    assert pick("file-operations-ish", TAGS) == (None, "names no tag of the list")
    assert pick("", TAGS) == (None, "names no tag of the list")
    assert pick("Not networking.\nfile-operations", TAGS) == ("file-operations", "")


def test_tagging_nothing_fails_naming_why_and_a_bad_tag_list_names_the_key(tmp_path, scripted):
    srv = scripted(lambda body: (200, chat_answer("cooking")))
    src = write_source(tmp_path / "in.parquet", "s", TEXTS[:2])
    with pytest.raises(
        RuntimeError, match=r"skills: no task of 2 got a tag of the 3 listed: 2 answers names no tag.*'cooking'"
    ):
        _build(skills, _cfg(srv), [src], tmp_path / "out")
    assert not (tmp_path / "out" / "tasks.parquet").exists()
    with pytest.raises(ValueError, match="tags"):
        Skills(engine="openai", base_url=srv.base_url, model="m", tags=["a", "A"])


def test_an_engine_error_leaves_that_tag_empty_and_is_counted(tmp_path, scripted):
    srv = scripted(
        lambda body: (500, {"error": "down"}) if "Count" in _prompt(body) else (200, chat_answer("networking"))
    )
    src = write_source(tmp_path / "in.parquet", "s", TEXTS[:2])
    stats = _build(skills, _cfg(srv, max_retries=0, backoff_sec=0.01), [src], tmp_path / "out")
    assert stats["untagged"] == {"engine error": 1} and stats["llm_usage"]["openai:m"]["errors"] == 1


def test_skills_resume_after_kill_9_without_asking_twice(tmp_path, scripted):
    texts = [f"Task number {i}: print {i} to /app/out.txt" for i in range(40)]
    srv = scripted(
        lambda body: (200, chat_answer(TAGS[int(_prompt(body).split("Task number ")[1].split(":")[0]) % 3])), delay=0.1
    )
    src = write_source(tmp_path / "in.parquet", "s", texts)
    out = tmp_path / "out"
    settings = _cfg(srv, shards=2, concurrency=2)
    partial = out / "shards" / "0-of-2.partial.jsonl"
    answered = kill_mid_shard(_stage_proc(settings, src, out, 0, "skills"), partial, 6)
    assert 6 <= len(answered) < 20
    for shard in (0, 1):
        rerun = _stage_proc(settings, src, out, shard, "skills")
        log, _ = rerun.communicate(timeout=120)
        assert rerun.returncode == 0, log
    stats = skills.run(settings, [src], out)
    rows = pq.read_table(out / "tasks.parquet").to_pylist()
    assert [r["skill"] for r in rows] == [TAGS[i % 3] for i in range(40)]
    asked = Counter(int(_prompt(r["body"]).split("Task number ")[1].split(":")[0]) for r in srv.requests)
    assert set(asked) == set(range(40)) and all(asked[i] == 1 for i in answered)
    assert stats["tagged"] == 40


@pytest.mark.slow
def test_skills_through_snakemake(project, scripted):
    """The real DAG: a recipe's `skills:` as shard jobs plus a merge, after the task filter's
    score and before its filter; the task table the filter keeps has the column."""
    from tests.conftest import snakemake

    srv = scripted(
        lambda body: (200, chat_answer("Rating: 50" if "rate" in _prompt(body).lower() else "file-operations"))
    )
    (project / "recipes" / "r.yaml").write_text(f"""
sources:
  a: {{kind: synthetic, count: 5, seed: 1}}
skills: {{engine: openai, base_url: '{srv.base_url}', model: m, shards: 2}}
task_filter:
  dedup: false
""")
    ran, log = snakemake(project, "r")
    assert ran["skills"] == 2 and ran["skills_merge"] == 1, log
    kept = pq.read_table(project / "results" / "r" / "task_filter" / "kept.parquet").to_pylist()
    assert len(kept) == 5 and {r["skill"] for r in kept} == {"file-operations"}
    assert len(srv.requests) == 5


def test_the_estimate_counts_one_request_per_task(project):
    from tests.estimate.test_estimate import _estimate

    (project / "recipes" / "r.yaml").write_text("""
sources:
  a: {kind: synthetic, count: 40, seed: 1}
skills: {engine: openai, base_url: 'http://127.0.0.1:9/v1', model: m, shards: 4}
task_filter: {dedup: false}
""")
    st = _estimate(project, "r")["stages"]
    assert st["skills"]["requests"]["estimate"] == 40 and st["skills"]["counts"]["tasks"]["estimate"] == 40
    assert [j["count"] for j in st["skills"]["jobs"]] == [4, 1]  # the shard jobs and the merge
