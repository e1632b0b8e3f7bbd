"""What a search leaves behind (docs/search.md): the path it took, stage by stage, and its
winner as a plain recipe (results/NAME/search.json, results/NAME/winner.yaml), and the lines
the console and `otbuild plan` show of it."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import yaml

from otbuild.fsio import atomic_path
from otbuild.plan import Plan, SearchStep
from otbuild.recipe.ablate import points, set_value

SEARCH_JSON, WINNER = "search.json", "winner.yaml"


def path_taken(plan: Plan) -> list[dict]:
    """Each stage of the search: its grid and decision (None while pending), in order."""
    out = []
    for s in plan.search:
        d = s.decision or {}
        out.append(
            {
                "step": s.step,
                "grid": s.grid,
                "candidates": s.candidates,
                "default": s.default,
                "decision_id": s.decide.id,
                "winner": d.get("winner"),
                "values": d.get("values"),
                "decided": d.get("decided"),
                "reason": d.get("reason"),
                "margin": d.get("margin"),
                "leader": d.get("leader"),
            }
        )
    return out


def done(plan: Plan) -> bool:
    """Every stage of the recipe's search is decided."""
    return len(plan.search) == len(plan.recipe.recipe.search) and plan.pending is None


def winner_document(plan: Plan) -> dict:
    """The search's winner as a plain recipe: the recipe's document, `extends` resolved, without
    its search, with every stage's winning values set (its nodes are the last winner's)."""
    data = copy.deepcopy(plan.recipe.data)
    data.pop("search")
    data.pop("decision", None)
    for s in plan.search:
        for key, value in (s.decision or {}).get("values", {}).items():
            set_value(data, key, value, plan.recipe)
    return {
        "description": f"The winner of search {plan.recipe.name} (results/{plan.recipe.name}/{SEARCH_JSON}).",
        **{k: v for k, v in data.items() if k != "description"},
    }


def write_search(plan: Plan, out: Path) -> list[Path]:
    """results/NAME/search.json (the path taken) and, once every stage is decided, winner.yaml."""
    written = [out / SEARCH_JSON]
    with atomic_path(out / SEARCH_JSON) as tmp:
        tmp.write_text(
            json.dumps(
                {"recipe": plan.recipe.name, "done": done(plan), "stages": path_taken(plan)},
                indent=2,
                sort_keys=True,
                default=str,
            )
            + "\n"
        )
    if done(plan):
        written.append(out / WINNER)
        with atomic_path(out / WINNER) as tmp:
            tmp.write_text(yaml.safe_dump(winner_document(plan), sort_keys=False))
    return written


def stage_line(s: SearchStep, total: int) -> str:
    """One stage of a search in words: decided, undecided (the default kept) or pending."""
    head = f"search stage {s.step} of {total} ({', '.join(s.grid)}; {len(s.candidates)} candidates)"
    d = s.decision
    if d is None:
        return f"{head}: pending: builds {', '.join(s.candidates)}, then decides"
    if d["decided"]:
        return f"{head}: decided: {d['winner']} ({d['reason']})"
    return f"{head}: UNDECIDED, kept the default {d['winner']} ({d['reason']})"


def search_lines(plan: Plan) -> list[str]:
    """The search's stages as the console and `otbuild plan` show them, the unplanned ones too."""
    total = len(plan.recipe.recipe.search)
    lines = [stage_line(s, total) for s in plan.search]
    lines += [
        f"search stage {k} of {total} ({', '.join(grid)}): pending: builds {', '.join(points(grid))} with "
        f"the winners so far, once stage {k - 1} is decided"
        for k, grid in enumerate(plan.recipe.recipe.search[len(plan.search) :], len(plan.search) + 1)
    ]
    return lines
