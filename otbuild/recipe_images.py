"""Before a build: the distinct base images a recipe's tasks start FROM, and whether podman
has each (`otbuild validate --images`), so a missing one shows before any GPU job starts."""

from __future__ import annotations

from collections import Counter

from otbuild.settings.trials import trials_of
from otbuild.sources import read_source
from otbuild.stages import STAGES
from otbuild.tasks.base_image import task_base_images
from otbuild.tasks.table import Quarantined


def base_image_counts(plan) -> tuple[Counter, list[str]]:
    """Image -> number of the recipe's tasks (sources and benchmarks) that run in it here:
    every task under `sandbox: podman`, under `auto` those the host cannot stand in for
    (`needs_image`); none when trials run only on bwrap, unshare or Harbor's own environments.
    Streamed from each source's own files. Also the recipe keys of the sources that could not
    be read (their files are not there yet): their images are unknown."""
    from otbuild.sandbox import needs_image

    backends = trial_backends(plan)
    counts: Counter = Counter()
    unread: dict[str, str] = {}  # id -> key (a node an ablation's candidates share: once)
    for node in plan.nodes:
        if STAGES[node.stage].brings != "tasks" or not backends & {"podman", "auto"}:
            continue
        if node.missing:
            unread.setdefault(node.id, ", ".join(m.key for m in node.missing))
            continue
        for item in read_source(node.config):
            if not isinstance(item, Quarantined) and ("podman" in backends or needs_image(item.task)):
                counts.update(set(task_base_images(item.task)))
    return counts, list(unread.values())


def trial_backends(plan) -> set[str]:
    """The sandboxes the recipe's trials (rollouts, eval, RL) run in."""
    return {trials_of(n.config).sandbox for n in plan.nodes if STAGES[n.stage].trials}


def image_presence(images) -> dict[str, bool | None]:
    """Image -> present in podman's storage; None for all when podman cannot run here."""
    from otbuild.sandbox import backend_problem
    from otbuild.sandbox.podman.images import image_exists

    if backend_problem("podman") is not None:
        return dict.fromkeys(images)
    return {image: image_exists(image) for image in images}
