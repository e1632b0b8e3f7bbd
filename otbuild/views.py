"""What the commands print: the rich tables of `otbuild plan`, `validate --images` and `costs`
(the report's figures, on the console)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from otbuild.stages import STAGES


def plan_table(p, out: Console) -> None:
    """`otbuild plan`: each artifact (a heading per candidate of an ablation or a search), its id,
    whether it is built, and its inputs by label."""
    from otbuild.provenance import check

    table = Table(title=f"plan: {p.recipe.name}", caption="each artifact is artifacts/STAGE/ID; its inputs by name")
    table.add_column("artifact (stage)", overflow="fold")
    table.add_column("id", no_wrap=True, min_width=16)
    table.add_column("status", no_wrap=True, min_width=7)
    table.add_column("inputs", overflow="fold", ratio=1)
    candidate = None
    for n in p.nodes:
        prefix = candidate_prefix(n.label)
        if prefix and prefix != candidate:  # an ablation or search: a heading per candidate, labels within it
            candidate = prefix
            *step, name = prefix.strip("/").split("/")[1:]
            table.add_row(f"[bold]{'stage ' + step[0] + ' ' if step else ''}candidate {escape(name)}[/]", "", "", "")
        status = check(n.dir, n.stage).status
        style = {"ok": "green", "not-built": "yellow"}.get(status, "red")
        shown = {"ok": "built", "not-built": "pending"}.get(status, status)
        label = n.label.removeprefix(prefix)
        named = n.stage in (label.rsplit("/", 1)[-1], label.split("/")[0].removesuffix("s"))
        name = ("  " if prefix else "") + escape(label) + ("" if named else f" [dim]({n.stage})[/]")
        inputs = "every artifact above" if STAGES[n.stage].over == "plan" else _input_labels(n, prefix)
        table.add_row(name, n.id, f"[{style}]{shown}[/]", escape(inputs))
    out.print(table)


def candidate_prefix(label: str) -> str:
    """The label's candidate part: candidates/NAME/ (an ablation), search/STEP/NAME/ (a search)."""
    parts = label.split("/")
    if parts[0] == "candidates":
        return "/".join(parts[:2]) + "/"
    return "/".join(parts[:3]) + "/" if parts[0] == "search" and len(parts) > 3 else ""


def _input_labels(node, prefix: str) -> str:
    """A node's inputs by label: within a candidate, without its prefix; the same artifact of
    several candidates (the ranking's evals) as one entry."""
    labels: dict[str, int] = {}
    for i in node.inputs:
        label = i.label.removeprefix(prefix)
        if cand := candidate_prefix(label):
            label = f"{label.removeprefix(cand)} of each candidate"
        labels[label] = labels.get(label, 0) + 1
    return ", ".join(f"{label} ({n})" if n > 1 else label for label, n in labels.items())


def images_table(plan, out: Console) -> int:
    """The base-image table of one plan; how many images are missing."""
    from otbuild.recipe_images import base_image_counts, image_presence, trial_backends

    counts, unread = base_image_counts(plan)
    name = plan.recipe.name
    if unread:
        out.print(
            f"base images: {name}: could not check {len(unread)} source(s) whose data is not there yet "
            f"({', '.join(unread)}): their tasks' images are unknown",
            highlight=False,
        )
    if not counts:
        if not unread:
            backends = trial_backends(plan)
            why = (
                f"trials run under sandbox {', '.join(sorted(backends))}, not in podman images"
                if backends and not backends & {"podman", "auto"}
                else "this host stands in for every image"
            )
            out.print(f"base images: {name}: no task runs in its own image here ({why})", highlight=False)
        return 0
    presence = image_presence(sorted(counts))
    table = Table(title=f"base images: {plan.recipe.name}")
    for col in ("image", "tasks", "here"):
        table.add_column(col)
    for image, present in presence.items():
        shown = {True: "[green]present[/]", False: "[red]missing[/]", None: "[yellow]podman unavailable[/]"}
        table.add_row(image, str(counts[image]), shown[present])
    out.print(table)
    return sum(1 for p in presence.values() if p is not True)


def costs_tables(recipe: str, k, out: Console) -> None:
    """`otbuild costs`: the LLM requests and tokens, then the runtimes and GPU-hours, per artifact."""
    from otbuild.report.charts import num
    from otbuild.report.page import amount

    t = k.total
    tokens = Table(title=f"LLM requests and tokens: {recipe}")
    for col in ("artifact", "stage", "model", "requests", "errors", "input tokens", "output tokens", "cost"):
        tokens.add_column(col, justify="right" if col not in ("artifact", "stage", "model") else "left")
    for u in k.usage:
        tokens.add_row(
            u.label,
            u.stage,
            u.model,
            num(u.requests),
            num(u.errors),
            num(u.input_tokens),
            num(u.output_tokens),
            amount(u.cost),
        )
    tokens.add_row(
        "total",
        "",
        "",
        num(t["requests"]),
        num(t["errors"]),
        num(t["input_tokens"]),
        num(t["output_tokens"]),
        amount(t["cost"]),
        style="bold",
    )
    out.print(tokens)
    if k.unpriced:
        out.print(f"no price for {', '.join(k.unpriced)}: set `prices:` in the recipe", highlight=False)
    if k.unrecorded:
        out.print(f"built before token accounting (no llm_usage): {', '.join(k.unrecorded)}", highlight=False)
    times = Table(title=f"runtime, memory and GPU-hours: {recipe}")
    for col in ("artifact", "stage", "jobs", "runtime (s)", "peak memory (MB)", "GPUs", "GPU-hours"):
        times.add_column(col, justify="right" if col not in ("artifact", "stage") else "left")
    for r in k.runtimes:
        times.add_row(
            r.label, r.stage, num(r.jobs), num(r.seconds), num(r.peak_rss_mb), num(r.gpus), amount(r.gpu_hours)
        )
    times.add_row("total", "", "", num(t["seconds"]), "", "", amount(t["gpu_hours"]), style="bold")
    out.print(times)
    if not k.runtimes:
        out.print(
            "no benchmark files under benchmarks/ for these artifacts (not built yet, or built "
            "before benchmarks were recorded)",
            highlight=False,
        )


def versus_table(recipe: str, arts, k, out: Console) -> None:
    """The last estimate of RECIPE (`plan --estimate`) beside what is built, when one was made."""
    from otbuild.report.charts import num
    from otbuild.report.estimate import compare, load_saved

    saved = load_saved(recipe)
    rows = compare(saved, arts, k) if saved else []
    if not rows or saved is None:
        return
    table = Table(title=f"estimate ({saved.get('made_at')}) and actual: {recipe}")
    for col in ("artifact", "figure", "estimate", "low", "high", "actual", "error"):
        table.add_column(col, justify="left" if col in ("artifact", "figure") else "right")
    for r in rows:
        error = f"{100 * r['error']:+.0f} %" if r["error"] is not None else "–"
        table.add_row(r["label"], r["metric"], *(num(r[c]) for c in ("estimate", "low", "high", "actual")), error)
    out.print(table)


def probe_table(summary: dict, out: Console) -> None:
    """`otbuild probe`: a row per source (otbuild/probe.py), a broken one red with why."""
    from otbuild.report.charts import num

    table = Table(
        title=f"probe: {summary['recipe']} ({summary['probe_recipe']})",
        caption=f"pass rate over {summary['pass_rate_over']}",
    )
    for name in ("source", "tasks", "valid", "rejected", "pass rate ± se", "bands", "errors", "turns", "s / trial"):
        table.add_column(name, overflow="fold", justify="right" if name in ("tasks", "turns", "s / trial") else "left")
    table.add_column("why", overflow="fold", style="red")
    for r in summary["sources"]:
        valid = f"{r['valid_rate']:.0%} ({r['valid']})" if r["valid_rate"] is not None else "–"
        rate = f"{r['pass_rate']:.0%} ± {r['pass_rate_se']:.0%}" if r["pass_rate"] is not None else "–"
        table.add_row(
            escape(r["source"]),
            str(r["tasks"]),
            valid,
            escape(", ".join(f"{k} {v}" for k, v in sorted(r["rejected"].items()))),
            f"{rate} ({r['passed_trials']}/{r['scored_trials']})" if r["scored_trials"] else rate,
            ", ".join(f"{k} {v}" for k, v in r["bands"].items() if v),
            escape(", ".join(f"{k} {v}" for k, v in r["errors"].items())),
            num(r["median_turns"]),
            num(r["median_seconds"]),
            escape(r["broken"] or ""),
            style="bold red" if r["broken"] else None,
        )
    out.print(table)
