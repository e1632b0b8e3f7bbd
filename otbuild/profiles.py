"""Checks of a Snakemake profile against a plan, before anything runs: that a rollout's or
eval's concurrent trials fit in the memory the profile gives its job, and that the profile has
no unfilled `<...>` placeholders."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from otbuild.stages import STAGES


def profile_config(profile: Path) -> dict:
    """A profile's config.yaml as a mapping."""
    return yaml.safe_load((profile / "config.yaml").read_text()) or {}


def rule_resources(profile: Path, rule: str, attempt: int = 1) -> dict[str, tuple[Any, str]]:
    """The resources a profile gives `rule`'s jobs on `attempt`, each with where it is set:
    its `set-resources` entry over `default-resources`; expressions such as "16000 * attempt"
    evaluated."""
    cfg = profile_config(profile)
    out: dict[str, tuple[object, str]] = {}
    for key in ("default-resources", f"set-resources.{rule}"):
        section = cfg
        for part in key.split("."):
            section = (section or {}).get(part) or {}
        for name, value in section.items() if isinstance(section, dict) else ():
            if isinstance(value, str) and name in ("mem_mb", "runtime", "nodes", "gpu", "tasks_per_node"):
                try:
                    value = eval(value, {"attempt": attempt})
                except Exception:  # noqa: BLE001, S110 - a plain string resource (a partition name)
                    pass
            out[name] = (value, f"{profile / 'config.yaml'}: {key}.{name}")
    return out


def profile_mem_mb(profile: Path, rule: str) -> tuple[int, str] | None:
    """The memory (MB) a profile gives `rule`'s jobs on their first attempt, and where it is
    set; None when the profile does not say."""
    found = rule_resources(profile, rule).get("mem_mb")
    return (int(found[0]), found[1]) if found else None


def overcommit_problems(nodes, profile: Path) -> list[str]:
    """Rollout and eval stages whose concurrency x per-trial memory exceeds their job's memory
    under `profile` (what Slurm would kill mid-run, after hours of GPU time)."""
    from otbuild.settings.engines import concurrency

    problems = []
    for node in nodes:
        if not (STAGES[node.stage].trials and STAGES[node.stage].sharded):  # its own trial jobs (rl: training's)
            continue
        job = profile_mem_mb(profile, node.stage)
        if job is None:
            continue
        mem_mb, where = job
        conc = concurrency(node.config)  # unset: the engine's own default
        per = node.config.limits.memory_mb
        if conc * per > mem_mb:
            fixes = [f"concurrency to {mem_mb // per}"] * (mem_mb >= per) + [f"limits.memory_mb to {mem_mb // conc}"]
            problems.append(
                f"{node.label}: concurrency {conc} x limits.memory_mb {per} = {conc * per} MB is more than "
                f"the job's {mem_mb} MB ({where}); lower {' or '.join(fixes)}, or give the job more memory"
            )
    return problems


PLACEHOLDER = re.compile(r"<[A-Za-z][\w.-]*>")  # profiles/slurm's `<account>`, `gpu:<gpu-model>:4`


def profile_placeholders(config: Path) -> list[str]:
    """The `<...>` placeholders still in a profile's config file (outside comments), each once
    with the first line it is on."""
    first: dict[str, int] = {}
    for n, line in enumerate(config.read_text(errors="replace").splitlines(), 1):
        for found in PLACEHOLDER.findall(line.split("#", 1)[0]):
            first.setdefault(found, n)
    return [f"{p} (line {n})" for p, n in first.items()]


def profile_warnings(argv: list[str]) -> list[str]:
    """Warnings about the profiles a snakemake command line (`argv`, without the program) uses:
    placeholders left unfilled (Slurm would refuse every job, or they would land on a partition
    named `<gpu-partition>`). Profiles are found as Snakemake finds them."""
    from snakemake.cli import get_argument_parser, get_profile_dir

    try:
        args, _ = get_argument_parser().parse_known_args(argv)
    except (SystemExit, Exception):  # noqa: BLE001 (Snakemake judges its own command line)
        return []
    said = []
    for profile in args.profile or []:
        found = get_profile_dir(profile) if profile != "none" else None
        if found and (placeholders := profile_placeholders(found[1])):
            said.append(
                f"profile {profile} ({found[1]}) still has placeholders: {', '.join(placeholders)}; "
                "replace them with your cluster's values before a real run"
            )
    return said
