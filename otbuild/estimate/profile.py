"""What a Snakemake profile grants each rule's jobs, for the estimate: GPUs (gres x nodes, or
gpu), wall-clock minutes (`runtime`), attempts (1 + `retries`; profiles/default's keys win, as
Snakemake applies it on top) and how many jobs run at once (`jobs`, or a local run's cores)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from otbuild.errors import ConfigError
from otbuild.profiles import profile_config, rule_resources
from otbuild.report.costs import gpus


@dataclass(frozen=True)
class Grant:
    rule: str
    gpus: int
    runtime_s: float | None  # None: no limit (a local run)
    runtime_where: str
    attempts: int
    nodes: int = 1


@dataclass
class Profile:
    name: str  # "local" without --profile
    path: Path | None
    parallel: int  # jobs at once
    retries: int
    _grants: dict = field(default_factory=dict, repr=False)

    def grant(self, rule: str) -> Grant:
        if rule not in self._grants:
            self._grants[rule] = self._grant(rule)
        return self._grants[rule]

    def _grant(self, rule: str) -> Grant:
        res = rule_resources(self.path, rule) if self.path else {}
        plain = {k: v for k, (v, _) in res.items()}
        runtime = res.get("runtime")
        return Grant(
            rule,
            gpus(plain),
            float(runtime[0]) * 60 if runtime else None,
            runtime[1] if runtime else "",
            1 + self.retries,
            int(plain.get("nodes") or 1),
        )


def find_profile(name: str | None, root: Path) -> Profile:
    """The profile `name` (profiles/NAME or a folder with a config.yaml), with profiles/default
    on top; None: a local run (every core, no runtime limit)."""
    default = root / "profiles" / "default"
    base = profile_config(default) if (default / "config.yaml").is_file() else {}
    if name is None:
        cores = base.get("cores", "all")
        parallel = (os.cpu_count() or 1) if cores in ("all", None) else int(cores)
        return Profile("local", None, parallel, int(base.get("retries", 0) or 0))
    where = next((d for d in (root / "profiles" / name, Path(name)) if (d / "config.yaml").is_file()), None)
    if where is None:
        raise ConfigError(f"--profile {name}: no profiles/{name}/config.yaml or {name}/config.yaml")
    cfg = {**profile_config(where), **base}  # the workflow profile's keys win
    parallel = cfg.get("jobs") or (os.cpu_count() or 1)
    return Profile(
        name, where, int(parallel) if str(parallel).isdigit() else os.cpu_count() or 1, int(cfg.get("retries", 0) or 0)
    )
