"""LLM task stages through a real OpenAI-compatible HTTP endpoint (a scripted stand-in model)."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter

import pyarrow.parquet as pq
import pytest

from otbuild.settings.recipe import TaskScorer
from otbuild.stages.augment import Augment
from otbuild.stages import augment, task_score
from otbuild.stagekit.llm_requests import RefusedRequest
from otbuild.tasks.taskdir import TaskDir
from tests.conftest import REPO, chat_answer, write_source

TEXTS = [
    "Sort the lines of /app/a.txt into /app/b.txt",
    "Count the words in /app/book.txt",
    "Compress /app/logs into /app/logs.tar.gz",
]


def _prompt(body) -> str:
    return body["messages"][-1]["content"]


def _build(stage, settings, inputs, out):
    """What the rules run: every shard's job, then the merge."""
    out.mkdir(exist_ok=True)
    for k in range(settings.shards):
        stage.run_shard(settings, inputs, out, k)
    return stage.run(settings, inputs, out)


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
    settings = Augment(engine="openai", base_url=srv.base_url, model="m", k=2, seed=3)
    stats = _build(augment, settings, [src], out)
    rows = pq.read_table(out / "tasks.parquet").to_pylist()
    assert stats["new"] == 4 and len(rows) == 3 + 4
    assert stats["llm_usage"]["openai:m"]["requests"] == 6 and stats["llm_usage"]["openai:m"]["input_tokens"] == 60
    parents = {r["task_id"]: r for r in rows[:3]}
    for r in rows[3:]:
        parent = parents[r["parent_task_id"]]
        assert r["augmentation"] == "rewrite" and r["instruction"] == f"Please do this: {parent['instruction']}\n"
        assert r["path"].startswith(parent["path"] + "-rewrite") and r["task_id"] != parent["task_id"]
        task = TaskDir.unpack(r["path"], r["task_binary"])  # the parent's dir, new instruction
        assert (
            task.files["tests/test.sh"] == TaskDir.unpack(parent["path"], parent["task_binary"]).files["tests/test.sh"]
        )
        assert json.loads(r["metadata"])["parent_task_id"] == parent["task_id"]
    q = pq.read_table(out / "quarantine.parquet").to_pylist()
    assert [x["reason"] for x in q] == ["empty answer", "empty answer"]
    seeds = {req["body"]["seed"] for req in srv.requests}
    assert len(seeds) == 6  # each surface form asks with its own seed


def test_combine_pairs_each_task_with_another(tmp_path, scripted):
    srv = scripted(
        lambda body: (
            200,
            chat_answer(
                "Both: "
                + " / ".join(
                    part.strip().splitlines()[0] for part in _prompt(body).split("Task A:\n")[1].split("Task B:\n")
                )
            ),
        )
    )
    src = write_source(tmp_path / "in.parquet", "s", TEXTS)
    out = tmp_path / "out"
    out.mkdir()
    _build(
        augment,
        Augment(engine="openai", base_url=srv.base_url, model="m", kinds=["combine"], keep_original=False),
        [src],
        out,
    )
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
    stats = _build(task_score, TaskScorer(engine="openai", base_url=srv.base_url, model="m", kind="askllm"), [src], out)
    scored = pq.read_table(out / "tasks.parquet").to_pylist()
    assert [r["llm_score"] for r in scored] == [85.0, 12.0, None] and stats["scored"] == 2
    assert scored[2]["llm_response"] == "hard to tell"

    srv = scripted(lambda body: (200, chat_answer("x", completion_tokens=len(_prompt(body)))))
    out = tmp_path / "len"
    out.mkdir()
    _build(
        task_score, TaskScorer(engine="openai", base_url=srv.base_url, model="m", kind="response_length"), [src], out
    )
    lengths = [r["llm_score"] for r in pq.read_table(out / "tasks.parquet").to_pylist()]
    assert all(v > 0 for v in lengths) and len(set(lengths)) == 3  # the server's token counts


def test_a_later_engine_failure_leaves_that_score_empty(tmp_path, scripted):
    srv = scripted(
        lambda body: (500, {"error": "down"}) if "Count" in _prompt(body) else (200, chat_answer("Rating: 40"))
    )
    src = write_source(tmp_path / "in.parquet", "s", TEXTS)
    stats = _build(
        task_score,
        TaskScorer(engine="openai", base_url=srv.base_url, model="m", kind="askllm", max_retries=0, concurrency=1),
        [src],
        tmp_path / "out",
    )
    rows = pq.read_table(tmp_path / "out" / "tasks.parquet").to_pylist()
    assert [r["llm_score"] for r in rows] == [40.0, None, 40.0] and rows[1]["llm_response"].startswith("[EngineError]")
    assert stats["engine_errors"] == 1 and stats["scored"] == 2
    # usage per model: the server's counts (chat_answer: 10 prompt tokens, a word per output token)
    assert stats["llm_usage"] == {
        "openai:m": {"requests": 3, "errors": 1, "input_tokens": 20, "output_tokens": 4, "usage_missing": 0}
    }
    # the endpoint is back: a shard job run again asks only the failed request
    srv.script = lambda body: (200, chat_answer("Rating: 41"))
    settings = TaskScorer(engine="openai", base_url=srv.base_url, model="m", kind="askllm")
    task_score.run_shard(settings, [src], tmp_path / "out", 0)
    assert len(srv.requests) == 4 and "Count" in _prompt(srv.requests[-1]["body"])
    stats = task_score.run(settings, [src], tmp_path / "out")
    assert [r["llm_score"] for r in pq.read_table(tmp_path / "out" / "tasks.parquet").to_pylist()] == [40.0, 41.0, 40.0]
    assert stats["llm_usage"]["openai:m"] == {
        "requests": 3,
        "errors": 0,
        "input_tokens": 30,
        "output_tokens": 6,
        "usage_missing": 0,
    }


def test_a_refused_first_request_fails_the_stage_at_once(tmp_path, scripted):
    """A 4xx at the first request is the API's verdict on every request: one request, its message,
    no table of nulls (the filter would then reject every task and the build would 'succeed')."""
    srv = scripted([(400, {"error": {"message": "model `m` does not exist", "type": "invalid_request_error"}})])
    src = write_source(tmp_path / "in.parquet", "s", TEXTS)
    with pytest.raises(RefusedRequest, match="does not exist"):
        _build(
            task_score,
            TaskScorer(engine="openai", base_url=srv.base_url, model="m", kind="askllm"),
            [src],
            tmp_path / "out",
        )
    assert len(srv.requests) == 1 and not (tmp_path / "out" / "tasks.parquet").exists()


def test_scoring_nothing_fails_naming_why(tmp_path, scripted):
    srv = scripted(lambda body: (200, chat_answer("hard to tell")))
    src = write_source(tmp_path / "in.parquet", "s", TEXTS)
    with pytest.raises(RuntimeError, match="no task of 3 got a score: 3 answers without a askllm score"):
        _build(
            task_score,
            TaskScorer(engine="openai", base_url=srv.base_url, model="m", kind="askllm"),
            [src],
            tmp_path / "out",
        )
    assert not (tmp_path / "out" / "tasks.parquet").exists()


def openai_reasoning_api(body):
    """What OpenAI's API says to a reasoning model's request (gpt-5*, o-series), word for word."""
    if "max_tokens" in body:
        return 400, {
            "error": {
                "message": "Unsupported parameter: 'max_tokens' is not supported with this model. "
                "Use 'max_completion_tokens' instead.",
                "type": "invalid_request_error",
                "param": "max_tokens",
                "code": "unsupported_parameter",
            }
        }
    for key in ("temperature", "top_p"):
        if key in body and body[key] != 1:
            return 400, {
                "error": {
                    "message": f"Unsupported value: '{key}' does not support {body[key]} with this "
                    "model. Only the default (1) value is supported.",
                    "type": "invalid_request_error",
                    "param": key,
                    "code": "unsupported_value",
                }
            }
    return 200, chat_answer("an answer", completion_tokens=len(_prompt(body)))


def test_reasoning_models_get_max_completion_tokens_and_no_sampling_knobs(tmp_path, scripted):
    """The paper recipe's scorer: gpt-5-nano with temperature 0 and max_tokens, as the recipe says."""
    srv = scripted(openai_reasoning_api)
    src = write_source(tmp_path / "in.parquet", "s", TEXTS)
    section = dict(
        engine="openai",
        base_url=srv.base_url,
        model="gpt-5-nano",
        kind="response_length",
        temperature=0,
        max_tokens=8192,
    )
    stats = _build(task_score, TaskScorer(**section), [src], tmp_path / "out")
    assert stats["scored"] == 3
    assert all(r["body"]["max_completion_tokens"] == 8192 and "temperature" not in r["body"] for r in srv.requests)
    # an endpoint whose model names say nothing: the explicit override
    with pytest.raises(RefusedRequest, match="Unsupported parameter: 'max_tokens'"):
        _build(task_score, TaskScorer(**section, request_params="standard"), [src], tmp_path / "std")


def test_otbuild_serve_is_as_strict_as_openai_for_reasoning_model_names():
    """`otbuild serve --served-model-name gpt-5-nano` answers as OpenAI's API does."""
    import threading

    import httpx

    from otbuild.serve import ChatServer

    class Echo:
        def chat(self, messages, **kw):
            return {"text": "ok", "prompt_tokens": 1, "completion_tokens": 1, "finish_reason": "stop"}

    for name, body, expected in [
        ("gpt-5-nano", {"max_tokens": 10}, (400, "max_tokens", "unsupported_parameter")),
        ("o3-mini", {"temperature": 0}, (400, "temperature", "unsupported_value")),
        ("gpt-5", {"top_p": 0.9}, (400, "top_p", "unsupported_value")),
        ("gpt-5-nano", {"max_completion_tokens": 10, "temperature": 1}, (200, None, None)),
        ("Qwen/Qwen3-8B", {"max_tokens": 10, "temperature": 0}, (200, None, None)),
    ]:
        srv = ChatServer(("127.0.0.1", 0), Echo(), name)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        try:
            r = httpx.post(
                f"{srv.url}/v1/chat/completions",
                json={"model": name, "messages": [{"role": "user", "content": "hi"}], **body},
            )
        finally:
            srv.shutdown()
            srv.server_close()
        error = r.json().get("error") or {}
        assert (r.status_code, error.get("param"), error.get("code")) == expected, (name, body, r.text)


def test_augment_drops_reasoning_from_new_instructions(tmp_path, scripted):
    answers = {
        "Sort": "<think>The user wants a rewrite. Let me think.</think>\n\nSort /app/a.txt into /app/b.txt.",
        "Count": "Maybe count them...</think>Count every word in /app/book.txt.",  # <think> was in the prompt
        "Compress": "<think>I should rewrite this as",
    }  # ran out mid-thought
    srv = scripted(lambda body: (200, chat_answer(next(v for k, v in answers.items() if k in _prompt(body)))))
    src = write_source(tmp_path / "in.parquet", "s", TEXTS)
    out = tmp_path / "out"
    stats = _build(augment, Augment(engine="openai", base_url=srv.base_url, model="m", keep_original=False), [src], out)
    rows = pq.read_table(out / "tasks.parquet").to_pylist()
    assert [r["instruction"] for r in rows] == [
        "Sort /app/a.txt into /app/b.txt.\n",
        "Count every word in /app/book.txt.\n",
    ]
    for r in rows:
        assert "think" not in TaskDir.unpack(r["path"], r["task_binary"]).files["instruction.md"].data.decode()
    q = pq.read_table(out / "quarantine.parquet").to_pylist()
    assert [(x["reason"], x["name"]) for x in q] == [("reasoning in answer", "s-2-rewrite0")]
    assert stats["quarantined_by_reason"] == {"reasoning in answer": 1}


def _stage_proc(settings, src, out, shard: int, stage: str = "task_score", **env) -> subprocess.Popen:
    spec = {
        "stage": stage,
        "id": "t",
        "settings": settings.model_dump(mode="json"),
        "outdir": str(out),
        "inputs": [{"id": "src", "stage": "source", "path": str(src)}],
    }
    return subprocess.Popen(
        [sys.executable, "-m", "otbuild", "stage", stage, "--spec", json.dumps(spec), "--shard", str(shard)],
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        cwd=out.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def kill_mid_shard(proc: subprocess.Popen, partial, answers: int) -> set[int]:
    """kill -9 a shard job once its partial file holds `answers` answers; the requests answered."""
    deadline = time.monotonic() + 60
    while not (partial.exists() and partial.read_bytes().count(b"\n") >= answers):
        assert proc.poll() is None and time.monotonic() < deadline, (
            proc.stdout.read() if proc.poll() is not None else ""
        )
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return {json.loads(line)["request"] for line in partial.read_text().splitlines() if line.endswith("}")}


@pytest.mark.parametrize("stage", ["augment", "task_score"])
def test_a_shard_job_shows_its_requests_on_the_runs_console(tmp_path, scripted, stage):
    """What the Snakemake run prints for an augment or task_score shard job (otbuild/progress.py):
    requests done of the shard's, then nothing left behind when the job ends."""
    from otbuild.progress import Watcher, describe_log

    srv = scripted(
        lambda body: (200, chat_answer("Rating: 3" if stage == "task_score" else "Do it again.")), delay=0.35
    )
    src = write_source(tmp_path / "in.parquet", "s", [f"Task {i}: print {i} to /app/out.txt" for i in range(20)])
    cls = TaskScorer if stage == "task_score" else Augment
    settings = cls(
        engine="openai",
        base_url=srv.base_url,
        model="m",
        shards=2,
        concurrency=1,
        **({"kind": "askllm"} if stage == "task_score" else {"k": 2}),
    )
    log = f"logs/{stage}/{'ab' * 8}/1-of-2.log"
    watcher = Watcher(tmp_path, lambda p: describe_log(p, lambda s, i: stage), print, every=0)
    proc = _stage_proc(settings, src, tmp_path / "out", 1, stage, OTBUILD_LOG=log)
    total = 10 if stage == "task_score" else 20  # shard 2 of 2: every other request
    seen, deadline = [], time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        seen += watcher.tick()
        time.sleep(0.1)
    assert proc.wait() == 0, proc.stdout.read()
    assert seen and seen[0].startswith(f"otbuild: {stage}, shard 2 of 2: requests ")
    assert seen[0].endswith(f"; follow it: tail -f {log}")
    done = [int(re.search(rf"requests (\d+)/{total} ", line)[1]) for line in seen]
    assert done == sorted(done) and done[-1] > done[0]  # it moves
    assert not list((tmp_path / ".otbuild" / "progress").glob("*.json"))  # and is gone at the end


def test_task_score_resumes_after_kill_9_without_asking_twice(tmp_path, scripted):
    """A real kill -9 of a running shard job: the rerun asks only what was not answered, and the
    merge has every row exactly once, with its own answer."""
    texts = [f"Task number {i}: print {i} to /app/out.txt" for i in range(60)]
    srv = scripted(
        lambda body: (200, chat_answer(f"Rating: {int(_prompt(body).split('Task number ')[1].split(':')[0]) + 1}")),
        delay=0.1,
    )
    src = write_source(tmp_path / "in.parquet", "s", texts)
    out = tmp_path / "out"
    settings = TaskScorer(engine="openai", base_url=srv.base_url, model="m", kind="askllm", shards=2, concurrency=3)
    partial = out / "shards" / "0-of-2.partial.jsonl"
    answered = kill_mid_shard(_stage_proc(settings, src, out, 0), partial, 10)
    assert 10 <= len(answered) < 30  # killed mid-shard (shard 0 has 30 requests)
    with open(partial, "a") as f:
        f.write('{"request": 58, "text": "Rat')  # a torn last line, as a crash mid-write leaves
    for shard in (0, 1):
        rerun = _stage_proc(settings, src, out, shard)
        log, _ = rerun.communicate(timeout=120)
        assert rerun.returncode == 0, log
    stats = task_score.run(settings, [src], out)
    rows = pq.read_table(out / "tasks.parquet").to_pylist()
    assert [r["instruction"] for r in rows] == texts and [r["llm_score"] for r in rows] == [i + 1.0 for i in range(60)]
    asked = Counter(int(_prompt(r["body"]).split("Task number ")[1].split(":")[0]) for r in srv.requests)
    assert set(asked) == set(range(60)) and all(asked[i] == 1 for i in answered)
    assert sum(asked.values()) <= 60 + 3  # at most the requests in flight at the kill go again
    assert stats["scored"] == 60 and not list((out / "shards").glob("*.partial.jsonl"))


@pytest.mark.parametrize("n", [0, 1])
def test_llm_stages_take_empty_and_one_row_inputs(tmp_path, scripted, n):
    srv = scripted(lambda body: (200, chat_answer("Rating: 7")))
    src = write_source(tmp_path / "in.parquet", "s", TEXTS[:n])
    stats = _build(
        task_score,
        TaskScorer(engine="openai", base_url=srv.base_url, model="m", kind="askllm", shards=3),
        [src],
        tmp_path / "score",
    )
    assert stats["tasks"] == n and pq.read_table(tmp_path / "score" / "tasks.parquet").num_rows == n
    stats = _build(
        augment,
        Augment(engine="openai", base_url=srv.base_url, model="m", kinds=["rewrite", "combine"], shards=2),
        [src],
        tmp_path / "aug",
    )
    assert stats["tasks"] == 3 * n and len(srv.requests) == 3 * n


@pytest.mark.slow
def test_sharded_llm_stages_through_snakemake(project, scripted):
    """The real DAG: augment and task_score as shard jobs plus a merge; changing `shards` (not
    in the id) after the build reruns nothing."""
    from tests.conftest import snakemake

    srv = scripted(
        lambda body: (
            200,
            chat_answer(
                "Rating: 50" if "rate" in _prompt(body).lower() else "<think>hmm</think>Do it again, carefully."
            ),
        )
    )
    recipe = f"""
sources:
  a: {{kind: synthetic, count: 5, seed: 1}}
augment: {{engine: openai, base_url: '{srv.base_url}', model: m, k: 2, shards: 3}}
task_filter:
  dedup: false
  llm: {{engine: openai, base_url: '{srv.base_url}', model: m, kind: askllm, shards: 2}}
  score: {{column: llm_score, top_k: 100}}
"""
    (project / "recipes" / "r.yaml").write_text(recipe)
    ran, log = snakemake(project, "r")
    assert (
        ran["augment"] == 3 and ran["augment_merge"] == 1 and ran["task_score"] == 2 and ran["task_score_merge"] == 1
    ), log
    kept = pq.read_table(project / "results" / "r" / "task_filter" / "kept.parquet").to_pylist()
    assert len(kept) == 15 and {r["llm_score"] for r in kept} == {50.0}
    assert len(srv.requests) == 10 + 15  # each request once
    (project / "recipes" / "r.yaml").write_text(recipe.replace("shards: 3", "shards: 5"))
    ran, _ = snakemake(project, "r")
    assert ran == {"r": 1}


def test_a_restart_with_another_shard_count_asks_nothing_twice(tmp_path, scripted):
    srv = scripted(lambda body: (200, chat_answer(f"Rating: {len(_prompt(body)) % 90 + 1}")))
    texts = [f"Task {i}: write {i} into /app/n.txt" for i in range(12)]
    src = write_source(tmp_path / "in.parquet", "s", texts)
    out = tmp_path / "out"
    section = dict(engine="openai", base_url=srv.base_url, model="m", kind="askllm")
    task_score.run_shard(TaskScorer(**section, shards=2), [src], out, 0)  # half done, then N changes
    assert len(srv.requests) == 6
    stats = _build(task_score, TaskScorer(**section, shards=5), [src], out)
    assert len(srv.requests) == 12 and stats["scored"] == 12
    assert sorted(p.name for p in (out / "shards").iterdir()) == [f"{k}-of-5.parquet" for k in range(5)]
    rows = pq.read_table(out / "tasks.parquet").to_pylist()
    assert [r["instruction"] for r in rows] == texts


def test_a_task_score_built_before_shards_stays_built(project):
    """An artifact built as one job (its record has no `shards`) is what its merge rule reads as
    then: the same inputs, so Snakemake (rerun-triggers mtime, input) runs nothing."""
    from otbuild.provenance import PROVENANCE
    from otbuild.workflow import Workflow

    (project / "recipes" / "r.yaml").write_text(
        "sources:\n  a: {kind: synthetic, count: 4}\ntask_filter:\n"
        "  llm: {engine: openai, base_url: 'http://x/v1', model: m, kind: askllm, shards: 3}\n"
        "  score: {column: llm_score, top_k: 2}\n"
    )
    wf = Workflow(project)
    node = next(n for n in wf.plans["r"].nodes if n.stage == "task_score")
    assert [p.rsplit("/", 1)[1] for p in wf.shard_inputs("task_score", node.id)] == [
        "0-of-3.parquet",
        "1-of-3.parquet",
        "2-of-3.parquet",
    ]
    (project / node.dir).mkdir(parents=True)
    (project / node.dir / PROVENANCE).write_text(json.dumps({"settings": {"kind": "askllm"}}))
    cwd = os.getcwd()
    os.chdir(project)  # artifact paths are relative to the project
    try:
        assert wf.shard_inputs("task_score", node.id) == [str(node.inputs[0].main_output)]
    finally:
        os.chdir(cwd)
