# Trace stages: teacher rollouts (one GPU job per shard, then a CPU merge) -> trace_filter.


rule rollout:
    input:
        stage_inputs("rollout"),
    output:
        "artifacts/rollout/{id}/shards/{shard}-of-{shards}.parquet",
    params:
        spec=stage_spec("rollout"),
    benchmark:
        shard_benchmark("rollout"),
    log:
        shard_log("rollout"),
    shell:
        shard_shell("rollout")


rule rollout_merge:
    input:
        lambda wc: WF.shard_inputs("rollout", wc.id),
    output:
        **stage_outputs("rollout"),
    params:
        spec=stage_spec("rollout"),
    benchmark:
        merge_benchmark("rollout"),
    log:
        "logs/rollout/{id}/merge.log",
    shell:
        stage_shell("rollout")


rule trace_filter:
    input:
        stage_inputs("trace_filter"),
    output:
        **stage_outputs("trace_filter"),
    params:
        spec=stage_spec("trace_filter"),
    benchmark:
        stage_benchmark("trace_filter"),
    log:
        "logs/trace_filter/{id}.log",
    shell:
        stage_shell("trace_filter")


rule trace_import:
    output:
        **stage_outputs("trace_import"),
    params:
        spec=stage_spec("trace_import"),
    benchmark:
        stage_benchmark("trace_import"),
    log:
        "logs/trace_import/{id}.log",
    shell:
        stage_shell("trace_import")
