# otbuild: every recipes/NAME.yaml becomes a target `NAME` (snakemake smoke); a recipe file elsewhere
# becomes one with `--config otbuild_recipe=PATH` (what `otbuild build PATH` passes).
# Artifacts are content-addressed (artifacts/<stage>/<id>/); results/<recipe>/ is the human view.
# Rules are thin shell calls into `otbuild stage ...`; the logic lives in the otbuild package.
from pathlib import Path

from otbuild.recovery import recover, remove_dead_trial_containers
from otbuild.workflow import RECIPE_KEY, Workflow

recover(Path.cwd())  # after a killed run: stale locks, markers of jobs that did finish
remove_dead_trial_containers()  # and the podman trial containers it left running
WF = Workflow.load_or_exit(Path.cwd())
WF.add_outside_recipe(config.get(RECIPE_KEY))  # a recipe file elsewhere, from `otbuild build PATH`

wildcard_constraints:
    id="[0-9a-f]{16}",
    shard="[0-9]+",
    shards="[0-9]+",


include: "rules/common.smk"
include: "rules/tasks.smk"
include: "rules/rollouts.smk"
include: "rules/train.smk"
include: "rules/eval.smk"
include: "rules/report.smk"
include: "rules/results.smk"
