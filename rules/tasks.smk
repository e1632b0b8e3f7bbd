# Task stages: sources -> mix -> task_filter. CPU rules (DuckDB, adapters).


rule source:
    output:
        **stage_outputs("source"),
    params:
        spec=stage_spec("source"),
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
    log:
        "logs/task_filter/{id}.log",
    shell:
        stage_shell("task_filter")
