# Every stage, from the stage registry (otbuild/stages/__init__.py): each rule is one
# `otbuild stage NAME --spec JSON` call for a node, found by its id. A sharded stage
# (augment, task_score, rollout, eval: an LLM or trials) runs as one job per shard (they resume
# from their partial files), named after the stage, then a merge job `NAME_merge`; profiles
# size the jobs by these names (profiles/slurm: GPU partitions for the stages that serve a model
# or train). A training stage's checkpoint files are declared one by one (not as a directory),
# so Snakemake's clean-up of a failed job leaves checkpoints/ in place and the rerun resumes.
# A stage whose output decides what is planned next (`checkpoint`: a search's decision,
# docs/search.md) is a Snakemake checkpoint: the plan of a search recipe stops at the first step
# whose decision is not built; its target's input function asks for that decision
# (otbuild/workflow.py), so Snakemake builds the step, decides, and asks again, now with the
# next step planned: one `snakemake NAME` call runs the whole search, and `-n` shows what is
# known yet. A `local` stage (the decision; the report, its page and dataset card flagged with
# report() so `snakemake --report report.html NAME` carries them: rules/common.smk) is cheap and
# runs in Snakemake's own process.
from otbuild.stages import STAGES

for _stage, _d in STAGES.items():
    if _d.sharded:

        rule:
            name:
                _stage
            input:
                stage_inputs(_stage),
            output:
                shard_output(_stage),
            params:
                spec=stage_spec(_stage),
                stage=_stage,
            benchmark:
                shard_benchmark(_stage)
            log:
                shard_log(_stage),
            shell:
                shard_shell()

        rule:
            name:
                f"{_stage}_merge"
            input:
                merge_inputs(_stage),
            output:
                **stage_outputs(_stage),
            params:
                spec=stage_spec(_stage),
                stage=_stage,
            benchmark:
                merge_benchmark(_stage)
            log:
                f"logs/{_stage}/{{id}}/merge.log",
            shell:
                stage_shell()

    elif _d.checkpoint:

        checkpoint:
            name:
                _stage
            input:
                stage_inputs(_stage),
            output:
                **stage_outputs(_stage),
            params:
                spec=stage_spec(_stage),
                stage=_stage,
            benchmark:
                stage_benchmark(_stage)
            log:
                f"logs/{_stage}/{{id}}.log",
            localrule: _d.local
            shell:
                stage_shell()

    else:

        rule:
            name:
                _stage
            input:
                stage_inputs(_stage),
            output:
                **stage_outputs(_stage),
            params:
                spec=stage_spec(_stage),
                stage=_stage,
            benchmark:
                stage_benchmark(_stage)
            log:
                f"logs/{_stage}/{{id}}.log",
            localrule: _d.local
            shell:
                stage_shell()
