# Report: a self-contained HTML page and a dataset card per recipe (otbuild/report/), flagged
# with report() so `snakemake --report report.html NAME` carries them with their captions.
from otbuild.report import CAPTIONS


def _report_recipe(wc):
    return WF.node("report", wc.id).config.recipe


rule report:
    input:
        stage_inputs("report"),
    output:
        html=report(
            "artifacts/report/{id}/report.html",
            caption=str(CAPTIONS / "report.rst"),
            category="otbuild",
            subcategory=_report_recipe,
            labels=lambda wc: {"recipe": _report_recipe(wc), "file": "report.html"},
        ),
        card=report(
            "artifacts/report/{id}/dataset_card.md",
            caption=str(CAPTIONS / "dataset_card.rst"),
            category="otbuild",
            subcategory=_report_recipe,
            labels=lambda wc: {"recipe": _report_recipe(wc), "file": "dataset_card.md"},
        ),
        provenance=f"artifacts/report/{{id}}/{PROVENANCE}",
    params:
        spec=stage_spec("report"),
        stage="report",
        recipe=_report_recipe,
    benchmark:
        stage_benchmark("report"),
    log:
        "logs/report/{id}.log",
    localrule: True
    shell:
        stage_shell()
