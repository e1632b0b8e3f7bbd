# Helpers shared by the stage rules: outputs, inputs and the spec of a node, looked up by id.
from otbuild.progress import LOG_ENV
from otbuild.artifact import PROVENANCE
from otbuild.stages import STAGES
from otbuild.workflow import OTBUILD


def stage_outputs(stage):
    """Every file of the artifact dir, the provenance record included (written last)."""
    files = {o.split(".")[0]: f"artifacts/{stage}/{{id}}/{o}" for o in STAGES[stage].outputs}
    return {**files, "provenance": f"artifacts/{stage}/{{id}}/{PROVENANCE}"}


def stage_inputs(stage):
    return lambda wc: [str(n.main_output) for n in WF.node(stage, wc.id).inputs]


def stage_spec(stage):
    return lambda wc: WF.spec_arg(stage, wc.id)


def stage_benchmark(stage):
    """Runtime and peak memory of a stage's job (Snakemake's benchmark; the report reads them)."""
    return f"benchmarks/{stage}/{{id}}.tsv"


def shard_benchmark(stage):
    return f"benchmarks/{stage}/{{id}}/{{shard}}-of-{{shards}}.tsv"


def merge_benchmark(stage):
    return f"benchmarks/{stage}/{{id}}/merge.tsv"


def stage_shell():
    """The job: `otbuild stage`, its output in its log, which it is told (OTBUILD_LOG) so that a
    long job can show its progress on the run's console (otbuild/progress.py). The stage comes
    from the rule's `params.stage`: a shell command is formatted when the job runs, after the
    loop that made the rules has moved on."""
    return f"{LOG_ENV}={{log}} " + OTBUILD + " stage {params.stage} --spec {params.spec} > {log} 2>&1"


def shard_output(stage):
    """Shard K of N of a sharded stage (one job each; the merge job reads them all)."""
    return f"artifacts/{stage}/{{id}}/shards/{{shard}}-of-{{shards}}.parquet"


def shard_log(stage):
    return f"logs/{stage}/{{id}}/{{shard}}-of-{{shards}}.log"


def shard_shell():
    return stage_shell().replace(" > {log}", " --shard {wildcards.shard} > {log}")


def merge_inputs(stage):
    return lambda wc: WF.shard_inputs(stage, wc.id)
