# One target rule per recipe: `snakemake NAME` builds every artifact of recipes/NAME.yaml and
# results/NAME/manifest.json (rule results_manifest, its output flagged for `snakemake --report`),
# then (re)writes results/NAME/ (the links by label, recipe.resolved.yaml, the manifest where it
# changed). Asked for, it first prints the recipe's warnings (`otbuild validate`'s); data the
# recipe names that does not exist stops the run before any job starts (exit 2; a dry run only
# warns). The target has no output file, so Snakemake always runs it: that is cheap and keeps
# the view true after an edit and an edit back. results_manifest runs when an artifact is new
# (mtime) or the recipe's set of artifacts changed (profiles/default's `input` rerun trigger).
import re

from otbuild.settings.recipe import NAME_RE
from otbuild.workflow import write_manifest, write_results

for _name in WF.plans:

    rule:
        name:
            _name
        input:
            WF.target(_name, lambda: workflow.dryrun, decided),
            manifest=f"results/{_name}/manifest.json",
        params:
            recipe=_name,
        log:
            f"logs/results/{_name}.log",
        localrule: True
        run:
            write_results(WF.plans[params.recipe], log[0])


if WF.plans:

    rule results_manifest:
        input:
            manifest_inputs,
        output:
            report(
                "results/{recipe}/manifest.json",
                caption=str(CAPTIONS / "results.manifest.rst"),
                category=RESULTS,
                subcategory="{recipe}",
                labels={"recipe": "{recipe}", "file": "manifest.json"},
            ),
        log:
            "logs/results/{recipe}.manifest.log",
        wildcard_constraints:
            recipe="|".join(map(re.escape, WF.plans)),
        localrule: True
        run:
            write_manifest(WF.plans[wildcards.recipe], log[0])


# An invalid recipe's target: its errors end a run that asks for it (exit 2), before anything
# runs; runs for other targets only warn about it (otbuild/workflow.py).
for _name in (n for n in WF.broken if re.match(NAME_RE, n)):

    rule:
        name:
            _name
        input:
            WF.refuse(_name),
        log:
            f"logs/results/{_name}.log",
        localrule: True
        run:
            pass
