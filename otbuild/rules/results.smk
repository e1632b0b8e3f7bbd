# One target rule per recipe: `snakemake NAME` builds every artifact of recipes/NAME.yaml and
# then (re)writes results/NAME/ (links + manifest). Asked for, it first prints the recipe's
# warnings (`otbuild validate`'s); data the recipe names that does not exist stops the run
# before any job starts (exit 2; a dry run only warns). It has no output file, so Snakemake
# always runs it: that is cheap and keeps the view true after an edit and an edit back.
import re

from otbuild.settings.recipe import NAME_RE
from otbuild.workflow import write_results

for _name in WF.plans:

    rule:
        name:
            _name
        input:
            WF.target(_name, lambda: workflow.dryrun),
        params:
            recipe=_name,
        localrule: True
        run:
            write_results(WF.plans[params.recipe])


# An invalid recipe's target: its errors end a run that asks for it (exit 2), before anything
# runs; runs for other targets only warn about it (otbuild/workflow.py).
for _name in (n for n in WF.broken if re.match(NAME_RE, n)):

    rule:
        name:
            _name
        input:
            WF.refuse(_name),
        localrule: True
        run:
            pass
