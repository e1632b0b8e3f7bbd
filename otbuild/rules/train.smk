# Training: SFT on the filtered traces, then RLOO from the SFT checkpoint. GPU rules: on Slurm
# the stage launches one process per GPU across the nodes the profile grants (srun + torchrun).
# The checkpoint files are declared one by one (not as a directory) so that Snakemake's clean-up
# of a failed job leaves checkpoints/ in place and the rerun resumes from the last saved step.


rule sft:
    input:
        stage_inputs("sft"),
    output:
        **stage_outputs("sft"),
    params:
        spec=stage_spec("sft"),
    benchmark:
        stage_benchmark("sft"),
    log:
        "logs/sft/{id}.log",
    shell:
        stage_shell("sft")


rule rl:
    input:
        stage_inputs("rl"),
    output:
        **stage_outputs("rl"),
    params:
        spec=stage_spec("rl"),
    benchmark:
        stage_benchmark("rl"),
    log:
        "logs/rl/{id}.log",
    shell:
        stage_shell("rl")
