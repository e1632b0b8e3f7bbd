"""otbuild's SkyRL handoff (`rl.trainer: skyrl`) against the real SkyRL: the pinned release
(pyproject's `skyrl` extra) and its Harbor integration at the same tag, in .venv-skyrl
(scripts/skyrl-env.sh, `make skyrl-env`), take what otbuild/train/skyrl.py writes through their
own code (tests/support/skyrl_contract.py): the fully async Harbor entry point builds and validates its
config from the command's overrides, HarborTaskDataset reads the task set, SkyRL's parquet
extractor reads the task table, and the Harbor generator's step-wise builder turns otbuild's
rollout-details export (calls.parquet as Harbor's RolloutDetail) into its training steps. A
misspelt key and a bad value are refused, so the check can fail. No GPU needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from otbuild.harbor.rollout_detail import write_rollout_details
from otbuild.settings.train import Rl
from otbuild.stagekit.calls import CALL_SCHEMA, write_calls
from otbuild.tasks.table import write_tasks
from otbuild.train.skyrl import cli_args, placement, write_handoff
from tests.conftest import REPO, make_task, pinned_release, tool_answer

SKYRL_PYTHON = REPO / ".venv-skyrl" / "bin" / "python"
SKYRL_SRC = REPO / ".venv-skyrl" / "skyrl-src"
needs_skyrl = pytest.mark.skipif(
    not SKYRL_PYTHON.is_file() or not (SKYRL_SRC / "examples").is_dir(),
    reason="SkyRL and its Harbor integration are not in .venv-skyrl: run scripts/skyrl-env.sh (make skyrl-env)",
)
N_TASKS = 70  # more than the paper's batch of 64
SMOKE = {
    "steps": 2,
    "batch_size": 2,
    "samples_per_task": 2,
    "max_tokens": 128,
    "max_context": 4096,
    "learning_rate": 1e-4,
    "sandbox": {"max_episodes": 3},
}


def test_the_skyrl_extra_pins_one_release():
    assert pinned_release("skyrl").count(".") == 2


def test_placement_splits_as_ot_agent():
    assert placement(4, 6) == {"policy_num_nodes": 2, "policy_num_gpus_per_node": 4, "engines": 16}  # 24 GPUs
    assert placement(8, 1) == {"policy_num_nodes": 1, "policy_num_gpus_per_node": 2, "engines": 6}
    with pytest.raises(ValueError, match="too few"):
        placement(1, 1)


def test_the_trainer_setting_defaults_to_otbuild():
    assert Rl(steps=1).trainer == "otbuild"


@pytest.fixture(scope="module")
def handoff(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("skyrl")
    tasks = tmp / "tasks.parquet"
    records = [make_task(f"t{i}", f"Write {i} to /app/out.txt — é") for i in range(N_TASKS)]
    records.append(make_task("t0", "an upsampled copy"))  # a mix repeats a task's path
    write_tasks(tasks, records, source="synth")
    runs = {
        "smoke": write_handoff(Rl(**SMOKE), tasks, "/models/sft", tmp / "smoke", 1, 2),
        "paper": write_handoff(Rl(steps=80, concurrency=300), tasks, "/models/sft", tmp / "paper", 4, 6),
    }
    return tmp, tasks, runs


def _contract(tmp, tasks, tasks_dir, runs: dict, **rollouts) -> dict:
    given = {
        "src": str(SKYRL_SRC),
        "runs": [{"name": n, "args": a} for n, a in runs.items()],
        "tasks_dir": str(tasks_dir),
        "parquet": str(tasks),
        "scratch": str(tmp / f"extract-{len(runs)}"),
        **rollouts,
    }
    return tool_answer(SKYRL_PYTHON, "skyrl_contract.py", given, tmp / f"answer-{len(runs)}.json", timeout=300)


# two trials' captured calls (a server's prompt and answer ids, its log-probs): a two-turn
# trajectory whose second prompt extends the first, and a one-turn one
TURNS = {
    "t0__a": [([1, 2, 3], [7, 8], [-0.5, -0.25]), ([1, 2, 3, 7, 8, 4], [9, 10, 11], [-1.0, -0.125, -2.0])],
    "t1__b": [([5, 6], [12], [-0.75])],
}
REWARDS = {"t0__a": 1.0, "t1__b": 0.0}


@pytest.fixture(scope="module")
def rollout_details(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("rd")
    rows = [
        {
            **dict.fromkeys(CALL_SCHEMA.names),
            "trial": t,
            "trial_name": name,
            "scope": f"{t}-0",
            "call_idx": i,
            "status": 200,
            "prompt_token_ids": prompt,
            "completion_token_ids": answer,
            "logprobs": logprobs,
        }
        for t, (name, turns) in enumerate(TURNS.items())
        for i, (prompt, answer, logprobs) in enumerate(turns)
    ]
    write_calls(tmp / "calls.parquet", rows)
    write_rollout_details(tmp / "calls.parquet", tmp / "rollout_details.jsonl")
    return tmp / "rollout_details.jsonl"


@pytest.fixture(scope="module")
def contract(handoff, rollout_details):
    tmp, tasks, runs = handoff
    return _contract(
        tmp,
        tasks,
        runs["smoke"]["tasks_dir"],
        {n: h["args"] for n, h in runs.items()},
        rollout_details=str(rollout_details),
        rewards=REWARDS,
    )


@needs_skyrl
def test_skyrl_builds_and_validates_the_config(handoff, contract):
    _, _, runs = handoff
    assert contract["skyrl"] == pinned_release("skyrl")
    for name, h in runs.items():
        run = contract["runs"][name]
        assert run["error"] is None, f"{name}: {run['error']}"
        cfg, rl = run["config"], Rl(**SMOKE) if name == "smoke" else Rl(steps=80)
        t, alg, gen = cfg["trainer"], cfg["trainer"]["algorithm"], cfg["generator"]
        batch = rl.batch_size
        assert (
            alg["advantage_estimator"],
            alg["eps_clip_low"],
            alg["eps_clip_high"],
            alg["use_kl_loss"],
            alg["loss_reduction"],
            alg["max_seq_len"],
        ) == ("rloo", 0.2, 0.2, False, "token_mean", rl.max_context)
        assert (
            t["max_training_steps"],
            t["train_batch_size"],
            t["policy_mini_batch_size"],
            gen["n_samples_per_prompt"],
        ) == (rl.steps, batch, batch, rl.samples_per_task)
        opt = t["policy"]["optimizer_config"]
        assert (opt["lr"], opt["weight_decay"], opt["max_grad_norm"], list(opt["adam_betas"])) == (
            rl.learning_rate,
            0.0,
            1.0,
            [0.9, 0.999],
        )
        assert (gen["sampling_params"]["temperature"], gen["sampling_params"]["max_generate_length"]) == (
            0.7,
            rl.max_tokens,
        )
        assert gen["inference_engine"]["engine_init_kwargs"]["max_model_len"] == rl.max_context
        assert t["strategy"] == "fsdp" and t["fully_async"]["enabled"] and t["fully_async"]["max_staleness_steps"] == 16
        assert cfg["data"]["train_data"] == [h["tasks_dir"]] and t["policy"]["model"]["path"] == "/models/sft"
        # the Harbor trial config: SkyRL's defaults under otbuild's settings
        trial = cfg["harbor_trial_config"]
        assert (
            trial["agent"]["name"] == "terminus-2" and trial["agent"]["kwargs"]["max_turns"] == rl.sandbox.max_episodes
        )
        assert trial["agent"]["kwargs"]["temperature"] == 0.7 and trial["environment"]["type"] == "docker"
        assert trial["agent"]["kwargs"]["collect_rollout_details"] is True  # SkyRL's default kept
    paper = contract["runs"]["paper"]["config"]
    assert (
        paper["trainer"]["placement"]["policy_num_nodes"] == 2
        and paper["generator"]["inference_engine"]["num_engines"] == 16
    )
    assert paper["generator"]["rate_limit"]["max_concurrency"] == 300
    assert paper["trainer"]["fully_async"]["num_parallel_generation_workers"] == 768


@needs_skyrl
def test_skyrl_reads_the_task_set(handoff, contract):
    _, _, runs = handoff
    ds = contract["dataset"]
    ours = sorted(p.name for p in Path(runs["smoke"]["tasks_dir"]).iterdir())
    assert sorted(i["name"] for i in ds["dir"]) == ours == sorted([*(f"t{i}" for i in range(N_TASKS)), "t0-2"])
    by_name = {i["name"]: i["instruction"] for i in ds["dir"]}
    assert by_name["t1"] == "Write 1 to /app/out.txt — é" and by_name["t0-2"] == "an upsampled copy"
    # SkyRL's own extractor reads otbuild's table: one dir per path (a repeated path is kept once:
    # its rows are unpacked by parallel processes, so which copy of t0 lands there is a race)
    extracted = {i["name"]: i["instruction"] for i in ds["parquet"]}
    assert ds["extracted"] == N_TASKS + 1 and extracted.pop("t0") in (by_name["t0"], by_name["t0-2"])
    assert extracted == {k: v for k, v in by_name.items() if k not in ("t0", "t0-2")}


@needs_skyrl
def test_skyrl_trains_on_the_rollout_details_export(contract):
    """SkyRL's Harbor generator takes each exported turn as one training step: the prompt and
    answer ids and log-probs the server gave, the reward on the trajectory's last step."""
    steps = contract["steps"]
    assert steps["error"] is None, steps["error"]
    out = steps["output"]
    turns = [turn for name in TURNS for turn in TURNS[name]]
    assert out["prompt_token_ids"] == [p for p, _, _ in turns]
    assert out["response_ids"] == [a for _, a, _ in turns]
    assert out["rollout_logprobs"] == [lp for _, _, lp in turns]
    assert out["loss_masks"] == [[1] * len(a) for _, a, _ in turns]
    assert out["rewards"] == [0.0, 1.0, 0.0] and out["is_last_step"] == [False, True, True]


@needs_skyrl
def test_skyrl_refuses_drift(handoff):
    """Proof the check can fail: a misspelt key and an estimator SkyRL does not have."""
    tmp, tasks, runs = handoff
    args = runs["smoke"]["args"]
    typo = [a.replace("trainer.max_training_steps=", "trainer.max_train_steps=") for a in args]
    estimator = [*args, *cli_args({"trainer.algorithm.advantage_estimator": "rloo_n"})]
    got = _contract(tmp, tasks, runs["smoke"]["tasks_dir"], {"typo": typo, "estimator": estimator})["runs"]
    assert "max_train_steps" in got["typo"]["error"]
    assert "rloo_n" in got["estimator"]["error"]


def test_without_gpus_the_stage_fails_naming_what_is_missing(handoff, tmp_path, monkeypatch):
    import sys

    from otbuild.errors import StageError
    from otbuild.train.skyrl import train

    _, tasks, _ = handoff
    monkeypatch.setenv("OTBUILD_SKYRL_PYTHON", sys.executable)
    monkeypatch.setenv("OTBUILD_SKYRL_SRC", str(tmp_path / "no-skyrl"))
    with pytest.raises(StageError, match=r"rl.trainer: skyrl .*missing here: SkyRL's Harbor entry point.*a CUDA GPU"):
        train(Rl(**SMOKE), [tmp_path / "sft" / "checkpoint.json", tasks], tmp_path / "out")
    assert not (tmp_path / "out" / "checkpoint.json").exists()
