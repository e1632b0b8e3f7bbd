"""Procedural, seeded terminal tasks: the embedded default task source.

`generate(count, seed)` yields Harbor task dirs that need only a POSIX shell, coreutils and
python3 at run time. Task i depends on (seed, i) alone, so the same arguments always give
byte-identical tasks and `generate(n)` is a prefix of `generate(n + k)`.

Each family (one module each) has a few operations; a task of difficulty d combines d distinct
operations, so its reference solution has 3-4 (d=1), 5-6 (d=2) or 7+ (d=3) top-level commands.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

from otbuild.tasks.table import TaskRecord
from otbuild.tasks.taskdir import SOLUTION

from . import archive, data, files, python, text
from ._common import GENERATOR, LEVELS, build_task

_FAMILIES = {m.FAMILY.name: m.FAMILY for m in (files, text, data, archive, python)}
FAMILIES: tuple[str, ...] = tuple(_FAMILIES)
DIFFICULTIES: tuple[int, ...] = LEVELS

__all__ = ["DIFFICULTIES", "FAMILIES", "GENERATOR", "generate", "solution_steps"]


def generate(
    count: int, seed: int, families: Sequence[str] | None = FAMILIES, difficulties: Sequence[int] | None = DIFFICULTIES
) -> Iterator[TaskRecord]:
    """Yield `count` tasks; task i cycles through the (family, difficulty) pairs selected
    (None: every one, as a synthetic source that names none)."""
    fams = _select("family", families, FAMILIES)
    levels = _select("difficulty", difficulties, DIFFICULTIES)
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    combos = [(f, d) for d in levels for f in fams]
    for i in range(count):
        fam, level = combos[i % len(combos)]
        rng = random.Random(f"{seed}:{i}")
        task, variants = build_task(_FAMILIES[fam], level, seed, i, rng)
        yield TaskRecord(
            task,
            runnable_locally=True,
            metadata={
                "family": fam,
                "difficulty": level,
                "seed": seed,
                "index": i,
                "n_solution_steps": solution_steps(task.text(SOLUTION) or ""),
                "variants": variants,
            },
        )


def solution_steps(script: str) -> int:
    """Top-level commands in a solve.sh as written here: one per line, a heredoc counts once."""
    n, end = 0, None
    for line in script.splitlines():
        if end is not None:
            end = None if line == end else end
        elif line.strip() and not line.lstrip().startswith("#"):
            n += 1
            if "<<'" in line:
                end = line.split("<<'", 1)[1].split("'", 1)[0]
    return n


def _select(what: str, chosen, allowed: tuple) -> tuple:
    if chosen is None:
        return allowed
    chosen = tuple(dict.fromkeys(chosen))
    bad = [c for c in chosen if c not in allowed]
    if bad or not chosen:
        raise ValueError(f"unknown {what} {bad or chosen!r}; choose from {list(allowed)}")
    return chosen
