"""otbuild's SkyRL handoff, read by SkyRL's own code: run by .venv-skyrl's python (the pinned
SkyRL and its Harbor integration, scripts/skyrl-env.sh; tests/contracts/test_skyrl.py feeds it and
reads its answer). No GPU, no Ray cluster.

stdin (JSON): {"src": SkyRL's source tree (its examples/), "runs": [{"name", "args": the command's
`key=value` overrides}], "tasks_dir": otbuild's task set, "parquet": otbuild's task table, "scratch"}.
Each run goes through the fully async Harbor entry point's own `main()` up to the point where it
starts Ray (HarborSkyRLConfig.from_cli_overrides, the Harbor trial defaults merged, validate_cfg,
its max_seq_len check); `initialize_ray` is where it stops. Two stand-ins, neither in the checked
path: the Harbor generator module (it imports Harbor, which needs Python 3.12, and litellm; it runs
trials, not config), and typing_extensions' TypedDict for typing's (SkyRL's tinker types need 3.12's
under pydantic; the CPU torch set-up installs is 3.11's).
The task set is read by HarborTaskDataset (what the entry point trains on) and the table by
prepare_harbor_dataset.extract_parquet (SkyRL's reader of `path` + `task_binary` parquets).
With "rollout_details" (otbuild's `export rollout-details` JSONL) and "rewards" ({trial name:
reward}), each line's `agent_result.rollout_details` goes through the Harbor generator's own
`build_step_wise_generator_output` (how SkyRL turns a Harbor trial into training steps): that
module, real this time, with Harbor's and litellm's names standing in (it uses RolloutDetail
as a type only; Trial and TrialConfig run trials, not this).
Writes to the file named by its only argument {"skyrl": version, "runs": {name: {"error", "config"}},
"dataset": {"dir": [...], "parquet": [...], "extracted": n}, "steps": {"error", "output":
GeneratorOutput's per-step lists}}: each item's task name and instruction.
"""

import json
import sys
import traceback
import types
import typing
from dataclasses import asdict
from importlib.metadata import version
from pathlib import Path

import typing_extensions

typing.TypedDict = typing_extensions.TypedDict
HARBOR = "examples.train_integrations.harbor"


class Stop(Exception):
    """Raised where the entry point would start Ray: its config is complete."""


def entry_point(src: str):
    sys.path.insert(0, src)
    stub = types.ModuleType(f"{HARBOR}.harbor_generator")
    stub.HarborGenerator = object
    sys.modules[stub.__name__] = stub
    import importlib

    return importlib.import_module(f"{HARBOR}.entrypoints.main_harbor_fully_async")


def load(main, args: list[str]) -> dict:
    def stop(cfg):
        raise Stop(cfg)

    main.initialize_ray = stop
    sys.argv = ["main_harbor_fully_async", *args]
    try:
        main.main()
    except Stop as s:
        return asdict(s.args[0])
    raise AssertionError("the entry point returned before starting Ray")


def items(dataset) -> list[dict]:
    return [
        {"name": Path(i["prompt"]).name, "instruction": (Path(i["prompt"]) / "instruction.md").read_text()}
        for i in dataset
    ]


def main(out: str) -> None:
    given = json.load(sys.stdin)
    answer = {"skyrl": version("skyrl"), "runs": {}}
    module = entry_point(given["src"])
    for run in given["runs"]:
        try:
            answer["runs"][run["name"]] = {"error": None, "config": load(module, run["args"])}
        except (Exception, SystemExit) as e:  # noqa: BLE001  (any refusal is the finding)
            answer["runs"][run["name"]] = {
                "error": f"{type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}",
                "config": None,
            }
    from examples.train_integrations.harbor.dataset import HarborTaskDataset
    from examples.train_integrations.harbor.prepare_harbor_dataset import extract_parquet

    extracted = extract_parquet(Path(given["parquet"]), Path(given["scratch"]))
    answer["dataset"] = {
        "dir": items(HarborTaskDataset([given["tasks_dir"]])),
        "parquet": items(HarborTaskDataset([given["scratch"]])),
        "extracted": extracted,
    }
    if given.get("rollout_details"):
        answer["steps"] = step_wise(given["rollout_details"], given["rewards"])
    Path(out).write_text(json.dumps(answer, default=str))


def step_wise(path: str, rewards: dict) -> dict:
    """SkyRL's training steps from otbuild's rollout-details export (one trajectory per line)."""
    for name in ("harbor", "harbor.models", "harbor.models.agent", "harbor.models.trial", "harbor.trial"):
        sys.modules.setdefault(name, types.ModuleType(name))
    names = {
        "litellm": {"suppress_debug_info": False, "set_verbose": False},
        "harbor.models.agent.rollout_detail": {"RolloutDetail": dict},
        "harbor.models.trial.config": {"TrialConfig": object},
        "harbor.trial.trial": {"Trial": object},
    }
    for name, attrs in names.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        sys.modules[name] = module
    sys.modules.pop(f"{HARBOR}.harbor_generator", None)  # the entry point's stand-in
    import importlib

    from skyrl.train.generators.base import TrajectoryID

    generator = importlib.import_module(f"{HARBOR}.harbor_generator")
    trajectories = []
    for line in Path(path).read_text().splitlines():
        data = json.loads(line)
        details = data["agent_result"]["rollout_details"]
        trajectories.append(
            generator.HarborTrajectoryOutput(
                trajectory_id=TrajectoryID(instance_id=data["trial_name"], repetition_id=0),
                rollout_details=details,
                reward=rewards[data["trial_name"]],
                num_turns=len(details[0]["completion_token_ids"]) if details else 0,
            )
        )
    try:
        output = generator.build_step_wise_generator_output(trajectories, overlong_filtering=False)
    except Exception as e:  # noqa: BLE001  (a refusal is the finding)
        return {"error": f"{type(e).__name__}: {e}", "output": None}
    keys = ("prompt_token_ids", "response_ids", "rewards", "loss_masks", "rollout_logprobs", "is_last_step")
    return {"error": None, "output": {k: output[k] for k in keys}}


if __name__ == "__main__":
    main(sys.argv[1])
