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
    graph = {"p.plan": {"p.report"}, "p.report": {"p.plan", "p.charts"}, "p.charts": set(),
             "p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a", "p.charts"}, "p.self": {"p.self"}}
    assert cycles(graph) == [["p.a", "p.b", "p.c", "p.a"], ["p.plan", "p.report", "p.plan"]]
    del graph["p.report"]  # cut: no circle left there
    assert cycles(graph) == [["p.a", "p.b", "p.c", "p.a"]]
    assert cycles({"x": {"y"}, "y": {"z"}, "z": set()}) == []


def test_the_graph_reads_lazy_relative_and_from_imports():
    graph = module_graph()
    assert len(graph) > 100 and all(m in graph for deps in graph.values() for m in deps)
    assert "otbuild.stages" in graph["otbuild.runner"]  # `from otbuild.stages import STAGES`: a name
    assert "otbuild.stages.rollout_harbor" in graph["otbuild.stages.rollout"]  # inside run_shard
    synthetic = graph["otbuild.sources.synthetic"]  # `from . import archive`, `from ._common import ...`
    assert {"otbuild.sources.synthetic.archive", "otbuild.sources.synthetic._common"} <= synthetic
    # an edge only to the module named, not to the packages on its way
    assert "otbuild.stages" not in graph["otbuild.stages.rollout_harbor"]


def test_no_import_circles():
    found = cycles(module_graph())
    assert not found, "import circles (cut each by moving what both sides need to a module both import):\n" + \
        "\n".join(" -> ".join(c) for c in found)
