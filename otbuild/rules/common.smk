# Helpers shared by the rules: outputs, inputs and the spec of a node, looked up by id; what
# `snakemake --report` shows (report(): captions, categories).
import mimetypes

from otbuild.progress import LOG_ENV
from otbuild.artifact import PROVENANCE
from otbuild.report import CAPTIONS
from otbuild.stagekit import RESULTS
from otbuild.stages import STAGES
from otbuild.workflow import OTBUILD

# parquet results are offered for download in Snakemake's report, never shown as text
mimetypes.add_type("application/vnd.apache.parquet", ".parquet")


def stage_outputs(stage):
    """Every file of the artifact dir, the provenance record included (written last); those the
    registry says (`reported`) flagged for Snakemake's report."""
    reported = dict(STAGES[stage].reported)
    files = {}
    for o in STAGES[stage].outputs:
        path = f"artifacts/{stage}/{{id}}/{o}"
        files[o.split(".")[0]] = reported_output(stage, o, path, reported[o]) if o in reported else path
    return {**files, "provenance": f"artifacts/{stage}/{{id}}/{PROVENANCE}"}


def reported_output(stage, name, path, category):
    """`path` flagged for Snakemake's report with its caption (captions/STAGE.NAME.rst): the
    results under the recipe's name, evaluation and training under the artifact's label."""
    if category == RESULTS:
        sub = lambda wc: WF.node(stage, wc.id).config.recipe
        labels = lambda wc: {"recipe": sub(wc), "file": name}
    else:
        sub = lambda wc: WF.node(stage, wc.id).label
        labels = lambda wc: {"artifact": WF.node(stage, wc.id).label, "file": name}
    caption = str(CAPTIONS / f"{stage}.{name.split('.')[0]}.rst")
    return report(path, caption=caption, category=category, subcategory=sub, labels=labels)


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
    return f"{LOG_ENV}={{log}} {OTBUILD} stage {{params.stage}} --spec {{params.spec}} > {{log}} 2>&1"


def shard_output(stage):
    """Shard K of N of a sharded stage (one job each; the merge job reads them all)."""
    return f"artifacts/{stage}/{{id}}/shards/{{shard}}-of-{{shards}}.parquet"


def shard_log(stage):
    return f"logs/{stage}/{{id}}/{{shard}}-of-{{shards}}.log"


def shard_shell():
    return stage_shell().replace(" > {log}", " --shard {wildcards.shard} > {log}")


def merge_inputs(stage):
    return lambda wc: WF.shard_inputs(stage, wc.id)


def decided(node):
    """A pending search step's decision (`node`, of a checkpoint stage): raises until it is
    built, and Snakemake asks again (otbuild/workflow.py: Workflow.settled_files)."""
    return getattr(checkpoints, node.stage).get(id=node.id)


def manifest_inputs(wc):
    """What results/RECIPE/manifest.json is made from: every artifact file and record of the
    recipe (the target rule refreshes the recipe file's sha256 in it on every build)."""
    return WF.settled_files(wc.recipe, decided)
