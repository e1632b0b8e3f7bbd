"""`otbuild audit`: recompute hashes and compare every artifact with its provenance record."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

import otbuild
from otbuild.artifact import PROVENANCE
from otbuild.errors import EXIT_FINDINGS, EXIT_OK, ConfigError
from otbuild.plan import RESULTS, Plan
from otbuild.provenance import check, read_record
from otbuild.stages import STAGES

STYLE = {"ok": "green", "not-built": "yellow"}


def audit_plan(plan: Plan, console: Console, verify: bool = False) -> int:
    table = Table(title=f"audit: {plan.recipe.name}")
    for col in ("artifact", "id", "status", "rows", "built", "otbuild", "code", "detail"):
        table.add_column(col, no_wrap=col not in ("code", "detail"))
    findings = 0
    other_versions, bumped = set(), set()
    previous = _published_ids(plan)
    for n in plan.nodes:
        c = check(n.dir, n.stage, verify)
        record = read_record(n.dir) or {}
        findings += c.is_finding
        rows = ", ".join(str(o["rows"]) for o in record.get("outputs", []) if "rows" in o)
        code = f"[yellow]{_code_note(c)}[/]" if c.code_drift else ("same" if record else "")
        version = record.get("otbuild_version", "")
        if version and version != otbuild.__version__:
            other_versions.add(version)
            version = f"[yellow]{version}[/]"
        detail = c.detail
        if c.status == "not-built" and (was := previous.get(n.label)) and was != n.id:
            detail, change = _since_last_build(n, was)
            if change:
                bumped.add(f"{n.stage} {change}")
        table.add_row(
            n.label,
            n.id,
            f"[{STYLE.get(c.status, 'red')}]{c.status}[/]",
            rows,
            record.get("finished_at", "")[:16].replace("T", " "),
            version,
            code,
            detail,
        )
    console.print(table)
    findings += _audit_search(plan, console)
    if other_versions:
        console.print(
            f"[yellow]note: built by otbuild {', '.join(sorted(other_versions))}; this is "
            f"{otbuild.__version__}[/] (ids hold the stage versions: what matches is reused)"
        )
    if bumped:
        console.print(
            f"[yellow]stage versions changed since the last build: {', '.join(sorted(bumped))}[/]; "
            f"`snakemake {plan.recipe.name}` builds the new artifacts beside the old ones"
        )
    if findings:
        console.print(f"[red]{findings} artifact(s) not proven[/]: drifted, without a record, or not built")
        return EXIT_FINDINGS
    console.print(f"[green]all {len(plan.nodes)} artifact(s) match their provenance records[/]")
    return EXIT_OK


def _audit_search(plan: Plan, console: Console) -> int:
    """Each decision of a search derived again from its ranking and its candidates' evals, as
    built: a decision that does not follow from them is a finding."""
    from otbuild.stagekit import Inputs
    from otbuild.stages.decide import derive

    decided = [s for s in plan.search if s.decision is not None]
    if not decided:
        return 0
    table = Table(title=f"search decisions: {plan.recipe.name}")
    for col in ("stage", "winner", "decided", "proven", "detail"):
        table.add_column(col, no_wrap=col != "detail")
    findings = 0
    for s in decided:
        node, was = s.decide, s.decision or {}
        again = derive(node.config, Inputs([i.main_output for i in node.inputs], node.input_names))
        same = all(again[k] == was[k] for k in ("winner", "decided", "values"))
        findings += not same
        detail = (
            was["reason"]
            if same
            else (
                f"recorded {was['winner']} ({was['reason']}), the artifacts give {again['winner']} ({again['reason']})"
            )
        )
        table.add_row(
            str(s.step),
            was["winner"],
            "yes" if was["decided"] else "no (default kept)",
            "[green]yes[/]" if same else "[red]no[/]",
            detail,
        )
    console.print(table)
    if len(decided) < len(plan.recipe.recipe.search):
        console.print(f"[yellow]search: {len(plan.recipe.recipe.search) - len(decided)} stage(s) not decided yet[/]")
    return findings


def _published_ids(plan: Plan) -> dict[str, str]:
    """label -> artifact id in the recipe's last published view (results/NAME/manifest.json)."""
    try:
        manifest = json.loads((RESULTS / plan.recipe.name / "manifest.json").read_text())
        return {a["label"]: a["id"] for a in manifest["artifacts"]}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _since_last_build(n, was: str) -> tuple[str, str]:
    """Why node `n`'s id moved away from `was`, the artifact its label last published: (detail,
    the stage version change or '')."""
    record = read_record(n.dir.parent / was) or {}
    old, new = record.get("stage_version"), STAGES[n.stage].version
    if old is not None and old != new:
        change = f"{old} -> {new}"
        return f"stage version {change} since {was} (built by otbuild {record.get('otbuild_version')})", change
    return f"was {was}: its settings or inputs changed", ""


def _code_note(c) -> str:
    return "changed since build" + (f": {', '.join(c.code_changed)}" if c.code_changed else "")


def artifact_dir(path: Path) -> Path:
    """The artifact dir (artifacts/<stage>/<id>/) holding `path`, links resolved (so a
    results/<recipe>/<label>/... path works too)."""
    resolved = path.resolve()
    for d in (resolved, *resolved.parents):
        if d.parent.name in STAGES and d.parent.parent.name == "artifacts":
            return d
    raise ConfigError(
        f"{path}: not inside an artifact dir (artifacts/<stage>/<id>/, or a link to one under results/<recipe>/)"
    )


def show_artifact(path: Path, console: Console, verify: bool = False) -> int:
    """Full record of the artifact containing `path`, with its current check."""
    d = artifact_dir(path)
    stage = d.parent.name
    c = check(d, stage, verify)
    record = read_record(d)
    console.print(f"[bold]{d}[/]  status: [{STYLE.get(c.status, 'red')}]{c.status}[/] {c.detail}")
    if record is None:
        console.print(f"[red]no {PROVENANCE}[/]")
        return EXIT_FINDINGS
    if c.code_drift:
        console.print(f"[yellow]note: the stage's code {_code_note(c)}[/]")
    console.print_json(json.dumps(record))
    return EXIT_FINDINGS if c.is_finding else EXIT_OK
