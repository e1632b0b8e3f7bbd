# A search's decision (docs/search.md): a Snakemake checkpoint. The plan of a search recipe stops at
# the first stage whose decision is not built; its target's input function asks for that decision
# (otbuild/workflow.py), so Snakemake builds the stage, decides, and asks again, now with the next
# stage planned: one `snakemake NAME` call runs the whole search, and `-n` shows what is known yet.


checkpoint decide:
    input:
        stage_inputs("decide"),
    output:
        **stage_outputs("decide"),
    params:
        spec=stage_spec("decide"),
        stage="decide",
    benchmark:
        stage_benchmark("decide"),
    log:
        "logs/decide/{id}.log",
    localrule: True
    shell:
        stage_shell()
