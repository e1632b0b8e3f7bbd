"""Skill tags: an LLM names the one skill each task exercises most, from a fixed list, into the
`skill` column of the task table (its answer kept in `skill_response`, first 2,000 characters).

The answer is read strictly: the whole answer (or its last line) spelled as a tag, else the one
tag it names; an answer that names no tag of the list, or several, leaves `skill` null and is
counted by reason in the stage's stats, never guessed. One request per task, in `shards` jobs
that resume (otbuild/stagekit/llm_requests.py), as task_score's. A run that tags no task fails,
naming why. An equal (or given) share of each skill is the task filter's draw:
`task_filter.draw: {column: skill, shares: equal}` (docs/task-filter.md).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Annotated

import pyarrow as pa
from pydantic import Field, StringConstraints, field_validator

from otbuild.prompts import render
from otbuild.settings.base import Sharded
from otbuild.settings.engines import LLM
from otbuild.stagekit import Inputs, StageDef, llm_requests, stage_run, stage_run_shard

# what a terminal agent's tasks exercise (a recipe's `tags` replaces the list)
DEFAULT_TAGS = (
    "file-operations",
    "text-processing",
    "shell-scripting",
    "python",
    "data-wrangling",
    "system-administration",
    "networking",
    "version-control",
    "build-and-packaging",
    "debugging",
    "security",
    "databases",
)
NO_TAG, SEVERAL_TAGS, ENGINE_ERROR = "names no tag of the list", "names several tags", "engine error"
Tag = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9 _./+-]*$", max_length=64)]


class Skills(LLM, Sharded):
    """Tag each task with the one skill it exercises most, from `tags`, into the `skill` column
    (an answer naming no tag of the list, or several: null, counted by reason in the stats).
    A draw of equal shares per skill: `task_filter.draw: {column: skill, shares: equal}`."""

    tags: tuple[Tag, ...] = Field(
        default=DEFAULT_TAGS, min_length=2, description="the skills a task may be tagged with"
    )

    @field_validator("tags")
    @classmethod
    def _distinct(cls, tags: tuple[str, ...]) -> tuple[str, ...]:
        lowered = [t.lower() for t in tags]
        if len(set(lowered)) != len(lowered):
            raise ValueError(
                f"a tag is listed twice (case aside): {sorted(t for t in tags if lowered.count(t.lower()) > 1)}"
            )
        return tags


@stage_run_shard
def run_shard(cfg: Skills, inputs: Inputs, outdir: Path, shard: int) -> None:
    """Shard K's requests: one per task, the tag list and its instruction (templates/skills.j2)."""
    ask = llm_requests.one_per_task(inputs, lambda text: render("skills.j2", instruction=text, tags=cfg.tags))
    llm_requests.run_shard("skills", cfg, ask, llm_requests.input_rows(inputs), outdir, shard)


@stage_run
def run(cfg: Skills, inputs: Inputs, outdir: Path) -> dict:
    """Merge: the input rows, streamed, with each one's tag as `skill` and its answer."""
    skills: Counter = Counter()
    untagged: Counter = Counter()
    examples: dict[str, str] = {}

    def columns(got: list[dict]) -> list[list]:
        tags = []
        for a in got:
            tag, reason = (None, ENGINE_ERROR) if a["error"] else pick(a["text"] or "", cfg.tags)
            tags.append(tag)
            if tag:
                skills[tag] += 1
            else:
                untagged[reason] += 1
                examples.setdefault(reason, (a["error"] or a["text"] or "")[:300])
        return [tags, [a["error"] or a["text"][:2000] for a in got]]

    fields = [pa.field("skill", pa.string()), pa.field("skill_response", pa.string())]
    total = llm_requests.write_answered(inputs, outdir, cfg.shards, fields, columns)
    if total and not skills:
        (outdir / "tasks.parquet").unlink()
        why = "; ".join(f"{n} answers {r} (e.g. {examples[r]!r})" for r, n in untagged.most_common())
        raise RuntimeError(f"skills: no task of {total} got a tag of the {len(cfg.tags)} listed: {why}")
    return {
        "tasks": total,
        "tagged": sum(skills.values()),
        "skills": dict(skills.most_common()),
        "untagged": dict(untagged),
        "untagged_examples": examples,
        "shards": llm_requests.shard_records(outdir, cfg.shards),
        "llm_usage": llm_requests.llm_usage(cfg, outdir),
    }


def pick(answer: str, tags: tuple[str, ...]) -> tuple[str | None, str]:
    """The tag an answer names, as listed (and no reason), or None with why: the whole answer (or its last
    line) spelled as a tag, else the one tag it mentions; none or several: no tag."""
    by_name = {t.lower(): t for t in tags}
    lines = [line.strip().strip("`'\".*:- ").lower() for line in answer.strip().splitlines() if line.strip()]
    for line in (" ".join(lines), lines[-1] if lines else ""):
        if line in by_name:
            return by_name[line], ""
    text = answer.lower()
    named = {t for low, t in by_name.items() if re.search(rf"(?<![\w-]){re.escape(low)}(?![\w-])", text)}
    if len(named) == 1:
        return named.pop(), ""
    return None, SEVERAL_TAGS if named else NO_TAG


STAGE = StageDef(
    "skills",
    1,
    ("tasks.parquet",),
    __name__,
    Skills,
    consumes=("tasks",),
    produces="tasks",
    sharded=True,
    llm=True,
    tasks=True,
    counts={"tasks": "tasks"},
    recipe_field=(Skills | None, None),
    estimate="request_per_task",
)
