"""`otbuild audit --rebuild`: make artifacts again from their recorded inputs and compare content.

Each selected artifact is rebuilt by its own stage, with the settings and the input files its
provenance record names (the inputs' sha256 checked first), into a scratch dir
(`.otbuild/rebuild/<stage>/<id>/`; artifacts/ is never written), sharded stages shard by shard
and then their merge, exactly as the rules run them. Then every file is compared with the
built one: bytes, except what is declared volatile (measurements of the run: the registry's
`StageDef.volatile`), which is set aside: parquet columns, top-level keys of JSON and JSON-lines
files, marked regions of the report, whole files (TensorBoard's). The result is written beside the artifact, in
`.rebuild.json` (hidden: not one of the artifact's files), where the report reads it.

An LLM-sampled stage (an openai or vllm engine) is compared for what a rebuild can give again
without the same model, server and seed: its files, row counts and key columns (ids, tasks,
samples); other differences are listed as sampled, not as findings. docs/reproducibility.md.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

import otbuild
from otbuild.artifact import REBUILD
from otbuild.errors import EXIT_FINDINGS, EXIT_OK, ConfigError
from otbuild.fsio import parquet_batches, write_json
from otbuild.plan import Node, Plan
from otbuild.provenance import artifact_files, check, now, read_record
from otbuild.report.page import VOLATILE_BEGIN, VOLATILE_END
from otbuild.stagekit.calls import CALLS
from otbuild.stages import STAGES
from otbuild.train.tracking import VOLATILE_FILES

SCRATCH = Path(".otbuild") / "rebuild"
# Engines whose answers a rebuild cannot give again byte for byte without the same model, server
# (batching, kernels) and seed; the oracle replays solutions, the in-process models are seeded.
SAMPLED_ENGINES = ("openai", "vllm")
# What an LLM-sampled stage's rebuild must still give again: row counts and these columns.
KEY_COLUMNS = ("path", "task", "task_id", "source", "sample_idx", "benchmark", "repeat", "trial_name", "run_id")
TEXT_REGIONS = ("*.html", "*.md")  # the report's: volatile regions between VOLATILE_BEGIN and _END


def volatile_fields(stage: str, name: str) -> tuple[str, ...]:
    """The columns or keys of `stage`'s output file `name` that a rebuild sets aside (the
    registry's `StageDef.volatile`)."""
    return next((f for pattern, f in STAGES[stage].volatile.items() if fnmatch.fnmatch(name, pattern)), ())


def volatile_file(name: str) -> bool:
    return any(fnmatch.fnmatch(name, p) for p in VOLATILE_FILES)


def sampled(stage: str, settings: dict, stats: dict | None = None) -> bool:
    """An LLM stage whose answers come from a model server (openai, vllm; `auto`: as its
    record's `engines` name the engine that answered), so a rebuild can match its rows, not its
    bytes."""
    engine = settings.get("engine")
    if engine == "auto":
        return any(model.partition(":")[0] in SAMPLED_ENGINES for model in (stats or {}).get("engines", {}))
    return not STAGES[stage].training and engine in SAMPLED_ENGINES


def cheap(stage: str, settings: dict) -> bool:
    """Rebuilt by default: table stages, the report and trials of the oracle (no model runs)."""
    return not STAGES[stage].training and settings.get("engine") in (None, "oracle")


@dataclass
class Outcome:
    node: Node
    result: str  # identical | differs | sampled (matched what a sampled rebuild can match) | not-proven
    differences: list[str] = field(default_factory=list)  # findings: file, column or key, first row
    notes: list[str] = field(default_factory=list)  # what was set aside, what was sampled

    @property
    def is_finding(self) -> bool:
        return self.result in ("differs", "not-proven")


def select(plan: Plan, names: tuple[str, ...], everything: bool) -> list[Node]:
    """The nodes to rebuild: those named (label, stage or id), else every node (`everything`),
    else the cheap ones. One artifact shared under several labels is rebuilt once."""
    unique = list({n.id: n for n in plan.nodes}.values())
    if names:
        chosen = []
        for name in names:
            hit = [n for n in unique if name in (n.label, n.stage, n.id)]
            if not hit:
                raise ConfigError(
                    f"{name}: no artifact of {plan.recipe.name} has this label, stage or id "
                    f"(labels: {', '.join(n.label for n in unique)})"
                )
            chosen += [n for n in hit if n not in chosen]
        return [n for n in unique if n in chosen]
    return [n for n in unique if everything or cheap(n.stage, n.settings)]


def rebuild_plan(
    plan: Plan, names: tuple[str, ...], console: Console, everything: bool = False, keep: bool = False
) -> int:
    nodes = select(plan, names, everything)
    left = [n.label for n in list({n.id: n for n in plan.nodes}.values()) if n not in nodes]
    console.print(
        f"rebuilding {len(nodes)} artifact(s) of {plan.recipe.name} from their recorded inputs into "
        f"{SCRATCH}/" + (f"; not rebuilt (named, or --all): {', '.join(left)}" if left else ""),
        highlight=False,
    )
    for n in nodes:
        if sampled(n.stage, n.settings):
            console.print(
                f"[yellow]note:[/] {n.label} is sampled from {n.settings.get('engine')}:"
                f"{escape(str(n.settings.get('model')))}: a byte-identical rebuild needs the same model, "
                "server and seed; compared here: its files, row counts and key columns",
                highlight=False,
            )
    outcomes = [_rebuild(n, console) for n in nodes]
    table = Table(title=f"rebuild: {plan.recipe.name}")
    for col in ("artifact", "stage", "id", "result", "detail"):
        table.add_column(col, no_wrap=col != "detail")
    style = {"identical": "green", "sampled": "yellow"}
    for o in outcomes:
        detail = "; ".join(o.differences or o.notes)
        table.add_row(
            o.node.label, o.node.stage, o.node.id, f"[{style.get(o.result, 'red')}]{o.result}[/]", escape(detail)
        )
    console.print(table)
    at = now()
    for o in outcomes:
        if o.result != "not-proven":
            write_json(
                o.node.dir / REBUILD,
                {
                    "rebuilt_at": at,
                    "result": o.result,
                    "differences": o.differences,
                    "notes": o.notes,
                    "otbuild_version": otbuild.__version__,
                },
            )
        if not o.is_finding and not keep:
            shutil.rmtree(SCRATCH / o.node.stage / o.node.id, ignore_errors=True)
            (SCRATCH / o.node.stage / f"{o.node.id}.log").unlink(missing_ok=True)
    _rerender_report(plan, console)
    bad = [o for o in outcomes if o.is_finding]
    if bad:
        for o in bad:
            for d in o.differences:
                console.print(f"[red]{o.result}[/] {o.node.label}: {escape(d)}", highlight=False)
        console.print(
            f"[red]{len(bad)} of {len(outcomes)} artifact(s) not rebuilt identically[/] (the rebuilds "
            f"are kept in {SCRATCH}/)",
            highlight=False,
        )
        return EXIT_FINDINGS
    console.print(
        f"[green]all {len(outcomes)} rebuilt artifact(s) match[/] (volatile columns set aside: docs/reproducibility.md)"
    )
    return EXIT_OK


def _rebuild(node: Node, console: Console) -> Outcome:
    c = check(node.dir, node.stage)
    if c.status != "ok":
        return Outcome(node, "not-proven", [f"{c.status}: {c.detail or 'run the build first'}"])
    record = read_record(node.dir)
    if record is None:  # check() said ok: read again, it is gone
        return Outcome(node, "not-proven", ["no provenance record: run the build first"])
    scratch = SCRATCH / node.stage / node.id
    shutil.rmtree(scratch, ignore_errors=True)
    spec = {
        "stage": node.stage,
        "id": node.id,
        "settings": record["settings"],
        "outdir": str(scratch),
        "inputs": [
            {"id": i["id"], "stage": i["stage"], "path": i["path"], "name": name}  # the node's: same id
            for i, name in zip(record["inputs"], node.input_names, strict=True)
        ],
    }
    shards = record["settings"].get("shards", 1) if STAGES[node.stage].sharded else 0
    console.print(f"[dim]rebuilding {node.label} ({node.stage} {node.id})[/]", highlight=False)
    log = scratch.with_name(f"{node.id}.log")
    log.unlink(missing_ok=True)
    for shard in [*range(shards), None]:
        if code := _run_stage(node.stage, spec, shard, log):
            return Outcome(node, "differs", [f"the rebuild failed (exit {code}; its log: {log})"])
    outcome = compare(
        node.stage, record, node.dir, scratch, sampled(node.stage, record["settings"], record.get("stats"))
    )
    outcome.node = node
    return outcome


def compare(stage: str, record: dict, built: Path, rebuilt: Path, is_sampled: bool = False) -> Outcome:
    """Compare the artifact dir `built` (its recorded files) with the rebuild in `rebuilt`."""
    out = Outcome(None, "identical")  # type: ignore[arg-type]
    names = [Path(o["path"]).name for o in record["outputs"]]
    again = [p.name for p in artifact_files(rebuilt, stage) if p.is_file()]
    volatile = sorted(n for n in names if volatile_file(n))
    if len(volatile) != len([n for n in again if volatile_file(n)]):
        out.differences.append(
            f"{len(volatile)} volatile file(s) ({', '.join(VOLATILE_FILES)}) built, "
            f"{len([n for n in again if volatile_file(n)])} rebuilt"
        )
    elif volatile:
        out.notes.append(f"set aside: {', '.join(volatile)} (volatile file)")
    for name in sorted(set(names) ^ set(again)):
        if not volatile_file(name):
            out.differences.append(f"{name}: {'only in the build' if name in names else 'only in the rebuild'}")
    for name in [n for n in names if n in again and not volatile_file(n)]:
        a, b = built / name, rebuilt / name
        if _same_bytes(a, b):
            continue
        if is_sampled and name == CALLS:  # a row per model call: as many as the sampled answers made
            out.notes.append(f"{name}: sampled (one row per model call)")
            continue
        fields = volatile_fields(stage, name)
        found, aside = _compare_file(a, b, fields, is_sampled)
        if aside:
            out.notes.append(f"{name}: set aside {', '.join(aside)}")
        for d in found:
            (out.notes if is_sampled and d.startswith("sampled") else out.differences).append(f"{name}: {d}")
    out.result = "differs" if out.differences else ("sampled" if is_sampled and out.notes else "identical")
    return out


def _same_bytes(a: Path, b: Path) -> bool:
    if a.stat().st_size != b.stat().st_size:
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(1 << 20), fb.read(1 << 20)
            if x != y:
                return False
            if not x:
                return True


def _compare_file(a: Path, b: Path, fields: tuple[str, ...], is_sampled: bool) -> tuple[list[str], list[str]]:
    """(differences, the volatile fields that did differ) of two files whose bytes differ."""
    if a.suffix == ".parquet":
        return _compare_parquet(a, b, fields, is_sampled)
    if a.suffix in (".json", ".jsonl"):
        return _compare_json_lines(a, b, fields)
    if any(fnmatch.fnmatch(a.name, p) for p in TEXT_REGIONS):
        (x, cuts), (y, _) = (_without_regions(p.read_text(errors="replace")) for p in (a, b))
        if x == y:
            return [], ["its volatile regions"]
        lines = x.splitlines()
        line = _first_diff(lines, y.splitlines())
        start = sum(len(s) + 1 for s in lines[:line])  # where that line starts in `x`
        number = line + 1 + sum(n for at, n in cuts if at <= start)  # its number in the built file
        return [f"differs from line {number}: {(lines[line] if line < len(lines) else '(end)').strip()[:80]!r}"], []
    return ["bytes differ"], []


def _compare_parquet(a: Path, b: Path, fields: tuple[str, ...], is_sampled: bool) -> tuple[list[str], list[str]]:
    import pyarrow.parquet as pq

    ma, mb = pq.ParquetFile(a).metadata, pq.ParquetFile(b).metadata
    if ma.num_rows != mb.num_rows:
        return [f"{ma.num_rows} rows built, {mb.num_rows} rebuilt"], []
    sa, sb = pq.read_schema(a), pq.read_schema(b)
    if sa.names != sb.names or sa.types != sb.types:
        return [f"columns differ: {', '.join(sorted(set(sa.names) ^ set(sb.names))) or 'their types or order'}"], []
    found, aside = [], []
    for col in sa.names:
        row = _first_diff_row(a, b, col)
        if row is None:
            continue
        keys = tuple(f.split(".", 1)[1] for f in fields if f.startswith(col + "."))
        if col in fields:
            aside.append(col)
        elif keys and (row := _first_diff_row(a, b, col, keys)) is None:
            aside.append(f"{col} ({', '.join(keys)})")
        elif is_sampled and col not in KEY_COLUMNS:
            found.append(f"sampled column {col} differs from row {row}")
        else:
            found.append(f"column {col} differs, first at row {row}")
    if not found and not aside:  # same values, other bytes: the writer's options or layout
        found.append("same rows and values, other bytes (encoding, row groups or metadata)")
    return found, aside


def _first_diff_row(a: Path, b: Path, col: str, keys: tuple[str, ...] = (), batch: int = 1024) -> int | None:
    """The first row at which column `col` of two parquet files of equal length differs; with
    `keys`, a JSON column compared without those keys of its objects."""
    start = 0
    for x, y in zip(parquet_batches(a, batch, [col]), parquet_batches(b, batch, [col]), strict=False):
        xs, ys = x.column(0), y.column(0)
        if not xs.equals(ys):
            xl, yl = ([_without_keys(v, keys) for v in c.to_pylist()] for c in (xs, ys))
            if xl != yl:
                return start + _first_diff(xl, yl)
        start += len(xs)
    return None


def _without_keys(value, keys: tuple[str, ...]):
    """A JSON text's value without `keys` in any of its objects (`value` itself when no keys)."""
    if not keys or not isinstance(value, str):
        return value
    try:
        data = json.loads(value)
    except ValueError:
        return value

    def strip(v):
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if k not in keys}
        return [strip(x) for x in v] if isinstance(v, list) else v

    return strip(data)


def _compare_json_lines(a: Path, b: Path, fields: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """A JSON file, or JSON lines: compared value by value, top-level `fields` set aside."""

    def records(p: Path) -> list:
        text = p.read_text()
        try:
            return [json.loads(text)] if p.suffix == ".json" else [json.loads(x) for x in text.splitlines() if x]
        except ValueError:
            return [text]

    xs, ys = records(a), records(b)
    if len(xs) != len(ys):
        return [f"{len(xs)} lines built, {len(ys)} rebuilt"], []
    aside: set[str] = set()
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        if not (isinstance(x, dict) and isinstance(y, dict)):
            if x != y:
                return [f"differs at line {i + 1}"], sorted(aside)
            continue
        aside |= {k for k in fields if x.get(k) != y.get(k)}
        keys = sorted(k for k in x.keys() | y.keys() if k not in fields and x.get(k) != y.get(k))
        if keys:
            where = f" at line {i + 1}" if a.suffix == ".jsonl" else ""
            return [f"key(s) {', '.join(keys)} differ{where}"], sorted(aside)
    if not aside:
        return ["same values, other bytes (formatting)"], []
    return [], sorted(aside)


def _without_regions(text: str) -> tuple[str, list[tuple[int, int]]]:
    """`text` without its volatile regions, and where each was cut: (offset in the result, the
    line breaks it held), to give a line its number in `text`."""
    out, cuts, rest, at = [], [], text, 0
    while (i := rest.find(VOLATILE_BEGIN)) >= 0:
        j = rest.find(VOLATILE_END, i)
        j = len(rest) if j < 0 else j + len(VOLATILE_END)
        out.append(rest[:i])
        at += i
        cuts.append((at, rest[i:j].count("\n")))
        rest = rest[j:]
    return "".join(out) + rest, cuts


def _first_diff(xs: list, ys: list) -> int:
    return next((i for i, (x, y) in enumerate(zip(xs, ys, strict=False)) if x != y), min(len(xs), len(ys)))


def _rerender_report(plan: Plan, console: Console) -> None:
    """The recipe's report, when built, rendered again in place so that it shows the rebuild
    records: only when a render in scratch differs from it in its volatile regions alone (its id
    and every other byte stay; a report that differs otherwise is left as built)."""
    report = plan.nodes[-1]  # a stage over every node of the plan: its report
    if STAGES[report.stage].over != "plan" or check(report.dir, report.stage).status != "ok":
        return
    spec = report.spec()
    scratch = SCRATCH / report.stage / f"{report.id}.render"
    shutil.rmtree(scratch, ignore_errors=True)
    ok = _run_stage(report.stage, {**spec, "outdir": str(scratch)}, None, scratch.with_suffix(".log")) == 0
    if (
        ok
        and (built := read_record(report.dir)) is not None
        and not compare(report.stage, built, report.dir, scratch).is_finding
    ):
        ok = _run_stage(report.stage, spec, None, scratch.with_suffix(".log")) == 0
        shutil.rmtree(scratch, ignore_errors=True)
        if ok:
            scratch.with_suffix(".log").unlink(missing_ok=True)
        console.print(
            f"the report ({report.dir}/) shows the rebuild results"
            if ok
            else f"[yellow]note:[/] the report could not be rendered again ({scratch.with_suffix('.log')})",
            highlight=False,
        )
    else:
        console.print(
            "[yellow]note:[/] the report was not rendered again: it does not match its rebuild", highlight=False
        )


def _run_stage(stage: str, spec: dict, shard: int | None, log: Path) -> int:
    """`otbuild stage STAGE --spec JSON [--shard K]`, as the rules run it, its output appended to `log`."""
    cmd = [sys.executable, "-m", "otbuild", "stage", stage, "--spec", json.dumps(spec)]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as out:
        return subprocess.call(
            cmd + ([] if shard is None else ["--shard", str(shard)]),
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "COLUMNS": "160"},
        )
