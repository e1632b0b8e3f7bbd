# An otbuild project: every recipes/NAME.yaml is a target `NAME` (snakemake smoke); profiles/
# holds how to run it. The workflow itself (its rules) ships with the installed otbuild package.
from otbuild.workflow import SNAKEFILE


include: SNAKEFILE
