"""RLOO: advantage and PPO-clip math against hand-worked numbers, turn joining, and a toy task
on which a few RLOO steps through the real harness raise the rewarded answer's probability."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from otbuild.sandbox import backend_problem
from otbuild.settings.stages import RlSettings, SftSettings
from otbuild.train.rl.loss import (
    TokenSequence,
    Turn,
    k3_kl,
    masked_rloo_advantages,
    ppo_clip_loss,
    rloo_advantages,
    sequences,
)

needs_sandbox = pytest.mark.skipif(backend_problem("bwrap") is not None, reason="bubblewrap unusable here")


# -- advantage ------------------------------------------------------------------------------
def test_rloo_advantage_hand_worked():
    # [1, 0, 0, 1]: leave-one-out baselines 1/3 (for a 1) and 2/3 (for a 0); std (ddof 1) = sqrt(1/3)
    a = rloo_advantages([1, 0, 0, 1], eps=0.0)
    s = math.sqrt(1 / 3)
    assert a == pytest.approx([(2 / 3) / s, (-2 / 3) / s, (-2 / 3) / s, (2 / 3) / s])
    assert a[0] == pytest.approx(1.1547005)
    # [1, 0, 0, 0]: std 0.5; the 1 gets (1 - 0) / 0.5 = 2, each 0 gets (0 - 1/3) / 0.5
    assert rloo_advantages([1, 0, 0, 0], eps=0.0) == pytest.approx([2.0, -2 / 3, -2 / 3, -2 / 3])
    # epsilon is added to the std
    assert rloo_advantages([1, 0], eps=0.5)[0] == pytest.approx(1 / (math.sqrt(0.5) + 0.5))
    # a prompt whose rewards are all equal contributes zero
    assert rloo_advantages([1, 1, 1]) == [0.0, 0.0, 0.0]
    assert rloo_advantages([0.0] * 8) == [0.0] * 8
    with pytest.raises(ValueError):
        rloo_advantages([1.0])


def test_masked_samples_leave_the_baseline_and_get_no_advantage():
    # RLOO-N: [1, 0, masked, 0] is RLOO over [1, 0, 0]; the masked sample has no advantage at all
    assert masked_rloo_advantages([1, 0, 0, 0], [False, False, True, False], eps=0.0) == [
        *rloo_advantages([1, 0, 0], eps=0.0)[:2],
        None,
        rloo_advantages([1, 0, 0], eps=0.0)[2],
    ]
    # a masked 0 does not drag the baseline down: [1, 1, masked] contributes zero, not +/-
    assert masked_rloo_advantages([1, 1, 0], [False, False, True]) == [0.0, 0.0, None]
    # under 2 unmasked samples there is no baseline
    assert masked_rloo_advantages([1, 0, 0], [False, True, True]) == [0.0, None, None]
    assert masked_rloo_advantages([0, 0], [True, True]) == [None, None]


# -- off-policy -----------------------------------------------------------------------------
def test_a_stale_sequence_is_corrected_against_the_log_probs_that_sampled_it(tmp_path):
    """The policy records each sampled token's log-prob under the sampling distribution: for
    the weights that sampled it, what the update recomputes. A sequence sampled by older weights
    (stale) takes those recorded log-probs as the ratio's denominator, so the ratio measures the
    change since sampling and clips it; an on-policy one takes today's weights' (ratio 1)."""
    from otbuild.engines.tiny import make_tiny_model
    from otbuild.train.chat import QWEN3_SPECIAL, qwen3_template
    from otbuild.train.model import load_model, load_tokenizer
    from otbuild.train.rl.loss import old_logprobs, token_logprobs
    from otbuild.train.rl.policy import Policy

    d = make_tiny_model(
        tmp_path / "m",
        arch="qwen3",
        chat_template=qwen3_template(),
        special_tokens=QWEN3_SPECIAL,
        texts=[CORRECT, WRONG],
    )
    tok, _ = load_tokenizer(d)
    policy = Policy(load_model(d), tok, temperature=0.7, max_tokens=12, max_context=4096)
    prompt = policy.prompt_ids([{"role": "user", "content": "Write the word"}])
    ids, logprobs = policy.sample(prompt, seed=3)
    [seq] = sequences([Turn(prompt, ids, logprobs)])
    with torch.no_grad():
        recomputed = token_logprobs(policy.model, [seq], 0.7, tok.pad_token_id)[0]
    assert recomputed.tolist() == pytest.approx(logprobs, abs=1e-4)  # the behaviour policy, as recorded

    seq.behaviour = [x - 0.5 for x in logprobs]  # as if sampled by weights the update has moved since
    with torch.no_grad():
        assert old_logprobs(policy.model, [seq], 0.7, tok.pad_token_id) == 0.0  # on-policy: today's weights
        assert torch.equal(seq.old_logp, recomputed)
        seq.stale = True
        assert old_logprobs(policy.model, [seq], 0.7, tok.pad_token_id) == pytest.approx(0.5, abs=1e-4)
    n = len(ids)
    _, st = ppo_clip_loss(recomputed[None], seq.old_logp[None], torch.ones(1), torch.ones(1, n))
    assert st["clipped_tokens"] == n  # ratio e^0.5 > 1.2: the drift since sampling is clipped


# -- loss -----------------------------------------------------------------------------------
def test_ppo_clip_loss_hand_worked():
    old = torch.zeros(1, 3)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.0]])).requires_grad_()
    mask = torch.tensor([[1, 1, 0]])  # the third token is not an assistant token
    # A = +1: token 1 clipped to 1.2, token 2 keeps 0.5 -> -(1.2 + 0.5) / 2
    loss, st = ppo_clip_loss(logp, old, torch.tensor([1.0]), mask)
    assert float(loss.detach()) == pytest.approx(-0.85) and st["clipped_tokens"] == 1
    loss.backward()
    # the clipped token has no gradient; d/dlogp of -ratio * A / 2 = -0.5 / 2 for token 2
    assert logp.grad.tolist()[0] == pytest.approx([0.0, -0.25, 0.0])
    # A = -1: min(-1.5, -1.2) = -1.5 and min(-0.5, -0.8) = -0.8 -> (1.5 + 0.8) / 2
    loss, st = ppo_clip_loss(logp.detach(), old, torch.tensor([-1.0]), mask)
    assert float(loss) == pytest.approx(1.15) and st["clipped_tokens"] == 1
    # token-mean over a given count (all assistant tokens of the step), asymmetric clip
    loss, _ = ppo_clip_loss(logp.detach(), old, torch.tensor([1.0]), mask, clip_high=0.4, n_tokens=4)
    assert float(loss) == pytest.approx(-(1.4 + 0.5) / 4)
    # ratio 1, zero advantage: zero loss
    z, _ = ppo_clip_loss(old, old, torch.tensor([0.0]), mask)
    assert float(z) == 0.0


def test_k3_kl_is_zero_at_equality_and_positive_otherwise():
    lp = torch.log(torch.tensor([0.5, 0.2]))
    assert k3_kl(lp, lp).tolist() == [0.0, 0.0]
    d = math.log(0.25) - math.log(0.5)
    assert float(k3_kl(lp[:1], torch.log(torch.tensor([0.25])))) == pytest.approx(math.exp(d) - d - 1)


def test_turns_join_when_prompts_extend_and_only_completions_are_targets():
    turns = [Turn([1, 2], [3, 4]), Turn([1, 2, 3, 4, 5], [6]), Turn([9, 9], [7])]
    seqs = sequences(turns)
    assert [s.ids for s in seqs] == [[1, 2, 3, 4, 5, 6], [9, 9, 7]]
    assert seqs[0].mask == [False, False, True, True, False, True]
    assert sequences([Turn([1], [])]) == []
    assert isinstance(seqs[0], TokenSequence)


# -- the toy task ---------------------------------------------------------------------------
CORRECT = json.dumps({"commands": [{"keystrokes": "echo target > out.txt\n", "duration": 0.2}], "task_complete": True})
WRONG = CORRECT.replace("echo target", "echo wrong")


def _toy_task():
    from otbuild.tasks.taskdir import TaskDir

    t = TaskDir("echo-target")
    t.add("instruction.md", "Write the word target to /app/out.txt.")
    t.add("task.toml", 'version = "1.0"\n[agent]\ntimeout_sec = 30.0\n[verifier]\ntimeout_sec = 10.0\n')
    t.add("environment/Dockerfile", "FROM python:3.12-slim\nWORKDIR /app\n")
    t.add(
        "tests/test.sh",
        "#!/bin/sh\nmkdir -p /logs/verifier\n"
        'if [ "$(cat /app/out.txt 2>/dev/null)" = target ]; then echo 1; else echo 0; fi'
        " > /logs/verifier/reward.txt\n",
        executable=True,
    )
    return t


class _Recorder:
    name, provider, model = "recorder", "test", "recorder"

    def __init__(self):
        self.first = None

    async def complete(self, messages, **_):
        from otbuild.engines import Completion

        self.first = self.first or [dict(m) for m in messages]
        return Completion(CORRECT, 0, 0, "stop")

    async def aclose(self):
        pass


@pytest.mark.slow
@needs_sandbox
def test_rloo_steps_raise_the_rewarded_answers_probability(tmp_path):
    from otbuild.harness.config import TrialConfig
    from otbuild.harness.trial import run_trial
    from otbuild.settings.trials import Trials
    from otbuild.tasks.table import TaskRecord, write_tasks
    from otbuild.traces.table import TRACE_SCHEMA, write_traces
    from otbuild.train.model import load_model, load_tokenizer
    from otbuild.train.rl.policy import sequence_logprob
    from otbuild.train.rl.trainer import train as rl_train
    from otbuild.train.sft import train as sft_train

    task = _toy_task()
    rec = _Recorder()
    row = asyncio.run(run_trial(task, "t0", rec, TrialConfig(Trials(max_episodes=1), "terminus2"), tmp_path / "w0"))
    assert row["reward"] == 1.0  # the harness and verifier accept the correct answer
    prompt = [{"role": "user", "content": rec.first[0]["content"]}]

    # warm start: SFT on both answers, so sampling gives a mix of rewards
    traces = []
    for i in range(8):
        r = {k: None for k in TRACE_SCHEMA.names}
        r["conversations"] = prompt + [{"role": "assistant", "content": CORRECT if i % 2 else WRONG}]
        traces.append(r)
    write_traces(tmp_path / "kept.parquet", traces)
    sft = {
        "model": {
            "kind": "tiny",
            "vocab_size": 600,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
        },
        "learning_rate": 2e-2,
        "warmup_ratio": 0.0,
        "lr_scheduler": "constant",
        "global_batch_size": 8,
        "per_device_batch_size": 8,
        "epochs": 60,
        "cutoff_len": 2048,
        "zero_stage": 0,
        "gradient_checkpointing": False,
        "save_steps": 1000,
    }
    sft_train(SftSettings(**sft), [tmp_path / "kept.parquet"], tmp_path / "sft")
    write_tasks(tmp_path / "tasks.parquet", [TaskRecord(task, runnable_locally=True)], source="toy")

    tok, _ = load_tokenizer(tmp_path / "sft")
    before = load_model(tmp_path / "sft")
    lp0 = sequence_logprob(before, tok, prompt, CORRECT)
    lw0 = sequence_logprob(before, tok, prompt, WRONG)
    assert math.log(0.05) < lp0 < math.log(0.95) and lw0 > math.log(0.05), (lp0, lw0)

    # the paper's RL temperature: at 1.0 this tiny student samples mostly malformed answers, and
    # which prompt text it was trained on decides whether 4 steps climb (seen with a new prompt).
    # lr 1e-3 for 32-wide heads: at 2e-3 Adam's first steps (~lr per weight) overshoot 8 of 8
    # right into malformed answers (a step's reward 0.875 -> 0.125), pass or fail by float rounding
    rl = {
        "steps": 4,
        "batch_size": 1,
        "samples_per_task": 8,
        "temperature": 0.7,
        "max_tokens": 96,
        "max_context": 4096,
        "learning_rate": 1e-3,
        "save_steps": 2,
        "concurrency": 8,
        "sandbox": {"max_episodes": 1},
    }
    manifest = rl_train(
        RlSettings(**rl), [tmp_path / "sft" / "checkpoint.json", tmp_path / "tasks.parquet"], tmp_path / "rl"
    )
    log = [json.loads(x) for x in (tmp_path / "rl" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4] and all("loss" in r and "reward_mean" in r for r in log)
    assert manifest["files"]["model.safetensors"]
    after = load_model(tmp_path / "rl")
    lp1 = sequence_logprob(after, tok, prompt, CORRECT)
    lw1 = sequence_logprob(after, tok, prompt, WRONG)
    print(
        f"log p(correct) {lp0:.3f} -> {lp1:.3f}, log p(wrong) {lw0:.3f} -> {lw1:.3f}; rewards",
        [r["reward_mean"] for r in log],
    )
    assert lp1 > lp0 + 0.1 and lw1 < lw0, (lp0, lp1, lw0, lw1, log)
    assert log[-1]["reward_mean"] >= log[0]["reward_mean"], log  # no collapse into malformed answers


@needs_sandbox
def test_rl_resumes_from_its_last_checkpoint(tmp_path, monkeypatch):
    import otbuild.train.rl.trainer as R
    from otbuild.engines.tiny import make_tiny_model
    from otbuild.tasks.table import TaskRecord, write_tasks
    from otbuild.train.chat import QWEN3_SPECIAL, qwen3_template

    sft = make_tiny_model(
        tmp_path / "sft",
        arch="qwen3",
        chat_template=qwen3_template(),
        special_tokens=QWEN3_SPECIAL,
        texts=[CORRECT, WRONG, "Write the word"],
    )
    (sft / "checkpoint.json").write_text("{}")
    write_tasks(tmp_path / "tasks.parquet", [TaskRecord(_toy_task(), runnable_locally=True)], source="toy")
    settings = {
        "steps": 3,
        "batch_size": 1,
        "samples_per_task": 2,
        "max_tokens": 8,
        "max_context": 4096,
        "save_steps": 1,
        "temperature": 1.0,
        "sandbox": {"max_episodes": 1},
    }
    inputs = [sft / "checkpoint.json", tmp_path / "tasks.parquet"]
    real, calls = R.rollout, []

    async def killed_in_step_3(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("killed")
        return await real(*a, **k)

    monkeypatch.setattr(R, "rollout", killed_in_step_3)
    with pytest.raises(RuntimeError, match="killed"):
        R.train(RlSettings(**settings), inputs, tmp_path / "rl")
    assert (tmp_path / "rl" / "checkpoints" / "latest").read_text() == "step-2"  # DeepSpeed's layout
    assert list((tmp_path / "rl" / "checkpoints" / "step-2").glob("*optim_states.pt"))
    monkeypatch.setattr(R, "rollout", real)
    seen = []
    R.train(RlSettings(**settings), inputs, tmp_path / "rl", log=seen.append)
    assert "rl: resumed from step 2 of 3" in seen and len([s for s in seen if "step 3/3" in s]) == 1
    log = [json.loads(x) for x in (tmp_path / "rl" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3] and all(r["trajectories"] == 2 for r in log)
    assert not (tmp_path / "rl" / "checkpoints").exists()
    files = json.loads((tmp_path / "rl" / "checkpoint.json").read_text())["files"]
    assert files["model.safetensors"]
    # TensorBoard: both runs' event files are artifact files; each step shows once, as logged
    from tests.train.test_tracking import scalars

    assert len([f for f in files if f.startswith("events.out.tfevents.")]) == 2
    shown = scalars(tmp_path / "rl")
    for key in ("reward_mean", "loss", "tokens_per_second"):
        assert shown[f"train/{key}"] == [(r["step"], pytest.approx(r[key], rel=1e-6, abs=1e-9)) for r in log], key


@pytest.mark.slow
@needs_sandbox
def test_rl_rollouts_through_a_vllm_server_per_step(tmp_path, fake_vllm_bin):
    """rollout: vllm, weight_sync: restart: each step's policy is saved, `vllm serve` is started
    on it (here the `vllm` on PATH is otbuild serve underneath, which takes no weights while it
    runs: the live reload is tests/engines/test_vllm_live.py's), the trials run against it over HTTP on
    its unix socket, and the update trains on the recorded turns."""
    import psutil

    import otbuild.train.rl.trainer as R
    from otbuild.engines.tiny import make_tiny_model
    from otbuild.tasks.table import TaskRecord, write_tasks
    from otbuild.train.chat import QWEN3_SPECIAL, qwen3_template

    sft = make_tiny_model(
        tmp_path / "sft",
        arch="qwen3",
        chat_template=qwen3_template(),
        special_tokens=QWEN3_SPECIAL,
        texts=[CORRECT, WRONG, "Write the word"],
        max_position_embeddings=4096,
    )  # the server checks the model's context
    (sft / "checkpoint.json").write_text("{}")
    write_tasks(tmp_path / "tasks.parquet", [TaskRecord(_toy_task(), runnable_locally=True)], source="toy")
    settings = {
        "steps": 2,
        "batch_size": 1,
        "samples_per_task": 2,
        "max_tokens": 8,
        "max_context": 4096,
        "temperature": 1.0,
        "sandbox": {"max_episodes": 1},
        "rollout": "vllm",
        "weight_sync": "restart",
        "vllm_args": {"tensor_parallel_size": 2, "startup_timeout_sec": 120},
    }
    R.train(RlSettings(**settings), [sft / "checkpoint.json", tmp_path / "tasks.parquet"], tmp_path / "rl")
    launches = [json.loads(x) for x in fake_vllm_bin.read_text().splitlines()]
    assert len(launches) == 2  # one server per step, on that step's weights
    assert all(a[0] == "serve" and a[1].endswith("/policy") and "--tensor-parallel-size" in a for a in launches)
    assert all("--uds" in a and "--port" not in a for a in launches)  # a private socket, no TCP port
    log = [json.loads(x) for x in (tmp_path / "rl" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2] and all(r["trajectories"] == 2 and r["errors"] == 0 for r in log)
    assert all(r["assistant_tokens"] > 0 for r in log)  # the served turns were recorded for the update
    # each turn's prompt ids are the server's (otbuild serve gives them as vLLM does), as rendered here
    assert [r["prompt_mismatch_turns"] for r in log] == [0, 0]
    # the rollouts' requests and tokens per step (max_episodes 1: a request per trial), in the stage's usage
    assert all(
        r["rollout_requests"] == 2
        and r["rollout_errors"] == 0
        and r["rollout_input_tokens"] > 0
        and 0 < r["rollout_output_tokens"] <= 2 * 8
        for r in log
    )
    from otbuild.usage import of_log

    assert of_log(tmp_path / "rl" / "train_log.jsonl", "vllm:policy")["vllm:policy"]["requests"] == 4
    policies = {a[1] for a in launches}  # each step's own dir: other servers may be running
    assert not [p for p in psutil.process_iter(["cmdline"]) if policies & set(p.info["cmdline"] or [])]


def test_an_infrastructure_failure_is_masked_in_the_step(tmp_path, monkeypatch):
    """A rollout that ended in an infrastructure error (docs/failures.md) is reward 0 in the
    log and counted there, but no sequence of it reaches the loss and its 0 is not in the
    task's baseline; a task failure (the agent's own end) stays a 0 in the baseline."""
    import otbuild.train.rl.trainer as R
    from otbuild.engines.tiny import make_tiny_model
    from otbuild.tasks.table import TaskRecord, write_tasks
    from otbuild.train.chat import QWEN3_SPECIAL, qwen3_template

    sft = make_tiny_model(
        tmp_path / "sft",
        arch="qwen3",
        chat_template=qwen3_template(),
        special_tokens=QWEN3_SPECIAL,
        texts=[CORRECT, WRONG],
    )
    (sft / "checkpoint.json").write_text("{}")
    write_tasks(tmp_path / "tasks.parquet", [TaskRecord(_toy_task(), runnable_locally=True)], source="toy")
    # rewards 1, 0 (wrong answer), 0 (context window: task_failure), 0 (SandboxError: masked)
    ends = [
        (1.0, None, "passed"),
        (0.0, None, "failed"),
        (0.0, None, "task_failure"),
        (0.0, "SandboxError", "infrastructure"),
    ]

    async def rollout(policy, trials, *a, **kw):
        return [
            R.Trajectory(0, r, err, out, [Turn([1, 2, 3], [10 + i, 20 + i])]) for i, (r, err, out) in enumerate(ends)
        ]

    seen = []
    real_update = R.update

    def update(engine, seqs, *a, **kw):
        seen.append([(s.ids[3], s.advantage) for s in seqs])
        return real_update(engine, seqs, *a, **kw)

    monkeypatch.setattr(R, "rollout", rollout)
    monkeypatch.setattr(R, "update", update)
    settings = {
        "steps": 1,
        "batch_size": 1,
        "samples_per_task": 4,
        "max_tokens": 8,
        "max_context": 4096,
        "sandbox": {"max_episodes": 1},
    }
    R.train(RlSettings(**settings), [sft / "checkpoint.json", tmp_path / "tasks.parquet"], tmp_path / "rl")
    want = rloo_advantages([1.0, 0.0, 0.0])
    assert seen == [[(10, want[0]), (11, want[1]), (12, want[2])]]  # sample 3 (token 13) is not there
    log = json.loads((tmp_path / "rl" / "train_log.jsonl").read_text())
    assert (log["rollout_infra_masked"], log["errors"], log["trajectories"]) == (1, 1, 4)
    assert log["reward_mean"] == 0.25 and log["assistant_tokens"] == 6  # the masked tokens are not counted


# OpenThoughts-Agent's RL config for the paper's run (open-thoughts/OpenThoughts-Agent,
# hpc/skyrl_yaml/ALCC_ZIH/): its values, as the paper recipe's rl section must say them
OT_AGENT_RL = (
    "24GPU_base.yaml",
    {
        "steps": 80,
        "batch_size": 64,
        "samples_per_task": 8,
        "learning_rate": 5e-6,
        "adam_betas": (0.9, 0.999),
        "weight_decay": 0.0,
        "clip_low": 0.2,
        "clip_high": 0.2,
        "kl_coef": 0.0,
        "ppo_epochs": 1,
        "temperature": 0.7,
        "max_tokens": 4096,
        "max_context": 32768,
        "concurrency": 300,
    },
)


def test_the_paper_recipe_runs_rl_with_openthoughts_agents_settings():
    from otbuild.plan import plan_recipe
    from otbuild.recipe.load import load_recipe
    from tests.conftest import REPO

    config, settings = OT_AGENT_RL
    rl = next(n for n in plan_recipe(load_recipe("otagent_v2_100k", REPO)).nodes if n.stage == "rl").config
    assert {k: getattr(rl, k) for k in settings} == settings
    assert (rl.sandbox.agent_timeout_sec, rl.sandbox.max_episodes) == (1800, 10000)  # no turn limit there
    text = (REPO / "recipes" / "otagent_v2_100k.yaml").read_text()
    assert config in text  # each value names where it comes from
    for key in (
        "max_steps: 80",
        "train_batch_size: 64",
        "n_samples_per_prompt: 8",
        "lr: 5e-6",
        "n_concurrent_trials: 300",
        "max_staleness_steps: 16",
        "override_timeout_sec: 1800",
    ):
        assert key in text, key


@pytest.mark.slow
def test_rl_update_on_two_ranks_is_the_update_on_one(tmp_path):
    """Data parallel RLOO: two ranks (torchrun, DeepSpeed on gloo), each with half of a step's
    sequences and a different number of micro-batches, make the update one process makes
    with all of them: same gradient norm, same weights."""
    import torch

    from otbuild.engines.tiny import make_tiny_model
    from otbuild.train.model import load_model
    from tests.support import rl_update_ranks

    model = make_tiny_model(tmp_path / "model", vocab_size=320)
    out = {1: tmp_path / "world1.pt", 2: tmp_path / "world2.pt"}
    rl_update_ranks.main(str(model), str(out[1]))  # one process: this one
    subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            rl_update_ranks.__file__,
            str(model),
            str(out[2]),
        ],
        check=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        timeout=300,
    )
    one, two = (torch.load(out[w], weights_only=False) for w in (1, 2))
    # DeepSpeed's global norm (ZeRO-2) shows a wrong scaling of the ranks' gradients, the
    # weights (Adam: scale-free) a wrong share of them
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4)
    for k, w in one["weights"].items():
        torch.testing.assert_close(two["weights"][k], w, rtol=1e-4, atol=1e-5)  # lr 1e-2
    before = load_model(model).state_dict()
    assert any(not torch.equal(before[k], w) for k, w in one["weights"].items())  # it did update


@pytest.mark.slow
@needs_sandbox
def test_rollouts_run_ahead_of_the_update_up_to_max_staleness(tmp_path):
    """max_staleness 0 is the synchronous loop, repeatable run to run, its log as before (no
    staleness keys). With 1, each step after the first trains on trajectories sampled by the
    weights one update old (their sequences corrected against the log-probs that sampled
    them), and the same steps are taken; the wall time side by side: bench/rl.py."""
    from otbuild.engines.tiny import make_tiny_model
    from otbuild.tasks.table import TaskRecord, write_tasks
    from otbuild.train.chat import QWEN3_SPECIAL, qwen3_template
    from otbuild.train.rl.trainer import train

    sft = make_tiny_model(
        tmp_path / "sft",
        arch="qwen3",
        chat_template=qwen3_template(),
        special_tokens=QWEN3_SPECIAL,
        texts=[CORRECT, WRONG, "Write the word"],
    )
    (sft / "checkpoint.json").write_text("{}")
    write_tasks(tmp_path / "tasks.parquet", [TaskRecord(_toy_task(), runnable_locally=True)], source="toy")
    settings = {
        "steps": 3,
        "batch_size": 1,
        "samples_per_task": 2,
        "max_tokens": 8,
        "max_context": 4096,
        "temperature": 1.0,
        "learning_rate": 1e-2,
        "sandbox": {"max_episodes": 1},
    }
    timing = {"rollout_seconds", "update_seconds", "tokens_per_second"}

    def run(name: str, **extra) -> list[dict]:
        train(RlSettings(**settings, **extra), [sft / "checkpoint.json", tmp_path / "tasks.parquet"], tmp_path / name)
        return [
            {k: v for k, v in json.loads(x).items() if k not in timing}
            for x in (tmp_path / name / "train_log.jsonl").read_text().splitlines()
        ]

    sync, again, ahead = run("sync"), run("again"), run("ahead", max_staleness=1)
    assert sync == again and not any("staleness" in r for r in sync)
    assert [r["step"] for r in ahead] == [1, 2, 3] and all(r["trajectories"] == 2 for r in ahead)
    assert [(r["weight_versions"], r["staleness"]) for r in ahead] == [([0], 0), ([0], 1), ([1], 1)]
    assert ahead[0]["off_policy_sequences"] == 0 and all(r["off_policy_sequences"] >= 2 for r in ahead[1:])
    assert ahead[0]["loss"] == sync[0]["loss"]  # the first step is on-policy either way


@needs_sandbox
def test_rl_rollouts_offer_the_tools_protocols_tools_and_train_on_what_was_rendered(tmp_path, monkeypatch):
    """harness.protocol: tools in RL: the policy's prompts hold the offered tools as its chat
    template renders them (Qwen3's <tools> block), and the step trains on those tokens."""
    import otbuild.train.rl.trainer as R
    from otbuild.engines.tiny import make_tiny_model
    from otbuild.tasks.table import TaskRecord, write_tasks
    from otbuild.train.chat import QWEN3_SPECIAL, qwen3_template
    from otbuild.train.model import load_tokenizer

    sft = make_tiny_model(
        tmp_path / "sft",
        arch="qwen3",
        chat_template=qwen3_template(),
        special_tokens=QWEN3_SPECIAL,
        texts=[CORRECT, WRONG, "<tools> bash task_complete </tools>"],
    )
    (sft / "checkpoint.json").write_text("{}")
    write_tasks(tmp_path / "tasks.parquet", [TaskRecord(_toy_task(), runnable_locally=True)], source="toy")
    seen = []
    real_update = R.update

    def update(engine, seqs, *a, **kw):
        seen.extend(seqs)
        return real_update(engine, seqs, *a, **kw)

    monkeypatch.setattr(R, "update", update)
    settings = {
        "steps": 1,
        "batch_size": 1,
        "samples_per_task": 2,
        "max_tokens": 8,
        "max_context": 4096,
        "temperature": 1.0,
        "protocol": "tools",
        "sandbox": {"max_episodes": 1},
    }
    R.train(RlSettings(**settings), [sft / "checkpoint.json", tmp_path / "tasks.parquet"], tmp_path / "rl")
    log = json.loads((tmp_path / "rl" / "train_log.jsonl").read_text())
    assert log["trajectories"] == 2 and log["errors"] == 0, log
    tok, _ = load_tokenizer(sft)
    prompts = [tok.decode(s.ids) for s in seen]
    assert prompts and all('"name": "bash"' in p and "<tools>" in p for p in prompts), prompts[:1]
