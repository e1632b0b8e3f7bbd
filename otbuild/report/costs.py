"""Tokens, time and money of a recipe's artifacts, for the report and `otbuild costs`.

- Tokens: each LLM stage's `llm_usage` stats (otbuild/usage.py), per model; a cost where the
  recipe's `prices` name the model (as ENGINE:MODEL, e.g. `openai:gpt-5-nano`, or MODEL alone).
- Time: the Snakemake benchmark of each of the artifact's jobs (`benchmarks/<stage>/<id>.tsv`,
  a sharded stage's `benchmarks/<stage>/<id>/K-of-N.tsv` and `merge.tsv`): wall-clock seconds
  and peak resident memory (max_rss, MB).
- GPU-hours: a job's seconds x the GPUs its resources asked for, as the benchmark's extended
  format records them (profiles/default sets `benchmark-extended`): `gres: gpu[:MODEL]:N` is N
  per node, times `nodes` (default 1); else `gpu` (the Slurm plugin's GPUs for the whole job);
  else 0. So a job counts the GPUs the profile gave it, used or not; a local run that sets no
  GPU resource counts none.
"""

from __future__ import annotations

import ast
import csv
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from otbuild.stages import STAGES
from otbuild.usage import KEYS, cost

if TYPE_CHECKING:
    from otbuild.settings.recipe import Price

BENCHMARKS = Path("benchmarks")
GRES_GPUS = re.compile(r"(?:^|,)gpu(?::[^:,]+)?:(\d+)")


@dataclass
class Usage:
    """One model's requests and tokens in one artifact."""

    label: str
    stage: str
    model: str
    requests: int
    errors: int
    input_tokens: int
    output_tokens: int
    cost: float | None  # None: no price for the model
    engine: str | None = None  # the engine that served it and its release, e.g. "vllm 0.32.0"


@dataclass
class Runtime:
    """The jobs of one artifact, from their benchmark files."""

    label: str
    stage: str
    id: str
    jobs: int
    seconds: float
    peak_rss_mb: float | None
    gpus: int  # the most any of its jobs asked for
    gpu_hours: float


@dataclass
class Costs:
    usage: list[Usage] = field(default_factory=list)
    runtimes: list[Runtime] = field(default_factory=list)
    unpriced: list[str] = field(default_factory=list)  # models used without a price
    unrecorded: list[str] = field(default_factory=list)  # LLM artifacts built before usage was recorded

    @property
    def total(self) -> dict:
        priced = [u.cost for u in self.usage if u.cost is not None]
        return {
            **{k: sum(getattr(u, k) for u in self.usage) for k in KEYS},
            "cost": sum(priced) if priced else None,
            "seconds": sum(r.seconds for r in self.runtimes),
            "gpu_hours": sum(r.gpu_hours for r in self.runtimes),
        }


def collect(artifacts, prices: dict[str, Price] | None, root: Path = Path(".")) -> Costs:
    """`artifacts`: otbuild.report.data.Artifact's (label, stage, id, stats), each id once."""
    out = Costs()
    seen = set()
    for a in artifacts:
        if (a.stage, a.id) in seen:
            continue
        seen.add((a.stage, a.id))
        usage = a.stats.get("llm_usage")
        if usage is None and a.stage in STAGES and STAGES[a.stage].llm and a.record is not None:
            out.unrecorded.append(a.label)
        for model, u in sorted((usage or {}).items()):
            price = price_of(model, prices or {})
            if price is None and u.get("input_tokens", 0) + u.get("output_tokens", 0) > 0:
                out.unpriced.append(model)
            requests, errors, input_tokens, output_tokens = (int(u.get(k, 0)) for k in KEYS)
            out.usage.append(
                Usage(
                    a.label,
                    a.stage,
                    model,
                    requests,
                    errors,
                    input_tokens,
                    output_tokens,
                    cost(u, price),
                    served_by(a.stats, model),
                )
            )
        if runtime := _runtime(a, root):
            out.runtimes.append(runtime)
    out.unpriced = sorted(set(out.unpriced))
    return out


def served_by(stats: dict, model: str) -> str | None:
    """Which engine release answered `model` (ENGINE:MODEL) in an artifact: a rollout's or
    eval's `engines` (per model), an RL run's `rollout_engines`; None where none was recorded."""
    if version := (stats.get("engines") or {}).get(model):
        return f"{model.partition(':')[0]} {version}"
    engines = stats.get("rollout_engines") or []
    return ", ".join(engines) or None


def price_of(model: str, prices: dict[str, Price]) -> Price | None:
    """The price for ENGINE:MODEL, set as that or as MODEL alone."""
    return prices.get(model) or prices.get(model.partition(":")[2])


def benchmark_files(stage: str, id: str, root: Path = Path(".")) -> list[Path]:
    base = root / BENCHMARKS / stage
    return sorted(p for p in [base / f"{id}.tsv", *(base / id).glob("*.tsv")] if p.is_file())


def _runtime(a, root: Path) -> Runtime | None:
    jobs = [j for p in benchmark_files(a.stage, a.id, root) for j in read_benchmark(p)]
    if not jobs:
        return None
    rss = [j["max_rss"] for j in jobs if j["max_rss"] is not None]
    return Runtime(
        a.label,
        a.stage,
        a.id,
        len(jobs),
        sum(j["s"] for j in jobs),
        max(rss) if rss else None,
        max(j["gpus"] for j in jobs),
        sum(j["s"] * j["gpus"] for j in jobs) / 3600,
    )


def read_benchmark(path: Path) -> list[dict]:
    """A Snakemake benchmark TSV: per run, seconds, max_rss (MB, None when not sampled) and the
    GPUs of the job's resources (0 in the plain format, which has none)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    return [
        {"s": float(r["s"]), "max_rss": _number(r.get("max_rss")), "gpus": gpus(_dict(r.get("resources")))}
        for r in rows
    ]


def gpus(resources: dict) -> int:
    """GPUs a job asked for: `gres` gpu:[MODEL:]N per node x `nodes`, else `gpu`, else 0."""
    m = GRES_GPUS.search(str(resources.get("gres") or ""))
    if m:
        return int(m.group(1)) * int(resources.get("nodes") or 1)
    try:
        return int(resources.get("gpu") or 0)
    except (TypeError, ValueError):
        return 0


def _number(v) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None  # "NA": the job ended before Snakemake sampled it


def _dict(v) -> dict:
    try:
        d = ast.literal_eval(v) if v else {}
    except (ValueError, SyntaxError):
        return {}
    return d if isinstance(d, dict) else {}
