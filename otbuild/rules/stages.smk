# Every stage but the report, from the stage registry (otbuild/stages/__init__.py): each rule is
# one `otbuild stage NAME --spec JSON` call for a node, found by its id. A sharded stage
# (augment, task_score, rollout, eval: an LLM or trials) runs as one job per shard (they resume
# from their partial files), named after the stage, then a merge job `NAME_merge`; profiles
# size the jobs by these names (profiles/slurm: GPU partitions for the stages that serve a model
# or train). A training stage's checkpoint files are declared one by one (not as a directory),
# so Snakemake's clean-up of a failed job leaves checkpoints/ in place and the rerun resumes.
# A search's decision is a checkpoint of its own (rules/search.smk).
from otbuild.stages import STAGES

for _stage in (s.name for s in STAGES.values() if s.name != "report" and not s.checkpoint):
    if STAGES[_stage].sharded:

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
            shell:
                stage_shell()
