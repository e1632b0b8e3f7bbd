"""LLM task stages through a real OpenAI-compatible HTTP endpoint (a scripted stand-in model)."""

import json

import pyarrow.parquet as pq

from otbuild.recipe.schema import Augment, TaskScorer
from otbuild.stages import augment, task_score
from otbuild.tasks.taskdir import TaskDir
from tests.conftest import chat_answer, write_source

TEXTS = ["Sort the lines of /app/a.txt into /app/b.txt", "Count the words in /app/book.txt",
         "Compress /app/logs into /app/logs.tar.gz"]


def _prompt(body) -> str:
    return body["messages"][-1]["content"]


def test_augment_rewrites_keep_parents_and_quarantine_empty_answers(tmp_path, scripted):
    def model(body):
        text = _prompt(body)
        if "Count the words" in text:
            return 200, chat_answer("   ")  # an empty answer is quarantined, not kept
        task = text.split("Task:\n", 1)[1].strip()
        return 200, chat_answer(f"```\nPlease do this: {task}\n```")

    srv = scripted(model)
    src = write_source(tmp_path / "in.parquet", "s", TEXTS)
    out = tmp_path / "out"
    out.mkdir()
    settings = Augment(engine="openai", base_url=srv.base_url, model="m", k=2, seed=3).model_dump()
    stats = augment.run(settings, [src], out)
    rows = pq.read_table(out / "tasks.parquet").to_pylist()
    assert stats["new"] == 4 and len(rows) == 3 + 4
    parents = {r["task_id"]: r for r in rows[:3]}
    for r in rows[3:]:
        parent = parents[r["parent_task_id"]]
        assert r["augmentation"] == "rewrite" and r["instruction"] == f"Please do this: {parent['instruction']}\n"
        assert r["path"].startswith(parent["path"] + "-rewrite") and r["task_id"] != parent["task_id"]
        task = TaskDir.unpack(r["path"], r["task_binary"])  # the parent's dir, new instruction
        assert task.files["tests/test.sh"] == TaskDir.unpack(parent["path"], parent["task_binary"]).files["tests/test.sh"]
        assert json.loads(r["metadata"])["parent_task_id"] == parent["task_id"]
    q = pq.read_table(out / "quarantine.parquet").to_pylist()
    assert [x["reason"] for x in q] == ["empty answer", "empty answer"]
    seeds = {req["body"]["seed"] for req in srv.requests}
    assert len(seeds) == 6  # each surface form asks with its own seed


def test_combine_pairs_each_task_with_another(tmp_path, scripted):
    srv = scripted(lambda body: (200, chat_answer("Both: " + " / ".join(
        part.strip().splitlines()[0] for part in _prompt(body).split("Task A:\n")[1].split("Task B:\n")))))
    src = write_source(tmp_path / "in.parquet", "s", TEXTS)
    out = tmp_path / "out"
    out.mkdir()
    augment.run(Augment(engine="openai", base_url=srv.base_url, model="m", kinds=["combine"],
                        keep_original=False).model_dump(), [src], out)
    rows = pq.read_table(out / "tasks.parquet").to_pylist()
    assert len(rows) == 3
    for r in rows:
        meta = json.loads(r["metadata"])
        assert meta["partner_task_id"] != meta["parent_task_id"] and r["instruction"].startswith("Both: ")


def test_askllm_and_response_length_scores(tmp_path, scripted):
    ratings = {"Sort": "I'd say 85/100.", "Count": "Rating: 12", "Compress": "hard to tell"}
    srv = scripted(lambda body: (200, chat_answer(next(v for k, v in ratings.items() if k in _prompt(body)))))
    src = write_source(tmp_path / "in.parquet", "s", TEXTS)
    out = tmp_path / "ask"
    out.mkdir()
    stats = task_score.run(TaskScorer(engine="openai", base_url=srv.base_url, model="m", kind="askllm").model_dump(),
                           [src], out)
    scored = pq.read_table(out / "tasks.parquet").to_pylist()
    assert [r["llm_score"] for r in scored] == [85.0, 12.0, None] and stats["scored"] == 2
    assert scored[2]["llm_response"] == "hard to tell"

    srv = scripted(lambda body: (200, chat_answer("x", completion_tokens=len(_prompt(body)))))
    out = tmp_path / "len"
    out.mkdir()
    task_score.run(TaskScorer(engine="openai", base_url=srv.base_url, model="m", kind="response_length").model_dump(),
                   [src], out)
    lengths = [r["llm_score"] for r in pq.read_table(out / "tasks.parquet").to_pylist()]
    assert all(v > 0 for v in lengths) and len(set(lengths)) == 3  # the server's token counts


def test_engine_failure_leaves_the_score_empty(tmp_path, scripted):
    srv = scripted([(400, {"error": "bad request"})])
    src = write_source(tmp_path / "in.parquet", "s", TEXTS[:1])
    out = tmp_path / "out"
    out.mkdir()
    stats = task_score.run(TaskScorer(engine="openai", base_url=srv.base_url, model="m", kind="askllm",
                                      max_retries=0).model_dump(), [src], out)
    row = pq.read_table(out / "tasks.parquet").to_pylist()[0]
    assert row["llm_score"] is None and row["llm_response"].startswith("[EngineError]")
    assert stats["engine_errors"] == 1
