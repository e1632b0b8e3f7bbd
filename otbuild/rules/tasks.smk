# Task stages: sources -> mix -> augment -> task_score -> task_filter. DuckDB and adapters on
# the CPU; augment and task_score call an LLM engine (a vLLM server on a GPU node, or an API).


rule source:
    output:
        **stage_outputs("source"),
    params:
        spec=stage_spec("source"),
    benchmark:
        stage_benchmark("source"),
    log:
        "logs/source/{id}.log",
    shell:
        stage_shell("source")


rule mix:
    input:
        stage_inputs("mix"),
    output:
        **stage_outputs("mix"),
    params:
        spec=stage_spec("mix"),
    benchmark:
        stage_benchmark("mix"),
    log:
        "logs/mix/{id}.log",
    shell:
        stage_shell("mix")


rule task_filter:
    input:
        stage_inputs("task_filter"),
    output:
        **stage_outputs("task_filter"),
    params:
        spec=stage_spec("task_filter"),
    benchmark:
        stage_benchmark("task_filter"),
    log:
        "logs/task_filter/{id}.log",
    shell:
        stage_shell("task_filter")


# LLM surface forms (a vLLM server per shard job): one job per shard (they resume), then a merge.
rule augment:
    input:
        stage_inputs("augment"),
    output:
        shard_output("augment"),
    params:
        spec=stage_spec("augment"),
    benchmark:
        shard_benchmark("augment"),
    log:
        shard_log("augment"),
    shell:
        shard_shell("augment")


rule augment_merge:
    input:
        merge_inputs("augment"),
    output:
        **stage_outputs("augment"),
    params:
        spec=stage_spec("augment"),
    benchmark:
        merge_benchmark("augment"),
    log:
        "logs/augment/{id}/merge.log",
    shell:
        stage_shell("augment")


# LLM scores (a hosted API or a vLLM server per shard job): one job per shard (they resume), then a merge.
rule task_score:
    input:
        stage_inputs("task_score"),
    output:
        shard_output("task_score"),
    params:
        spec=stage_spec("task_score"),
    benchmark:
        shard_benchmark("task_score"),
    log:
        shard_log("task_score"),
    shell:
        shard_shell("task_score")


rule task_score_merge:
    input:
        merge_inputs("task_score"),
    output:
        **stage_outputs("task_score"),
    params:
        spec=stage_spec("task_score"),
    benchmark:
        merge_benchmark("task_score"),
    log:
        "logs/task_score/{id}/merge.log",
    shell:
        stage_shell("task_score")
