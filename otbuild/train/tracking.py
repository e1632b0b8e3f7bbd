"""Experiment tracking for the training loops: every step's numbers (what train_log.jsonl gets)
also go to TensorBoard event files and, when a recipe configures it, to a wandb run.

- TensorBoard (`tracking.tensorboard`, on by default): `events.out.tfevents.*` files at the top
  of the checkpoint dir, so the manifest and the provenance record list them with their sha256
  like every other file of the artifact (`tensorboard --logdir <checkpoint dir>`). Tags are
  `train/<key>` of train_log.jsonl, named as the Hugging Face Trainer names them
  (`lr` is `train/learning_rate`). A resumed
  run writes a new event file that starts with a purge marker at its first step: readers drop
  the killed run's steps from there on, so every step is shown once.
- wandb (`tracking.wandb: {project: ...}`): imported only then. The run's id is the stage and
  its content id (a resumed run continues it); its files go to `<dir>/wandb/` (default dir: the
  checkpoint dir, whose subdirs are not part of the artifact record: `wandb sync` writes there).
  `mode` (or WANDB_MODE) `offline` keeps everything on disk.

Only rank 0 tracks; `log` is called once per optimizer step and costs well under a millisecond
(the event writer queues to a thread; `flush` at every checkpoint, so a run killed -9 and
resumed from it loses no step of the curves).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from otbuild.errors import ConfigError
from otbuild.settings.train import Tracking, WandbTracking

# TensorBoard names its event files by the time, host and pid, and stamps every event with the
# wall clock: a rebuild compares how many there are, not their bytes (docs/reproducibility.md).
VOLATILE_FILES = ("events.out.tfevents.*",)
PREFIX = "train/"  # the tag of a logged value: train/loss, train/learning_rate, ...
# train_log.jsonl's keys that the Hugging Face Trainer logs under another name: the tags follow
# the Trainer's, so curves from both line up in one TensorBoard or wandb project
HF_TRAINER_NAMES = {"lr": "learning_rate"}


def tag(key: str) -> str:
    """The TensorBoard tag and wandb key of a train_log.jsonl key."""
    return PREFIX + HF_TRAINER_NAMES.get(key, key)


class Tracker:
    def __init__(
        self, tracking: Tracking, *, stage: str, outdir: Path, first_step: int, config: dict, active: bool = True
    ):
        """`tracking`: the stage's `tracking` settings; `first_step`: the first step this run logs
        (1, or the resumed step + 1); `config`: the settings recorded with a wandb run."""
        self.stage, self.outdir = stage, Path(outdir)
        self.writer = self.run = None
        self._before = set()
        if not active:
            return
        if tracking.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:
                raise ConfigError(
                    f"{stage}.tracking.tensorboard: the `tensorboard` package is missing "
                    "(pip install 'otbuild[train]'), or set it to false"
                ) from e
            self._before = set(self.event_files())
            self.writer = SummaryWriter(
                log_dir=str(self.outdir), purge_step=first_step if first_step > 1 else None, filename_suffix=f".{stage}"
            )
        if tracking.wandb:
            self.run = _wandb_run(tracking.wandb, stage=stage, outdir=self.outdir, config=config)

    def log(self, rec: dict) -> None:
        """One step's record (train_log.jsonl's line): its finite numbers, at rec['step']."""
        if self.writer is None and self.run is None:
            return
        step = int(rec["step"])
        values = {
            tag(k): float(v)
            for k, v in rec.items()
            if k != "step" and isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        }
        if self.writer is not None:
            for name, v in values.items():
                self.writer.add_scalar(name, v, step)
        if self.run is not None:
            self.run.log(values, step=step)

    def flush(self) -> None:
        """Called with each resumable checkpoint: what a resumed run will not log again is on disk."""
        if self.writer is not None:
            self.writer.flush()

    def event_files(self) -> list[str]:
        return sorted(p.name for p in self.outdir.glob("events.out.tfevents.*") if p.is_file())

    def close(self) -> dict:
        """Flush and close; what the manifest records (event files, the wandb run)."""
        out: dict[str, dict[str, Any]] = {}
        if self.writer is not None:
            self.writer.close()
            out["tensorboard"] = {
                "files": self.event_files(),
                "this_run": sorted(set(self.event_files()) - self._before),
            }
        if self.run is not None:
            out["wandb"] = {
                "project": self.run.project,
                "id": self.run.id,
                "dir": str(Path(self.run.dir).parent),
                "offline": bool(self.run.offline),
            }
            self.run.finish()
        self.writer = self.run = None
        return out


def _wandb_run(wb: WandbTracking, *, stage: str, outdir: Path, config: dict):
    try:
        import wandb
    except ImportError as e:
        raise ConfigError(
            f"{stage}.tracking.wandb is set but the `wandb` package is missing "
            "(pip install wandb), or remove the setting"
        ) from e
    root = Path(wb.dir or outdir)
    root.mkdir(parents=True, exist_ok=True)
    return wandb.init(
        project=wb.project,
        entity=wb.entity,
        name=wb.name or f"{stage}-{outdir.name}",
        tags=list(wb.tags) or None,
        dir=str(root),
        mode=wb.mode,
        config=config,
        id=f"{stage}-{outdir.name}",
        resume="allow",
        job_type=stage,
        settings=wandb.Settings(console="off", save_code=False, disable_git=True),
    )
