"""otbuild on the real vLLM server: the pinned release in .venv-vllm (its CPU build on a machine
without CUDA; `make setup`, scripts/vllm-env.sh), started by otbuild's managed engine exactly
as `engine: vllm`, `serve_with: vllm|auto` and `rl.rollout: vllm|auto` start it. (The smoke
build serves its student on it too: tests/e2e/test_workflow.py reads which engine answered.)

What a CPU cannot show (CUDA kernels, tensor and data parallelism) is left to the contract
test (tests/contracts/test_vllm.py: vLLM's own parser and request models) and to a GPU node."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest
import regex

from otbuild.engines import LLM, EngineError, make_engine, open_engine
from otbuild.engines.vllm import vllm_executable
from otbuild.settings.engines import VLLMOptions
from otbuild.stagekit import Inputs
from tests.conftest import REPO

VLLM = vllm_executable(VLLMOptions())
RECORDER = REPO / "tests" / "support" / "vllm_recorder.py"  # the real vllm behind a proxy that keeps its bytes
# the tiny models as trained (float32), uncompiled: a server starts in seconds, not a minute
SERVED = {"dtype": "float32", "enforce_eager": True}
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(VLLM is None, reason="no vLLM here: make vllm-env (scripts/vllm-env.sh)"),
]


def tiny_qwen3(dest: Path, head_dim: int = 32, context: int = 4096) -> Path:
    """A random Qwen3 model of the smoke student's shape (its tokenizer, its chat template);
    `context`: its max_position_embeddings."""
    from otbuild.engines.tiny import make_tiny_model
    from otbuild.train.chat import QWEN3_SPECIAL, qwen3_template

    return make_tiny_model(
        dest,
        arch="qwen3",
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
        vocab_size=1024,
        max_position_embeddings=context,
        chat_template=qwen3_template(),
        special_tokens=QWEN3_SPECIAL,
    )


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> Path:
    return tiny_qwen3(tmp_path_factory.mktemp("qwen3") / "model")


def synthetic_tasks(path: Path, n: int, seed: int = 5) -> Path:
    from otbuild.sources.synthetic import generate
    from otbuild.tasks.table import write_tasks

    write_tasks(path, generate(n, seed=seed), source="synth")
    return path


def group_members(pgid: int) -> list[int]:
    """The live processes of process group `pgid` (zombies are gone already)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


# --- the student otbuild trains, served -----------------------------------------------------


def test_the_trained_student_serves_on_vllm_with_the_prompt_it_was_trained_on(smoke_build):
    """The smoke's SFT checkpoint loads in `vllm serve` as it is, and the prompt vLLM builds
    from a trace's messages (its own /tokenize, its own chat-template code) is token for token
    the prompt otbuild trained that turn on; the whole conversation too. Non-thinking: the
    answers as the harness sends them back; thinking: each turn's reasoning beside its answer
    (`reasoning`, vLLM's field), rendered in Qwen3's layout as otbuild trains it. Greedy answers are
    the in-process model's, token for token (same weights, float32)."""
    import torch

    from otbuild.train.chat import split_reasoning, tokenize_batch
    from otbuild.train.model import load_model, load_tokenizer

    project, _ = smoke_build
    ckpt = (project / "results" / "smoke" / "sft").resolve()
    traces = (
        pq.read_table(project / "results" / "smoke" / "trace_filter" / "kept.parquet", columns=["conversations"])
        .column("conversations")
        .to_pylist()[:2]
    )
    thinking = [
        [
            {**m, "content": f"<think>Turn {i}: what does the task ask?</think>\n{m['content']}"}
            if m["role"] == "assistant"
            else m
            for i, m in enumerate(conv)
        ]
        for conv in traces
    ]

    async def check() -> int:
        async with make_engine(
            LLM(engine="vllm", model=str(ckpt), temperature=0, max_tokens=24, engine_args=SERVED)
        ) as engine:
            root = engine.base_url.removesuffix("/v1")
            async with httpx.AsyncClient(timeout=60, trust_env=False) as http:

                async def tokens(messages, generation_prompt: bool) -> list[int]:
                    r = await http.post(
                        f"{root}/tokenize",
                        json={"model": engine.model, "messages": messages, "add_generation_prompt": generation_prompt},
                    )
                    assert r.status_code == 200, r.text
                    return r.json()["tokens"]

                checked = 0
                for mode, convs in (("qwen3", traces), ("qwen3_thinking", thinking)):
                    tok, source = load_tokenizer(ckpt, mode)
                    for conv, (ids, supervised) in zip(convs, tokenize_batch(tok, convs, source), strict=True):
                        sent = []
                        for m in conv:
                            reasoning, answer = split_reasoning(m["content"])
                            sent.append(
                                {"role": m["role"], "content": answer}
                                if reasoning is None or mode == "qwen3"
                                else {"role": m["role"], "content": answer, "reasoning": reasoning}
                            )
                        starts = [i for i in range(len(ids)) if supervised[i] and (i == 0 or not supervised[i - 1])]
                        turns = [k for k, m in enumerate(sent) if m["role"] == "assistant"]
                        assert len(starts) == len(turns) >= 5
                        for k, start in zip(turns, starts, strict=True):
                            assert await tokens(sent[:k], True) == ids[:start].tolist(), (mode, k)
                            checked += 1
                        assert await tokens(sent, False) == ids.tolist(), mode
                first = [m for m in traces[0] if m["role"] != "assistant"][:1]
                served = await http.post(
                    f"{engine.base_url}/chat/completions",
                    json={
                        "model": engine.model,
                        "messages": first,
                        "temperature": 0,
                        "max_tokens": 24,
                        "logprobs": True,
                        "return_tokens_as_token_ids": True,
                    },
                )
            assert served.status_code == 200, served.text
            got = [
                int(t["token"].removeprefix("token_id:")) for t in served.json()["choices"][0]["logprobs"]["content"]
            ]
            tok, _ = load_tokenizer(ckpt, "qwen3")
            prompt = tok.apply_chat_template(first, add_generation_prompt=True, return_tensors="pt", return_dict=True)
            model = load_model(ckpt)
            with torch.no_grad():
                out = model.generate(**prompt, max_new_tokens=len(got), do_sample=False)
            assert out[0, prompt["input_ids"].shape[1] :].tolist()[: len(got)] == got
            return checked

    assert asyncio.run(check()) >= 20


# --- teacher rollouts and the eval on the real server ----------------------------------------


def served_answers(record: Path) -> dict[tuple[str, int], dict]:
    """vLLM's answers as it sent them: (the trial's first prompt, turns before) -> message."""
    out = {}
    for line in record.read_text().splitlines():
        r = json.loads(line)
        if r["status"] == 200:
            messages = r["request"]["messages"]
            key = (messages[0]["content"], sum(m["role"] == "assistant" for m in messages))
            out[key] = json.loads(r["response"])["choices"][0]["message"]
    return out


@pytest.mark.parametrize("keep_reasoning", [True, False])
def test_teacher_rollouts_on_vllm_hold_each_answer_as_vllm_sent_it(tmp_path, qwen3, monkeypatch, keep_reasoning):
    """`engine: vllm` with its reasoning parser on: every assistant turn of the traces is what
    vLLM returned, byte for byte (read off the wire by a recording proxy): its reasoning before
    its answer with keep_reasoning, the answer alone without; what the harness sends back is
    the answers alone. A conversation that outgrows `max_model_len` ends its trial as a task
    failure (vLLM's 400), not an infrastructure error. The trace names the engine's release.
    The capture keeps every call's token ids, and its log-probs unless `capture_logprobs: false`
    (tied to keep_reasoning here: one server start each)."""
    from transformers import AutoTokenizer

    from otbuild.settings.stages import RolloutSettings
    from otbuild.stages.rollout import run_shard
    from otbuild.traces.table import assistant_turn

    record = tmp_path / "served.jsonl"
    monkeypatch.setenv("REAL_VLLM", VLLM)
    monkeypatch.setenv("VLLM_RECORD", str(record))
    end_think = AutoTokenizer.from_pretrained(qwen3).convert_tokens_to_ids("</think>")
    settings = RolloutSettings(
        engine="vllm",
        model=str(qwen3),
        temperature=1.0,
        seed=11,
        max_tokens=40,
        max_episodes=12,
        concurrency=2,
        sandbox="bwrap",
        keep_reasoning=keep_reasoning,
        capture_logprobs=keep_reasoning,
        extra_body={"logit_bias": {str(end_think): 4.0}},  # a random model closes its think block now and then
        engine_args={
            "reasoning_parser": "qwen3",
            **SERVED,
            "max_model_len": 2000,
            "vllm_executable": str(RECORDER),  # seeded requests: no chunked prefill on the CPU build
            "extra_args": ["--max-num-batched-tokens", "8192"],
        },
    )
    out = tmp_path / "rollout"
    run_shard(settings, [synthetic_tasks(tmp_path / "tasks.parquet", 2)], out, 0)
    rows = pq.read_table(out / "shards" / "0-of-1.parquet").to_pylist()
    served = served_answers(record)
    assert len(rows) == 2
    both = 0
    for row in rows:
        assert row["exception"] is None and row["result"] == "ContextLengthExceededError", row["result"]
        assert row["teacher"] == f"vllm:{qwen3}" and json.loads(row["metadata"])["engine_version"] == "0.32.0"
        conv = row["conversations"]
        turns = [m["content"] for m in conv if m["role"] == "assistant"]
        assert len(turns) >= 2
        for k, content in enumerate(turns):
            message = served[(conv[0]["content"], k)]
            reasoning, answer = message.get("reasoning"), message.get("content") or ""
            assert content == assistant_turn(answer, reasoning if keep_reasoning else None)
            both += bool(reasoning and answer)
    assert both, "no turn had both reasoning and an answer: the parser's split went unchecked"
    for line in record.read_text().splitlines():  # the history sent back: the answers alone
        messages = json.loads(line)["request"]["messages"]
        for k, m in enumerate(x for x in messages if x["role"] == "assistant"):
            assert m["content"] == (served[(messages[0]["content"], k)].get("content") or "")
    # the capture proxy (on by default) recorded each call as vLLM sent it, with its tokens
    calls = pq.read_table(out / "shards" / "0-of-1.calls.parquet").to_pylist()
    answered = [c for c in calls if c["status"] == 200]
    assert len(answered) == sum(len([m for m in r["conversations"] if m["role"] == "assistant"]) for r in rows)
    assert len(calls) == len(answered) + 2  # each trial's last request: the context overflow's 400
    assert all(c["harness_agrees"] for c in answered)
    for c in answered:
        messages = json.loads(c["request"])["messages"]
        wire = served[(messages[0]["content"], sum(m["role"] == "assistant" for m in messages))]
        assert (c["content"], c["reasoning"]) == (wire.get("content"), wire.get("reasoning"))
        assert len(c["completion_token_ids"]) == c["completion_tokens"] > 0
        assert len(c["prompt_token_ids"]) == c["prompt_tokens"]
        if keep_reasoning:
            assert len(c["logprobs"]) == c["completion_tokens"] and all(lp <= 0 for lp in c["logprobs"])
        else:
            assert c["logprobs"] is None and "logprobs" not in json.loads(c["request"])
        kept = json.loads(c["response"])  # the token ids once, in their columns
        assert "prompt_token_ids" not in kept and "token_ids" not in kept["choices"][0]


def test_the_eval_serves_the_checkpoint_on_vllm_with_constrained_decoding(tmp_path, smoke_build):
    """`serve_with: vllm` under `constrained_decoding`: vLLM's structured outputs keep every
    answer of the trained student inside the harness's JSON frame (as in the smoke's own evals,
    which set it: the student's and its untrained base's); the scores name vLLM."""
    from otbuild.harness import protocol
    from otbuild.stages.eval import EvalSettings
    from otbuild.stages import eval as eval_stage

    project, _ = smoke_build
    ckpt = (project / "results" / "smoke" / "rl").resolve()
    cfg = EvalSettings(
        engine="vllm",
        model=str(ckpt),
        model_label=f"vllm:{ckpt}",
        serves_checkpoint=True,
        samples_per_task=1,
        max_tokens=128,
        max_episodes=3,
        temperature=0.7,
        agent_timeout_sec=10,
        engine_args=SERVED,
        extra_body={"structured_outputs": {"regex": protocol.ANSWER_REGEX}},
    )
    inputs = Inputs.of(
        tasks=[synthetic_tasks(tmp_path / "tasks.parquet", 3, seed=999)], checkpoint=[ckpt / "checkpoint.json"]
    )
    out = tmp_path / "eval"
    eval_stage.run_shard(cfg, inputs, out, 0)
    stats = eval_stage.run(cfg, inputs, out)
    assert stats["engines"] == {f"vllm:{ckpt}": "0.32.0"} and stats["trials"] == 3
    answers = [
        m["content"]
        for r in pq.read_table(out / "traces.parquet").to_pylist()
        for m in r["conversations"]
        if m["role"] == "assistant"
    ]

    def framed(answer: str):  # inside the frame, or a prefix of it (cut at max_tokens)
        return regex.fullmatch(protocol.ANSWER_REGEX, answer, partial=True)

    assert answers and all(framed(a) for a in answers), answers
    for label in ("eval", "base/eval"):  # the smoke's evals, on vLLM under the recipe's constrained_decoding
        rows = pq.read_table(project / "results" / "smoke" / label / "traces.parquet").to_pylist()
        built = [m["content"] for r in rows for m in r["conversations"] if m["role"] == "assistant"]
        assert built and all(framed(a) for a in built), label


# --- the real server's failures ----------------------------------------------------------------


def test_a_server_killed_mid_shard_is_restarted_and_its_trials_run_again(tmp_path, qwen3):
    """The vLLM server dies under a running shard (its processes killed): the requests in
    flight fail at once as ServerDiedError (no retries against the dead port), those trials are
    run again on a restarted server, and the shard completes with every trial; nothing of
    either server is left."""
    from otbuild.settings.stages import RolloutSettings
    from otbuild.stages.rollout import run_shard

    log = tmp_path / "vllm.log"
    settings = RolloutSettings(
        engine="vllm",
        model=str(qwen3),
        temperature=0.7,
        seed=1,
        max_tokens=160,
        max_episodes=3,
        concurrency=1,
        sandbox="bwrap",
        prompt="compact",
        backoff_sec=0.2,
        engine_args={**SERVED, "max_model_len": 2048, "log_path": str(log)},
    )
    out = tmp_path / "rollout"
    partial = out / "shards" / "0-of-1.partial.jsonl"
    failed: list[BaseException] = []

    def shard():
        try:
            run_shard(settings, [synthetic_tasks(tmp_path / "tasks.parquet", 4)], out, 0)
        except BaseException as e:  # noqa: BLE001 (reported below)
            failed.append(e)

    job = threading.Thread(target=shard)
    job.start()
    deadline = time.monotonic() + 300
    while not (partial.exists() and partial.read_text().count("\n") >= 1) and time.monotonic() < deadline:
        time.sleep(0.2)
    servers = [p for p in _processes("vllm.entrypoints.cli.main") if str(qwen3) in p[1]]
    assert len(servers) == 1, servers
    _wait_for_a_running_request(servers[0][1])  # the kill lands mid-request, not between two
    pgid = os.getpgid(servers[0][0])
    for pid in group_members(pgid):
        if pid != pgid:  # the server and its engine processes; the guard reports the death
            os.kill(pid, signal.SIGKILL)
    job.join(600)
    assert not job.is_alive() and not failed, failed
    rows = pq.read_table(out / "shards" / "0-of-1.parquet").to_pylist()
    assert len(rows) == 4 and all(r["exception"] is None for r in rows), [r["exception"] for r in rows]
    retried = [json.loads(r["metadata"]).get("retried_exceptions") for r in rows]
    assert ["ServerDiedError"] in retried, retried
    assert log.read_text().count("Application startup complete") == 2  # started once more
    assert not group_members(pgid) and not [p for p in _processes("vllm.entrypoints.cli.main") if str(qwen3) in p[1]]


def _wait_for_a_running_request(cmdline: str, timeout: float = 120.0) -> None:
    """Until the server at `cmdline`'s --port reports a request running (vLLM's /metrics)."""
    port = regex.search(r"--port[ =](\d+)", cmdline)
    assert port, cmdline
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            metrics = httpx.get(f"http://127.0.0.1:{port[1]}/metrics", timeout=2.0, trust_env=False).text
        except httpx.HTTPError:
            metrics = ""
        running = regex.search(r"^vllm:num_requests_running\{[^}]*\} ([0-9.]+)$", metrics, flags=regex.M)
        if running and float(running[1]) > 0:
            return
        time.sleep(0.05)
    raise AssertionError(f"no request ran on the server within {timeout} s")


def _processes(needle: str) -> list[tuple[int, str]]:
    out = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in text:
            out.append((int(cmdline.parent.name), text))
    return out


def test_a_model_vllm_cannot_serve_fails_the_shard_naming_the_servers_log(tmp_path):
    """What vLLM refuses on its first request (heads 16 wide: its CPU attention has no kernel
    for them; the engine dies and the server exits) fails the shard at once, with the server's
    log tail, never ten retries against a dead port; a model that does not load fails the start
    the same way. Nothing is left running."""
    from otbuild.errors import StageError
    from otbuild.settings.stages import RolloutSettings
    from otbuild.stages.rollout import run_shard

    narrow = tiny_qwen3(tmp_path / "narrow", head_dim=16)
    settings = RolloutSettings(
        engine="vllm",
        model=str(narrow),
        max_tokens=8,
        max_episodes=2,
        sandbox="bwrap",
        engine_args={**SERVED, "max_model_len": 2048},
    )
    started = time.monotonic()
    with pytest.raises(StageError, match=r"(?s)the first request failed.*exited with code.*head_dim"):
        run_shard(settings, [synthetic_tasks(tmp_path / "tasks.parquet", 2)], tmp_path / "rollout", 0)
    assert time.monotonic() - started < 240
    with pytest.raises(EngineError, match=r"(?s)exited with code \d+ before it was ready.*last lines:\n.+"):
        (tmp_path / "not-a-model").mkdir()
        asyncio.run(
            open_engine(
                LLM(
                    engine="vllm",
                    model=str(tmp_path / "not-a-model"),
                    engine_args={"env": {"HF_HUB_OFFLINE": "1"}, "enforce_eager": True},
                )
            )
        )
    assert not [p for p in _processes("vllm.entrypoints.cli.main") if str(tmp_path) in p[1]]


def test_no_vllm_outlives_a_job_killed_with_its_process_group(tmp_path, qwen3):
    """kill -9 of the job's whole process group (the server runs in a group of its own, so the
    kill does not reach it): the guard that leads the server's group ends it and removes its
    temporary dir; nothing of vLLM is left."""
    script = (
        "import asyncio\n"
        "from otbuild.engines import LLM, open_engine\n"
        "async def main():\n"
        f"    e = await open_engine(LLM(engine='vllm', model={str(qwen3)!r}, engine_args={{'max_model_len': 512, 'enforce_eager': True}}))\n"
        "    print(e._server.proc.pid, e._server.tmpdir, flush=True)\n"
        "    await asyncio.sleep(600)\n"
        "asyncio.run(main())\n"
    )
    job = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=REPO, start_new_session=True
    )
    try:
        guard, tmpdir = job.stdout.readline().split()
        members = group_members(int(guard))
        assert len(members) >= 3 and Path(tmpdir).is_dir()  # the guard, vLLM's API server, its engine
        os.killpg(job.pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while group_members(int(guard)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not group_members(int(guard)) and not Path(tmpdir).exists()
    finally:
        job.kill()
        job.wait()


def test_the_smoke_build_serves_its_student_on_vllm(smoke_build):
    """`serve_with: auto` and `rl.rollout: auto` where vLLM is installed: the smoke's evals (the
    student's and its untrained base's) and both RL steps ran on vLLM, whose release the
    provenance and the report name; each server's log lies beside its job's; no vLLM process
    outlived the build."""
    project, _ = smoke_build
    results = project / "results" / "smoke"
    rl = json.loads((results / "rl" / "provenance.json").read_text())["stats"]
    for label in ("eval", "base/eval"):
        ev = json.loads((results / label / "provenance.json").read_text())["stats"]
        assert list(ev["engines"].values()) == ["0.32.0"] and next(iter(ev["engines"])).startswith("vllm:"), label
    assert rl["rollout_engines"] == ["vllm 0.32.0"] and list(rl["llm_usage"]) == ["vllm:policy"]
    steps = [json.loads(line) for line in (results / "rl" / "train_log.jsonl").read_text().splitlines()]
    assert [s["rollout_engine"] for s in steps if "rollout_engine" in s] == ["vllm 0.32.0"] * 2
    assert "vllm 0.32.0" in (results / "report" / "report.html").read_text()
    logs = sorted(p.relative_to(project / "logs").as_posix() for p in (project / "logs").rglob("*.vllm-serve.log"))
    assert [p.split("/")[0] for p in logs] == ["eval", "eval", "rl"], logs  # the student's, its base's; RL
    assert not [p for p in _processes("vllm.entrypoints.cli.main") if str(project) in p[1]]


async def _served_engine(policy, server, messages):
    """An RL trial's engine on the served policy after one sampled answer (its `turns[0]`)."""
    from otbuild.train.rl.policy import ServedPolicyEngine

    client = server.client()
    try:
        engine = ServedPolicyEngine(policy, client)
        await engine.complete(messages)
    finally:
        await client.aclose()
    return engine


async def _served_turn(policy, server, messages):
    """One sampled answer of the served policy, as an RL trial records it."""
    return (await _served_engine(policy, server, messages)).turns[0]


def test_each_steps_policy_moves_into_the_live_server(tmp_path, qwen3):
    """rollout: vllm keeps one server for the run: after an update the served model answers as
    the in-process policy with the new weights does (greedy, token for token), on the same
    server process (reloaded in place, not restarted); `restart` starts a new one instead."""
    import torch

    from otbuild.settings.stages import RlSettings
    from otbuild.train.model import load_model, load_tokenizer
    from otbuild.train.rl.loss import sequences, token_logprobs
    from otbuild.train.rl.policy import Policy
    from otbuild.train.rl.server import PolicyServer

    tok, _ = load_tokenizer(qwen3)
    policy = Policy(load_model(qwen3), tok, temperature=1.0, max_tokens=12, max_context=1024)
    messages = [{"role": "user", "content": "list the files in /app and count them"}]
    prompt = policy.prompt_ids(messages)

    def in_process() -> list[int]:
        x = torch.tensor([prompt])
        with torch.no_grad():
            out = policy.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=12)
        return out[0, len(prompt) :].tolist()

    async def served(server) -> list[int]:
        client = server.client()
        try:
            r = await client._http().post(
                f"{server.base_url}/chat/completions",
                json={
                    "model": "policy",
                    "messages": messages,
                    "temperature": 0,
                    "max_tokens": 12,
                    "logprobs": True,
                    "return_tokens_as_token_ids": True,
                },
            )
        finally:
            await client.aclose()
        return [int(t["token"].removeprefix("token_id:")) for t in r.json()["choices"][0]["logprobs"]["content"]]

    cfg = RlSettings(steps=2, rollout="vllm", vllm_args={**SERVED, "max_model_len": 1024})
    server = PolicyServer(cfg, tmp_path)
    try:
        assert server.sync(policy, 0) == "start"
        pid, before = server.server.pid, asyncio.run(served(server))
        assert before == in_process()
        # a rollout's turn holds the tokens vLLM sampled and their log-probs after temperature: the
        # behaviour policy's, as the trainer computes them from the same weights (max_staleness)
        policy.temperature = 0.7
        engine = asyncio.run(_served_engine(policy, server, messages))
        turn = engine.turns[0]
        seq = sequences([turn])[0]
        assert len(turn.logprobs) == len(turn.completion_ids) > 0 and turn.prompt_ids == prompt
        assert (engine.served_prompts, engine.prompt_mismatches) == (1, 0)  # the server's prompt ids, as rendered
        with torch.no_grad():
            recomputed = token_logprobs(policy.model, [seq], 0.7, tok.pad_token_id)[0]
        assert recomputed.tolist() == pytest.approx(turn.logprobs, abs=1e-3)
        # a trainer whose template renders otherwise (a system line the server's has not) trains
        # on the prompt the server tokenized, and counts the turn as a train-serve mismatch
        template = tok.chat_template
        tok.chat_template = "<|im_start|>system\nextra<|im_end|>\n" + template
        try:
            assert policy.prompt_ids(messages) != prompt  # the trainer's render is not the server's
            drifted = asyncio.run(_served_engine(policy, server, messages))
        finally:
            tok.chat_template = template
        assert drifted.turns[0].prompt_ids == prompt and (drifted.served_prompts, drifted.prompt_mismatches) == (1, 1)
        policy.temperature = 1.0
        torch.manual_seed(1)
        with torch.no_grad():  # an update that moves every weight, the tied embedding too
            for p in policy.model.parameters():
                p.add_(torch.randn_like(p) * 0.5)
        assert server.sync(policy, 1) == "reload" and server.server.pid == pid and server.version == 1
        after = asyncio.run(served(server))
        assert after == in_process() != before
        restart = PolicyServer(cfg.model_copy(update={"weight_sync": "restart"}), tmp_path / "restart")
        restart.server, restart.base_url = server.server, server.base_url  # as after a first step
        server.server = None
        assert restart.sync(policy, 2) == "start" and restart.server.pid != pid
        assert asyncio.run(served(restart)) == after
        restart.stop()
    finally:
        server.stop()


def test_no_one_else_reaches_the_rl_servers_weight_endpoints(tmp_path, qwen3):
    """vLLM's development endpoints (/collective_rpc runs a method in the server, /pause and a
    reload swap the weights being trained) take no API key, so no TCP port of the RL policy
    server answers HTTP (its engine core keeps torch.distributed's gloo listeners, which speak
    none): it is on a unix socket in a folder that is otbuild's user's and 0700, which another
    uid cannot connect to; otbuild's own clients reload the weights and sample over it."""
    import stat
    from concurrent.futures import ThreadPoolExecutor

    from otbuild.settings.stages import RlSettings
    from otbuild.train.model import load_model, load_tokenizer
    from otbuild.train.rl.policy import Policy
    from otbuild.train.rl.server import PolicyServer

    tok, _ = load_tokenizer(qwen3)
    policy = Policy(load_model(qwen3), tok, temperature=1.0, max_tokens=8, max_context=1024)
    server = PolicyServer(RlSettings(steps=2, rollout="vllm", vllm_args={**SERVED, "max_model_len": 1024}), tmp_path)
    try:
        server.sync(policy, 0)
        ports = _tcp_listeners(group_members(os.getpgid(server.server.pid)))
        with ThreadPoolExecutor(max(len(ports), 1)) as pool:
            http = [p for p, yes in zip(ports, pool.map(_answers_http, ports), strict=True) if yes]
        assert not http, f"HTTP answered on TCP port(s) {http} of the server's"
        sock = Path(server.server.uds)
        folder = sock.parent.lstat()
        assert stat.S_ISSOCK(sock.stat().st_mode) and stat.S_ISDIR(folder.st_mode)
        assert stat.S_IMODE(folder.st_mode) == 0o700 and folder.st_uid == os.geteuid()
        if os.geteuid() == 0:  # another user of the node connects to it (then POSTs to /collective_rpc)
            connect = f"import socket; socket.socket(socket.AF_UNIX).connect({str(sock)!r})"
            other = subprocess.run(
                [
                    "setpriv",
                    "--reuid",
                    "65534",
                    "--regid",
                    "65534",
                    "--clear-groups",
                    "/usr/bin/python3",
                    "-c",
                    connect,
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            assert other.returncode == 1 and "PermissionError" in other.stderr, other
        assert server.sync(policy, 1) == "reload"
        turn = asyncio.run(_served_turn(policy, server, [{"role": "user", "content": "count the files in /app"}]))
        assert turn.completion_ids and len(turn.logprobs) == len(turn.completion_ids)
    finally:
        server.stop()
    assert not sock.parent.exists()


def _tcp_listeners(pids: list[int]) -> list[int]:
    """The TCP ports processes `pids` listen on (their sockets' inodes in /proc/net/tcp{,6})."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            try:
                inodes.add(os.readlink(fd).removeprefix("socket:[").removesuffix("]"))
            except OSError:
                pass
    return [
        int(f[1].rsplit(":", 1)[1], 16)
        for table in ("tcp", "tcp6")
        for f in (line.split() for line in Path("/proc/net", table).read_text().splitlines()[1:])
        if f[3] == "0A" and f[9] in inodes
    ]  # 0A: LISTEN


def _answers_http(port: int) -> bool:
    try:
        with socket.create_connection(("localhost", port), timeout=3.0) as c:
            c.sendall(b"GET /health HTTP/1.0\r\n\r\n")
            return c.recv(5) == b"HTTP/"
    except OSError:  # a timeout, or closed without an answer
        return False
