"""Source: one task parquet per recipe source, plus the items it had to quarantine."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from otbuild.sources import read_source
from otbuild.tasks.table import Quarantined, TaskRecord, write_quarantine, write_tasks


def run(settings: dict, inputs: list[Path], outdir: Path) -> dict:
    name = settings["name"]
    quarantined: list[Quarantined] = []

    def tasks() -> Iterator[TaskRecord]:
        for item in read_source(settings):
            if isinstance(item, Quarantined):
                quarantined.append(item)
            else:
                yield item

    n = write_tasks(outdir / "tasks.parquet", tasks(), source=name)
    reasons = dict(Counter(q.reason for q in quarantined))
    if n == 0 and not settings.get("allow_empty", True):
        raise EmptySourceError(f"source {name!r}: no usable task in {settings['path']}: "
                               + (f"{len(quarantined)} item(s) quarantined ({_reasons(reasons, quarantined)})"
                                  if quarantined else "nothing there to read")
                               + "; set `allow_empty: true` on the source if that is expected")
    return {"tasks": n, "quarantined": write_quarantine(outdir / "quarantine.parquet", quarantined, name),
            "quarantined_by_reason": reasons}


class EmptySourceError(ValueError):
    pass


def _reasons(reasons: dict[str, int], quarantined: list[Quarantined]) -> str:
    """Counts per reason, each with its first item and detail."""
    first = {}
    for q in quarantined:
        first.setdefault(q.reason, q)
    return "; ".join(f"{count} {reason}, e.g. {first[reason].name}"
                     + (f": {first[reason].detail}" if first[reason].detail else "")
                     for reason, count in sorted(reasons.items(), key=lambda kv: -kv[1]))
