"""Harbor's own models on both sides of otbuild's rollout-detail import and export: run by
.venv-harbor's python (tests/harbor/test_rollout_detail.py feeds it and reads its answer).

stdin (JSON): {"job": a folder to write a job into, "trials": [{"name", "task", "details":
[RolloutDetail, ...] | null, "steps": {step name: [RolloutDetail, ...]} | absent}],
"export": a rollout-details JSONL otbuild wrote | null}.
Each trial's result.json is a TrialResult built and serialized by Harbor (its `agent_result`
an AgentContext holding the details; a trial with steps has them per StepResult). Each export
line's `agent_result` is validated as Harbor's AgentContext.
Writes to the file named by its only argument {"harbor": version, "exported": [{"trial_name",
"rollout_details" as Harbor's model dumps them, "n_input_tokens", "n_output_tokens"}]}.
"""

import json
import sys
from importlib.metadata import version
from pathlib import Path

from harbor.models.agent.context import AgentContext
from harbor.models.task.id import LocalTaskId
from harbor.models.trial.config import TrialConfig
from harbor.models.trial.result import AgentInfo, ModelInfo, StepResult, TrialResult


def write_trial(job: Path, spec: dict) -> None:
    task = str(job / "tasks" / spec["task"])
    steps = spec.get("steps")
    result = TrialResult(
        task_name=spec["task"],
        trial_name=spec["name"],
        trial_uri=f"file://{job / spec['name']}",
        task_id=LocalTaskId(path=task),
        task_checksum="0" * 64,
        config=TrialConfig(task={"path": task}),
        agent_info=AgentInfo(
            name="terminus-2", version="2.0.0", model_info=ModelInfo(name="policy", provider="openai")
        ),
        agent_result=AgentContext(rollout_details=spec["details"]) if not steps else None,
        step_results=[
            StepResult(step_name=name, agent_result=AgentContext(rollout_details=details))
            for name, details in steps.items()
        ]
        if steps
        else None,
    )
    (job / spec["name"]).mkdir(parents=True)
    (job / spec["name"] / "result.json").write_text(result.model_dump_json(indent=2))


def main(out: str) -> None:
    given = json.load(sys.stdin)
    for spec in given.get("trials") or []:
        write_trial(Path(given["job"]), spec)
    exported = []
    if given.get("export"):
        for line in Path(given["export"]).read_text().splitlines():
            data = json.loads(line)
            context = AgentContext.model_validate(data["agent_result"])
            exported.append({"trial_name": data["trial_name"], **context.model_dump(mode="json", exclude_none=True)})
    Path(out).write_text(json.dumps({"harbor": version("harbor"), "exported": exported}))


if __name__ == "__main__":
    main(sys.argv[1])
