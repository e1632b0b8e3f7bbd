# Eval: model x benchmark x repeat in shards (GPU jobs when the model is served by vLLM), then
# a merge that writes scores and their summary; an ablation grid ranks its candidates.


rule eval:
    input:
        stage_inputs("eval"),
    output:
        "artifacts/eval/{id}/shards/{shard}-of-{shards}.parquet",
    params:
        spec=stage_spec("eval"),
    benchmark:
        shard_benchmark("eval"),
    log:
        shard_log("eval"),
    shell:
        shard_shell("eval")


rule eval_merge:
    input:
        lambda wc: WF.shard_inputs("eval", wc.id),
    output:
        **stage_outputs("eval"),
    params:
        spec=stage_spec("eval"),
    benchmark:
        merge_benchmark("eval"),
    log:
        "logs/eval/{id}/merge.log",
    shell:
        stage_shell("eval")


rule rank:
    input:
        stage_inputs("rank"),
    output:
        **stage_outputs("rank"),
    params:
        spec=stage_spec("rank"),
    benchmark:
        stage_benchmark("rank"),
    log:
        "logs/rank/{id}.log",
    shell:
        stage_shell("rank")
