# One target rule per recipe: `snakemake NAME` builds every artifact of recipes/NAME.yaml and
# then (re)publishes results/NAME/ (links + manifest). It has no output file, so Snakemake
# always runs it: that is cheap and keeps the view true after an edit and an edit back.
from otbuild.workflow import publish

for _name, _plan in WF.plans.items():

    rule:
        name:
            _name
        input:
            [str(p) for n in _plan.nodes for p in (*n.outputs, n.provenance)],
        params:
            recipe=_name,
        localrule: True
        run:
            publish(WF.plans[params.recipe])
