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
Writes to the file named by its only argument {"skyrl": version, "runs": {name: {"error", "config"}},
"dataset": {"dir": [...], "parquet": [...], "extracted": n}}: each item's task name and instruction.
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
    Path(out).write_text(json.dumps(answer, default=str))


if __name__ == "__main__":
    main(sys.argv[1])
