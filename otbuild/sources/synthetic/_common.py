"""Shared pieces of the synthetic task families.

A task is a short list of independent *operations* ("ops") from one family. Each op brings its
own initial files (under /app), a paragraph of instruction, the shell commands that solve it and
the Python checks the verifier runs. Difficulty sets how many ops a task combines, so harder
tasks need more solution steps. Expected results are computed here, at generation time, and
embedded in the verifier; the solution computes them with shell tools inside the sandbox.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from otbuild.tasks.taskdir import TaskDir

from .verifier import CHECK_PRELUDE, TEST_SH

GENERATOR = "otbuild.synthetic"
LEVELS = (1, 2, 3)
# Solution steps (top-level commands, `cd /app` included) allowed per difficulty.
STEP_RANGE = {1: (3, 4), 2: (5, 6), 3: (7, 20)}

WORDS = (
    "apple",
    "river",
    "stone",
    "cloud",
    "maple",
    "tiger",
    "ember",
    "frost",
    "harbor",
    "meadow",
    "pixel",
    "rocket",
    "signal",
    "timber",
    "violet",
    "walnut",
    "yellow",
    "zephyr",
    "anchor",
    "banner",
    "canyon",
    "dragon",
    "falcon",
    "garden",
    "island",
    "jungle",
    "kettle",
    "lantern",
    "marble",
    "nectar",
    "orbit",
    "pepper",
    "quartz",
    "raven",
    "saddle",
    "tunnel",
    "velvet",
    "willow",
    "beacon",
    "cobalt",
    "delta",
    "fable",
    "glacier",
    "hollow",
    "ivory",
    "jasper",
    "lemon",
    "mosaic",
    "nimbus",
    "opal",
    "prism",
    "quill",
    "ridge",
    "summit",
    "thistle",
    "vertex",
    "wander",
    "yarrow",
    "zinc",
    "copper",
)
PEOPLE = (
    "alice",
    "bruno",
    "chen",
    "dara",
    "elif",
    "farah",
    "goran",
    "hana",
    "ivan",
    "jonas",
    "kemal",
    "lena",
    "mateo",
    "nadia",
    "omar",
    "priya",
    "quinn",
    "rosa",
    "sami",
    "tara",
    "umar",
    "vera",
    "wei",
    "xena",
    "yuki",
    "zoe",
)
CITIES = (
    "Paris",
    "Oslo",
    "Lima",
    "Cairo",
    "Tokyo",
    "Quito",
    "Dakar",
    "Hanoi",
    "Perth",
    "Porto",
    "Riga",
    "Seoul",
    "Tunis",
    "Zagreb",
)
PRODUCTS = (
    "widget",
    "gadget",
    "sprocket",
    "bolt",
    "gear",
    "valve",
    "lens",
    "cable",
    "panel",
    "spring",
    "hinge",
    "nozzle",
)
DIRS = (
    "inbox",
    "reports",
    "uploads",
    "drafts",
    "exports",
    "photos",
    "notes",
    "backups",
    "assets",
    "logs",
    "data",
    "scratch",
    "shared",
    "projects",
    "docs",
    "staging",
    "release",
    "cache",
)
EXTS = ("txt", "log", "csv", "md", "json", "cfg", "dat", "bak", "tmp", "xml")


@dataclass
class Op:
    """One operation of a task: instruction text, initial files, solution steps, checks."""

    name: str
    text: str
    files: dict[str, str | bytes] = field(default_factory=dict)
    steps: list[str] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)

    def check(self, fn: str, *args) -> None:
        """Add a verifier call `fn(*args)`; args are embedded with repr()."""
        self.checks.append(f"{fn}({', '.join(repr(a) for a in args)})")


class Ctx:
    """Random choices for one task; hands out names that are unique within the task."""

    def __init__(self, rng: random.Random, level: int):
        self.rng = rng
        self.level = level
        self.used: set[str] = set()

    def pick(self, pool, k: int | None = None):
        """One (or k distinct) items of `pool` not yet used in this task."""
        free = [x for x in pool if x not in self.used]
        got = self.rng.sample(free, 1 if k is None else k)
        self.used.update(got)
        return got[0] if k is None else got

    def name(self, pool=DIRS, sep: str = "_") -> str:
        """A fresh name like `reports_42`."""
        return f"{self.pick(pool)}{sep}{self.rng.randint(10, 99)}"

    def sentence(self, n: int | None = None, pool=WORDS) -> str:
        return " ".join(self.rng.choice(pool) for _ in range(n or self.rng.randint(3, 7)))

    def lines(self, n: int, pool=WORDS) -> str:
        return "".join(self.sentence(pool=pool) + "\n" for _ in range(n))


OpMaker = Callable[[Ctx], Op]


@dataclass
class Family:
    name: str
    title: str
    intro: tuple[str, ...]  # alternative opening sentences
    ops: tuple[OpMaker, ...]


def text_of(lines) -> str:
    return "".join(f"{x}\n" for x in lines)


def heredoc(command: str, body: str) -> str:
    """One solution step feeding `body` (newline-terminated) to `command` as a quoted heredoc."""
    return f"{command} <<'EOF'\n{body}EOF"


def build_task(family: Family, level: int, seed: int, index: int, rng: random.Random) -> tuple[TaskDir, list[str]]:
    """The task dir and the names of the ops it combines."""
    ops, steps = _choose_ops(family, level, rng)
    task = TaskDir(f"synthetic-{family.name}-d{level}-{seed}-{index:05d}")
    task.add("instruction.md", _instruction(family, ops, rng))
    task.add("task.toml", _task_toml(family.name, level, seed, index))
    task.add("environment/Dockerfile", DOCKERFILE)
    for op in ops:
        for rel, data in op.files.items():
            task.add(f"environment/app/{rel}", data)
    checks = "".join(f"    lambda: {c},\n" for op in ops for c in op.checks)
    task.add("tests/test.sh", TEST_SH.format(prelude=CHECK_PRELUDE, checks=checks), executable=True)
    task.add("solution/solve.sh", SOLVE_SH.format(steps="\n".join(steps)), executable=True)
    return task, [op.name for op in ops]


def _choose_ops(family: Family, level: int, rng: random.Random) -> tuple[list[Op], list[str]]:
    """`level` distinct ops whose solutions, after `cd /app`, fit the level's step range."""
    lo, hi = STEP_RANGE[level]
    for _ in range(100):
        ctx = Ctx(rng, level)
        ops = [make(ctx) for make in rng.sample(family.ops, level)]
        steps = ["cd /app"] + [s for op in ops for s in op.steps]
        if lo <= len(steps) <= hi:
            return ops, steps
    raise RuntimeError(f"{family.name}: no op combination fits {lo}-{hi} steps")


def _instruction(family: Family, ops: list[Op], rng: random.Random) -> str:
    intro = rng.choice(family.intro)
    if len(ops) == 1:
        body = ops[0].text
    else:
        body = "\n".join(f"{k}. {op.text}" for k, op in enumerate(ops, 1))
    return (
        f"# {family.title}\n\n{intro} All paths below are under `/app`, your working "
        f"directory.\n\n{body}\n\nUse the tools available in the container (a POSIX shell, "
        "coreutils, grep, sed, awk, tar, gzip and python3). Do not modify or delete any file "
        "under `/app` that the task does not mention.\n"
    )


def _task_toml(family: str, level: int, seed: int, index: int) -> str:
    return (
        'version = "1.0"\n\n'
        "[metadata]\n"
        f'family = "{family}"\n'
        f"difficulty = {level}\n"
        f'generator = "{GENERATOR}"\n'
        f"seed = {seed}\n"
        f"index = {index}\n\n"
        "[agent]\n"
        f"timeout_sec = {300.0 * level}\n\n"
        "[verifier]\n"
        "timeout_sec = 60.0\n\n"
        "[environment]\n"
        "cpus = 1\n"
        "memory_mb = 1024\n"
        "allow_internet = false\n"
    )


DOCKERFILE = "FROM python:3.12-slim\nWORKDIR /app\nCOPY app/ /app/\n"

SOLVE_SH = "#!/bin/sh\n# Reference solution: one top-level command per step.\n{steps}\n"
