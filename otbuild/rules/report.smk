# Report: a self-contained HTML page and a dataset card per recipe (otbuild/report/), flagged
# with report() so `snakemake --report report.html NAME` carries them with their captions
# (category Results, beside the results' manifest.json: results.smk).


rule report:
    input:
        stage_inputs("report"),
    output:
        **stage_outputs("report"),
    params:
        spec=stage_spec("report"),
        stage="report",
        recipe=report_recipe,
    benchmark:
        stage_benchmark("report"),
    log:
        "logs/report/{id}.log",
    localrule: True
    shell:
        stage_shell()
