"""The synthetic task generator: determinism, selection, format, and real runs of the tasks."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from otbuild.sources.synthetic import DIFFICULTIES, FAMILIES, generate
from otbuild.tasks.taskdir import TaskDir, normalise_instruction

STEP_RANGE = {1: (3, 4), 2: (5, 6), 3: (7, 99)}
HEREDOC = re.compile(r"<<'(\w+)'\n.*?\n\1\n", re.DOTALL)


def _one_of_each(seed: int = 11) -> list:
    """One task per (family, difficulty); generation cycles through all 15 pairs."""
    return list(generate(len(FAMILIES) * len(DIFFICULTIES), seed))


def _count_commands(script: str) -> int:
    body = HEREDOC.sub("<<heredoc\n", script)
    return sum(1 for line in body.splitlines() if line.strip() and not line.startswith("#"))


# -- determinism and selection --------------------------------------------------------------


def test_same_arguments_give_identical_bytes_and_prefixes():
    a = [r.task.pack() for r in generate(20, 3)]
    b = [r.task.pack() for r in generate(20, 3)]
    assert a == b
    assert [r.task.pack() for r in generate(7, 3)] == a[:7]
    assert [r.metadata for r in generate(5, 3)] == [r.metadata for r in generate(9, 3)][:5]


def test_different_seed_gives_different_tasks():
    a = list(generate(15, 1))
    b = list(generate(15, 2))
    for x, y in zip(a, b):
        assert x.task.pack() != y.task.pack()
        assert x.task.instruction != y.task.instruction


def test_family_and_difficulty_selection():
    recs = list(generate(12, 5, families=["text", "archive"], difficulties=[2]))
    assert {r.metadata["family"] for r in recs} == {"text", "archive"}
    assert {r.metadata["difficulty"] for r in recs} == {2}
    for r in recs:
        assert r.task.name.startswith(f"synthetic-{r.metadata['family']}-d2-5-")
    only = list(generate(4, 5, families=["python"]))
    assert [r.metadata["difficulty"] for r in only] == [1, 2, 3, 1]
    assert all(r.metadata["family"] == "python" for r in only)
    with pytest.raises(ValueError):
        list(generate(1, 0, families=["nope"]))
    with pytest.raises(ValueError):
        list(generate(1, 0, difficulties=[4]))
    assert list(generate(0, 0)) == []


def test_instructions_are_distinct():
    recs = list(generate(200, 42))
    assert len({normalise_instruction(r.task.instruction) for r in recs}) == 200
    assert len({r.task.task_id() for r in recs}) == 200
    variants = {(r.metadata["family"], v) for r in recs for v in r.metadata["variants"]}
    assert len(variants) >= 5 * len(FAMILIES)  # every family has several sub-variants


# -- format ------------------------------------------------------------------------------


def test_every_family_and_difficulty_is_a_complete_task_dir():
    recs = _one_of_each()
    assert {(r.metadata["family"], r.metadata["difficulty"]) for r in recs} == set(
        itertools.product(FAMILIES, DIFFICULTIES)
    )
    for r in recs:
        t, meta = r.task, r.metadata
        assert r.runnable_locally
        assert set(meta) >= {"family", "difficulty", "seed", "index", "n_solution_steps"}
        assert t.name == (f"synthetic-{meta['family']}-d{meta['difficulty']}-11-{meta['index']:05d}")
        for rel in ("instruction.md", "task.toml", "environment/Dockerfile"):
            assert rel in t.files and not t.files[rel].executable, (t.name, rel)
        for rel in ("tests/test.sh", "solution/solve.sh"):
            assert t.files[rel].executable, (t.name, rel)
            assert t.text(rel).startswith("#!/bin/sh\n")
        assert any(rel.startswith("environment/app/") for rel in t.files), t.name
        assert t.text("environment/Dockerfile") == ("FROM python:3.12-slim\nWORKDIR /app\nCOPY app/ /app/\n")
        toml = tomllib.loads(t.text("task.toml"))
        assert toml["version"] == "1.0"
        assert toml["metadata"] == {
            "family": meta["family"],
            "difficulty": meta["difficulty"],
            "generator": "otbuild.synthetic",
            "seed": 11,
            "index": meta["index"],
        }
        assert toml["agent"]["timeout_sec"] > 0 and toml["verifier"]["timeout_sec"] > 0
        env = toml["environment"]
        assert env["allow_internet"] is False and "docker_image" not in env
        assert env["cpus"] >= 1 and env["memory_mb"] >= 256
        test_sh = t.text("tests/test.sh")
        assert "/logs/verifier/reward.txt" in test_sh and "/solution" not in test_sh
        assert "/tests" not in t.text("solution/solve.sh")
        assert "/app" in t.instruction
        assert TaskDir.unpack(t.name, t.pack()).files == t.files


def test_solution_step_counts_follow_difficulty():
    for r in generate(90, 8):
        level, steps = r.metadata["difficulty"], r.metadata["n_solution_steps"]
        lo, hi = STEP_RANGE[level]
        assert lo <= steps <= hi, (r.task.name, steps)
        assert _count_commands(r.task.text("solution/solve.sh")) == steps, r.task.name
        assert r.task.text("solution/solve.sh").splitlines()[2] == "cd /app"


# -- real runs in a bubblewrap sandbox -----------------------------------------------------

BWRAP = "/usr/bin/bwrap"


def _sandbox(root: Path, script: str, with_solution: bool) -> subprocess.CompletedProcess:
    """Run `script` with /app, /tests, /logs (and /solution) bound from `root`, nothing else
    writable, no network, and a clean environment."""
    cmd = [
        BWRAP,
        "--tmpfs",
        "/",
        "--ro-bind",
        "/usr",
        "/usr",
        "--ro-bind",
        "/etc",
        "/etc",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
    ]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    cmd += [
        "--bind",
        str(root / "app"),
        "/app",
        "--ro-bind",
        str(root / "task/tests"),
        "/tests",
        "--bind",
        str(root / "logs"),
        "/logs",
    ]
    if with_solution:
        cmd += ["--ro-bind", str(root / "task/solution"), "/solution"]
    cmd += [
        "--unshare-all",
        "--die-with-parent",
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/local/bin:/usr/bin:/bin",
        "--setenv",
        "HOME",
        "/tmp",
        "--chdir",
        "/app",
        "sh",
        "-c",
        script,
    ]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=60)


def _sandbox_missing() -> str | None:
    if not os.path.exists(BWRAP):
        return f"{BWRAP} is not installed"
    if not os.path.exists("/usr/bin/python3"):
        return "/usr/bin/python3 is missing (the task scripts need it inside the sandbox)"
    try:
        probe = subprocess.run(
            [BWRAP, "--ro-bind", "/", "/", "--unshare-all", "true"],
            check=False,
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bwrap does not start: {e}"
    return None if probe.returncode == 0 else f"bwrap cannot sandbox here: {probe.stderr.strip()}"


NO_SANDBOX = _sandbox_missing()
needs_bwrap = pytest.mark.skipif(NO_SANDBOX is not None, reason=f"no sandbox: {NO_SANDBOX}")


def _reward(rec, tmp_path: Path, solve: str | None) -> tuple[str, str]:
    """Place the task, optionally run a solution, then the tests (without /solution mounted);
    return the reward text and the logs for failure messages."""
    root = tmp_path / rec.task.name
    rec.task.write(root / "task")
    shutil.copytree(root / "task/environment/app", root / "app")
    (root / "logs/verifier").mkdir(parents=True)
    log = ""
    if solve is not None:
        p = _sandbox(root, solve, with_solution=True)
        log += f"solution rc={p.returncode}\n{p.stdout}{p.stderr}"
    p = _sandbox(root, "/tests/test.sh", with_solution=False)
    log += f"tests rc={p.returncode}\n{p.stdout}{p.stderr}"
    reward = root / "logs/verifier/reward.txt"
    return (reward.read_text() if reward.exists() else "<missing>"), log


def _sample() -> list:
    """Tasks covering every (family, difficulty) pair and every sub-variant."""
    picked, seen = [], set()
    for rec in generate(150, 2024):
        m = rec.metadata
        keys = {(m["family"], m["difficulty"])} | {(m["family"], v) for v in m["variants"]}
        if keys - seen:
            picked.append(rec)
            seen |= keys
    return picked


SAMPLE = _sample()


def test_sample_covers_every_family_difficulty_and_variant():
    pairs = {(r.metadata["family"], r.metadata["difficulty"]) for r in SAMPLE}
    assert pairs == set(itertools.product(FAMILIES, DIFFICULTIES))
    variants = {(r.metadata["family"], v) for r in SAMPLE for v in r.metadata["variants"]}
    assert variants == {(r.metadata["family"], v) for r in generate(150, 2024) for v in r.metadata["variants"]}
    assert len(SAMPLE) >= 15


@needs_bwrap
@pytest.mark.parametrize("rec", SAMPLE, ids=[r.task.name for r in SAMPLE])
def test_task_runs_solution_passes_and_doing_nothing_fails(rec, tmp_path):
    reward, log = _reward(rec, tmp_path / "solved", "/solution/solve.sh")
    assert reward.strip() == "1", log
    reward, log = _reward(rec, tmp_path / "untouched", None)
    assert reward.strip() == "0", log


@needs_bwrap
def test_an_incomplete_solution_fails(tmp_path):
    """Dropping the last command of the solution must cost the reward."""
    checked = 0
    for rec in SAMPLE:
        lines = rec.task.text("solution/solve.sh").splitlines()
        if lines[-1] == "EOF":  # the last step is a heredoc; skip rather than cut it
            continue
        partial = "\n".join(lines[:-1]) + "\n"
        reward, log = _reward(rec, tmp_path / rec.task.name, partial)
        assert reward.strip() == "0", (rec.task.name, log)
        checked += 1
    assert checked >= 10


@needs_bwrap
def test_verifier_writes_partial_credit(tmp_path):
    """reward.json: the reward and the fraction of checks passed; an incomplete solution earns
    part of the credit, nothing done earns less, the full solution all of it."""
    import json

    rec = next(r for r in SAMPLE if r.metadata["family"] == "files" and r.metadata["difficulty"] == 2)
    lines = rec.task.text("solution/solve.sh").splitlines()

    def credit(name, solve):
        reward, log = _reward(rec, tmp_path / name, solve)
        return reward.strip(), json.loads((tmp_path / name / rec.task.name / "logs/verifier/reward.json").read_text())

    assert credit("full", "/solution/solve.sh") == ("1", {"reward": 1.0, "partial_credit": 1.0})
    half, got = credit("half", "\n".join(lines[:-1]) + "\n")
    none, nothing = credit("none", None)
    assert half == none == "0" and got["reward"] == nothing["reward"] == 0.0
    assert nothing["partial_credit"] < got["partial_credit"] < 1.0


def test_by_year_names_every_year_its_solution_uses():
    """Solvable from the instruction: every year the reference solution files by is named."""
    seen = 0
    for rec in generate(60, 5, ["files"]):
        if "by_year" in rec.metadata["variants"]:
            years = re.search(r"for y in ([\d ]+); do mkdir", rec.task.text("solution/solve.sh")).group(1).split()
            assert all(y in rec.task.instruction for y in years), rec.task.instruction
            seen += 1
    assert seen >= 5
