"""Source adapter: a folder of Harbor task dirs (one subdir per task)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from otbuild.settings.recipe import PathSource
from otbuild.tasks.harbor_meta import harbor_record, load_dir, task_subdirs
from otbuild.tasks.table import Quarantined, TaskRecord


def read(cfg: PathSource) -> Iterator[TaskRecord | Quarantined]:
    """Yield one TaskRecord or Quarantined per task subdir of `cfg.path`, sorted by name."""
    for sub in task_subdirs(Path(cfg.path)):
        task = load_dir(sub)
        yield task if isinstance(task, Quarantined) else harbor_record(task)
