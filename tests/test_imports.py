"""No import circles among otbuild's modules.

The graph: an edge from each module to every otbuild module it imports, at module level or
inside a function (a lazy import is still a dependency: it only moves the circle to run time),
read from the source by `codehash.imported_modules`. `from otbuild.x import name` is an edge to
`otbuild.x.name` when that is a module, else to `otbuild.x`; relative imports likewise.

A package's `__init__`: importing `otbuild.a.b` also runs `otbuild/a/__init__.py`, but an edge to
every parent would put each package that imports its own submodules in a circle. So the edge goes
only to the module named: a package's `__init__` is in a circle when some module imports the
package itself (`from otbuild.a import name`, `name` not a submodule) and the package imports it
back. Imports by name (`importlib.import_module`) are not read: registries of stages, sources and
engines load their modules that way on purpose.
"""

from __future__ import annotations

from collections import deque

from otbuild.codehash import PACKAGE, imported_modules


def module_graph() -> dict[str, set[str]]:
    """Every module of otbuild -> the otbuild modules it imports (self-imports left out)."""
    graph = {}
    for f in sorted(p.relative_to(PACKAGE) for p in PACKAGE.rglob("*.py")):
        parts = f.with_suffix("").parts
        name = ".".join(("otbuild", *(parts[:-1] if parts[-1] == "__init__" else parts)))
        graph[name] = set(imported_modules(f)) - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import circles, each as a path `[a, b, ..., a]`: for every edge that lies on a circle, the
    shortest circle through it (so each edge to cut is named), without repeats."""

    def path(start: str, goal: str) -> list[str] | None:  # shortest, breadth first
        before, todo = {start: None}, deque([start])
        while todo:
            node = todo.popleft()
            if node == goal:
                out = []
                while node is not None:
                    out.append(node)
                    node = before[node]
                return out[::-1]
            for nxt in sorted(graph.get(node, ())):
                if nxt not in before:
                    before[nxt] = node
                    todo.append(nxt)
        return None

    found = {}
    for a in sorted(graph):
        for b in sorted(graph[a]):
            back = path(b, a) if b != a else None
            if back:
                ring = [a, *back[:-1]]
                i = ring.index(min(ring))  # one rotation per circle
                ring = ring[i:] + ring[:i]
                found[tuple(ring)] = [*ring, ring[0]]
    return [found[k] for k in sorted(found)]


def test_the_cycle_finder_names_each_circle():
    graph = {
        "p.plan": {"p.report"},
        "p.report": {"p.plan", "p.charts"},
        "p.charts": set(),
        "p.a": {"p.b"},
        "p.b": {"p.c"},
        "p.c": {"p.a", "p.charts"},
        "p.self": {"p.self"},
    }
    assert cycles(graph) == [["p.a", "p.b", "p.c", "p.a"], ["p.plan", "p.report", "p.plan"]]
    del graph["p.report"]  # cut: no circle left there
    assert cycles(graph) == [["p.a", "p.b", "p.c", "p.a"]]
    assert cycles({"x": {"y"}, "y": {"z"}, "z": set()}) == []


def test_the_graph_reads_lazy_relative_and_from_imports():
    graph = module_graph()
    assert len(graph) > 100 and all(m in graph for deps in graph.values() for m in deps)
    assert "otbuild.stages" in graph["otbuild.runner"]  # `from otbuild.stages import STAGES`: a name
    assert "otbuild.stagekit.harbor_trials" in graph["otbuild.stagekit.trials"]  # inside run_trials_shard
    synthetic = graph["otbuild.sources.synthetic"]  # `from . import archive`, `from ._common import ...`
    assert {"otbuild.sources.synthetic.archive", "otbuild.sources.synthetic._common"} <= synthetic
    # an edge only to the module named, not to the packages on its way
    assert "otbuild.stagekit" not in graph["otbuild.stagekit.harbor_trials"]


def test_no_import_circles():
    found = cycles(module_graph())
    assert not found, "import circles (cut each by moving what both sides need to a module both import):\n" + "\n".join(
        " -> ".join(c) for c in found
    )


def part(module: str) -> str:
    """The part of otbuild a module belongs to: its sub-package (`otbuild.stages`), or itself
    for a module at the top (`otbuild.plan`)."""
    return ".".join(module.split(".")[:2])


def two_way_parts(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """Pairs of parts that import each other, each with the imports that make it (`a -> b`)."""
    edges: dict[tuple[str, str], list[str]] = {}
    for a, deps in graph.items():
        for b in deps:
            if part(a) != part(b):
                edges.setdefault((part(a), part(b)), []).append(f"{a} -> {b}")
    return {(x, y): sorted(edges[x, y] + edges[y, x]) for x, y in sorted(edges) if x < y and (y, x) in edges}


def test_the_part_finder_names_both_directions():
    graph = {"p.a.x": {"p.b.y"}, "p.b.y": {"p.b.z"}, "p.b.z": {"p.a"}, "p.a": set(), "p.c": {"p.a.x"}}
    assert two_way_parts(graph) == {("p.a", "p.b"): ["p.a.x -> p.b.y", "p.b.z -> p.a"]}


def test_no_two_parts_import_each_other():
    """Sub-packages (and top-level modules) form layers: settings at the bottom, then what
    builds on them; two that import each other are one part split in two, or a layer inverted."""
    found = two_way_parts(module_graph())
    assert not found, "parts that import each other (move what both need below both):\n" + "\n".join(
        f"{a} <-> {b}: {', '.join(why)}" for (a, b), why in found.items()
    )


# The house, bottom first: a part imports only parts of its own floor or below.
# docs/architecture.md says how the floors fit together, and its "Layout" what each floor is for.
FLOORS = (
    # settings: every model that describes a recipe; foundations that know nothing of otbuild
    (
        "settings",
        "span",
        "artifact",
        "errors",
        "fsio",
        "hashing",
        "records",
        "prompts",
        "interrupt",
        "jobs",
        "progress",
        "installation",
        "scaffold",
        "tls",
        "rundir",
        "otbuild",
    ),
    # parts with one job each, built on settings
    ("tasks", "capture", "engines", "duck", "hub", "serve", "show"),
    ("sandbox", "traces", "usage"),
    ("harness", "harbor", "sources"),
    ("train", "ingest"),
    # what the stages are built from (their jobs' contract, trials and requests in shards), then the stages
    ("stagekit",),
    ("stages",),
    # the build: the recipe (its schema made of the stages' sections), the plan, records, reports,
    # and the commands over them
    ("recipe", "plan", "codehash", "recovery", "report", "profiles", "recipe_images"),
    ("provenance", "summary", "estimate", "search"),
    ("audit", "publish", "rebuild", "runner", "workflow", "probe"),
    ("cli", "__main__", "views"),
    # the generated docs, from the settings models, the commands and the stage registry
    ("docgen",),
)


def floor(p: str) -> int:
    name = p.removeprefix("otbuild.") if p != "otbuild" else "otbuild"
    return next((i for i, names in enumerate(FLOORS) if name in names), -1)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports from a part to a part on a higher floor, and parts on no floor."""
    out = sorted({f"{part(m)} is on no floor of FLOORS" for m in graph if floor(part(m)) < 0})
    for a, deps in sorted(graph.items()):
        out += [f"{a} -> {b}" for b in sorted(deps) if floor(part(b)) > floor(part(a)) >= 0]
    return out


def test_imports_go_down_the_floors():
    found = upward_imports(module_graph())
    assert not found, "imports up the house (move what is shared down, or the importer up):\n" + "\n".join(found)


def test_no_stage_imports_another_stage_or_the_registry():
    """A stage's module imports no other stage's module, and not the registry (which loads every
    stage): what it shares with others lives below the stages (otbuild/stagekit/, settings), and
    its code, as the audit hashes it (otbuild/codehash.py), is its own."""
    from otbuild.stages import STAGES

    graph = module_graph()
    stages = {d.module for d in STAGES.values() if d.module in graph}
    found = [f"{m} -> {dep}" for m in sorted(stages) for dep in sorted(graph[m] & (stages | {"otbuild.stages"}))]
    assert not found, "a stage imports another stage or the registry:\n" + "\n".join(found)
