"""`estimate()`: the count model over a plan with its pilots and profile, the totals, how far each
assumed rate moves them, the warnings and the profile's flags."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from otbuild.estimate.check import profile_flags
from otbuild.estimate.model import Model, StageEstimate
from otbuild.estimate.pilot import SMALL_PILOT, Pilot
from otbuild.estimate.profile import Profile
from otbuild.span import ZERO, Span
from otbuild.stages import STAGES

METRICS = ("gpu_hours", "cost", "wall_s")


@dataclass
class Estimate:
    recipe: str
    profile: Profile
    pilots: list[Pilot]
    stages: list[StageEstimate]
    total: dict[str, Span | None]
    sensitivity: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    # a search: each stage's grid in full, nothing shared between stages (the totals: as if every
    # stage's default won, so that a candidate equal to the last winner is shared)
    worst: dict[str, Span | None] | None = None

    def json(self) -> dict:
        def span(v):
            return v.json() if isinstance(v, Span) else None

        return {
            "recipe": self.recipe,
            "made_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "profile": {
                "name": self.profile.name,
                "parallel_jobs": self.profile.parallel,
                "attempts": 1 + self.profile.retries,
            },
            "pilots": [p.name for p in self.pilots],
            "stages": {
                s.label: {
                    "stage": s.stage,
                    "id": s.id,
                    "built": s.built,
                    "counts": {k: v.json() for k, v in s.counts.items()},
                    "requests": s.requests.json(),
                    "input_tokens": s.input_tokens.json(),
                    "output_tokens": s.output_tokens.json(),
                    "cost": span(s.cost),
                    "model": s.model,
                    "gpu_hours": s.gpu_hours.json(),
                    "job_seconds": s.job_seconds.json(),
                    "wall_seconds": s.wall_s.json(),
                    "jobs": [
                        {
                            "rule": j.rule,
                            "count": j.count,
                            "seconds": j.seconds.json(),
                            "gpus": j.grant.gpus,
                            "runtime_s": j.grant.runtime_s,
                            "attempts": j.grant.attempts,
                        }
                        for j in s.jobs
                    ],
                    "rates": [r.json() for r in s.rates],
                    "notes": s.notes,
                }
                for s in self.stages
            },
            "total": {k: span(v) for k, v in self.total.items()},
            **({"worst": {k: span(v) for k, v in self.worst.items()}} if self.worst else {}),
            "assumptions": self.sensitivity,
            "warnings": self.warnings,
            "profile_flags": self.flags,
        }


def totals(model: Model) -> dict[str, Span | None]:
    st = model.stages
    costs = [s.cost for s in st if s.cost is not None]
    return {
        "requests": sum((s.requests for s in st), ZERO),
        "input_tokens": sum((s.input_tokens for s in st), ZERO),
        "output_tokens": sum((s.output_tokens for s in st), ZERO),
        "cost": sum(costs, ZERO) if costs else None,
        "gpu_hours": sum((s.gpu_hours for s in st), ZERO),
        "job_seconds": sum((s.job_seconds for s in st), ZERO),
        "wall_s": model.critical_path(),
    }


def estimate(plan, pilots: list[Pilot], profile: Profile, root: Path = Path(".")) -> Estimate:
    base = Model(plan, pilots, profile, root).run()
    total = totals(base)
    est = Estimate(plan.recipe.name, profile, pilots, base.stages, total)
    for (stage, name), rate in base.assumed.items():
        moves = {}
        for side in ("low", "high"):
            t = totals(Model(plan, pilots, profile, root, force={(stage, name): side}).run())
            moves[side] = {k: (v.estimate if (v := t[k]) is not None else None) for k in METRICS}
        swing = {k: (moves["high"][k] or 0) - (moves["low"][k] or 0) for k in METRICS}
        est.sensitivity.append(
            {
                "stage": stage,
                **rate.json(),
                "totals_at_low": moves["low"],
                "totals_at_high": moves["high"],
                "swing": swing,
            }
        )
    est.sensitivity.sort(key=lambda a: tuple(-_share(a["swing"][k], total[k]) for k in METRICS))
    est.warnings = [
        f"{source}: too few items to say much ({', '.join(dict.fromkeys(names))}): the ranges are wide; "
        f"a pilot of at least {SMALL_PILOT} says more"
        for source, names in base.small.items()
    ]
    est.warnings += _count_warnings(plan, base)
    est.flags = profile_flags(base.stages)
    if plan.search:
        est.worst = _worst(plan, pilots, profile, root)
    return est


def _worst(plan, pilots: list[Pilot], profile: Profile, root: Path) -> dict[str, Span | None]:
    """A search's upper bound: the sum of each stage's estimate by itself (its candidates, their
    inputs, its ranking and decision), so nothing is shared between stages."""
    from otbuild.plan import Plan, topological

    parts = [
        totals(Model(Plan(plan.recipe, topological([s.decide])), pilots, profile, root).run()) for s in plan.search
    ]
    out: dict[str, Span | None] = {}
    for k in parts[0]:
        values = [v for p in parts if (v := p[k]) is not None]
        out[k] = sum(values, ZERO) if values else None
    return out


def _share(swing: float | None, total: Span | None) -> float:
    return (swing or 0) / total.estimate if total is not None and total.estimate else 0.0


def _count_warnings(plan, model: Model) -> list[str]:
    out = []
    for s in model.stages:
        keep = next((r for r in s.rates if r.name == "keep_rate"), None)
        if STAGES[s.stage].traces and STAGES[s.stage].filter and not s.built and keep is not None:
            kept, cap = s.counts["traces_kept"], plan_sample(plan)
            if cap and kept.estimate < cap:
                out.append(
                    f"{s.label}: sample.n asks for {cap:,} traces but about {kept.estimate:,.0f} "
                    f"({kept.low:,.0f}-{kept.high:,.0f}) will be left at a keep rate of "
                    f"{keep.value.estimate:.2f} ({keep.source}); set task_filter.score.keep_rate to the "
                    "rate a pilot measures"
                )
            elif keep.assumed:
                out.append(
                    f"{s.label}: its keep rate is assumed ({keep.value.estimate:.2f}): no pilot measured "
                    "it with this teacher and these rules; a pilot of this recipe's teacher would"
                )
    return out


def plan_sample(plan) -> int | None:
    tf = plan.recipe.recipe.trace_filter
    return tf.sample.n if tf and tf.sample else None
