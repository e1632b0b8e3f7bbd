"""What a stage's code is: every file of otbuild that can run when the stage runs, hashed.

Provenance records these hashes (`code`, and `code_sha256` over them) so that `otbuild audit`
names the files changed since an artifact was built. The files of a stage: its module and the
otbuild modules it imports, directly or not (found in the source, so imports inside functions
count; a module that imports by name, importlib, brings every module of its package), the
`__init__` of each package on the way, the SQL templates its modules name (and those these
import or include), and the template folders its modules read (a module naming a `templates`
folder: its own, else the package's).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import re
from functools import cache
from pathlib import Path

import otbuild
from otbuild.duck import SQL_DIR
from otbuild.stages import STAGES

PACKAGE = Path(otbuild.__file__).parent
SQL_NAME = re.compile(r"""["'](\w+\.sql)["']""")  # a template named in a module or another template


def code_files(stage: str) -> dict[str, str]:
    """sha256 (16 hex digits) of every file of the stage's code, by path (otbuild/...; a stage
    added by a package: its module's file, by its path)."""
    stage_def = STAGES[stage]
    if stage_def.module.split(".")[0] != "otbuild":  # a stage a package adds: its own file
        spec = importlib.util.find_spec(stage_def.module)
        if spec is None or spec.origin is None:
            raise ValueError(f"stage {stage}: its module {stage_def.module} cannot be found")
        return {spec.origin: hashlib.sha256(Path(spec.origin).read_bytes()).hexdigest()[:16]}
    module = _module_file(stage_def.module)
    if module is None:
        raise ValueError(f"stage {stage}: its module {stage_def.module} is not in otbuild")
    files = set(_closure(module))
    files |= {Path(SQL_DIR.name, t) for t in _templates({n for f in files if f.suffix == ".py" for n in _sql_named(f)})}
    for f in [f for f in files if f.suffix == ".py" and _reads_templates(f)]:
        folder = next(d for d in ((PACKAGE / f).parent / "templates", PACKAGE / "templates") if d.is_dir())
        files |= {p.relative_to(PACKAGE) for p in folder.rglob("*") if p.is_file()}
    return {
        f"otbuild/{f.as_posix()}": hashlib.sha256((PACKAGE / f).read_bytes()).hexdigest()[:16] for f in sorted(files)
    }


@cache
def _sql_named(f: Path) -> frozenset[str]:
    """The SQL templates a module names ("mix.sql")."""
    return frozenset(n for n in SQL_NAME.findall((PACKAGE / f).read_text()) if (SQL_DIR / n).is_file())


def _templates(names: set[str]) -> set[str]:
    """The templates and those they import or include, to the end."""
    todo, out = list(names), set()
    while todo:
        if (name := todo.pop()) not in out:
            out.add(name)
            todo += [n for n in SQL_NAME.findall((SQL_DIR / name).read_text()) if (SQL_DIR / n).is_file()]
    return out


def code_sha256(stage: str, files: dict[str, str] | None = None) -> str:
    """One hash over the stage's code files."""
    files = code_files(stage) if files is None else files
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]


def _module_file(module: str) -> Path | None:
    """`otbuild.a.b` -> a/b.py or a/b/__init__.py (relative to PACKAGE); None if not a module."""
    parts = module.split(".")[1:]
    for f in (Path(*parts, "__init__.py"), Path(*parts).with_suffix(".py") if parts else None):
        if f is not None and (PACKAGE / f).is_file():
            return f
    return None


@cache
def imported_modules(f: Path) -> frozenset[str]:
    """The otbuild modules that file `f` (relative to PACKAGE) names in its imports, at module
    level or inside functions: `from otbuild.x import name` is `otbuild.x.name` when that is a
    module, else `otbuild.x`; relative imports resolved. Only the module named: the `__init__`
    of its packages, which also runs, is not in this set."""
    package = ["otbuild", *f.parent.parts]
    names = []
    for node in ast.walk(ast.parse((PACKAGE / f).read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            mod = ".".join(p for p in (base, node.module or "") if p)
            names += [f"{mod}.{a.name}" if _module_file(f"{mod}.{a.name}") else mod for a in node.names]
    return frozenset(n for n in names if n.split(".")[0] == "otbuild" and _module_file(n))


@cache
def _imports(f: Path) -> tuple[Path, ...]:
    """The otbuild modules (and their packages' __init__ files) that file `f` imports."""
    out = set()
    for name in imported_modules(f):
        parts = name.split(".")
        out |= {m for i in range(1, len(parts) + 1) if (m := _module_file(".".join(parts[:i])))}
    if "import_module(" in (PACKAGE / f).read_text():  # imports by name: any module of its package may run
        out |= {p.relative_to(PACKAGE) for p in (PACKAGE / f).parent.glob("*.py")}
    return tuple(sorted(out - {f}))


@cache
def _reads_templates(f: Path) -> bool:
    """The module names a `templates` folder (its own, else the package's)."""
    tree = ast.parse((PACKAGE / f).read_text())
    return any(isinstance(n, ast.Constant) and n.value == "templates" for n in ast.walk(tree))


def _closure(start: Path) -> list[Path]:
    seen, todo = set(), [start]
    while todo:
        f = todo.pop()
        if f not in seen:
            seen.add(f)
            todo += _imports(f)
    return sorted(seen)
