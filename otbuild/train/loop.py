"""The training loop SFT and RL share: each plugs its step into it (otbuild/train/sft.py, rl.py).

A trainer is a `Trainer`: its settings, its DeepSpeed engine, how many steps, and what one step
does. `run(trainer, outdir, log)` does the rest, alike for both, on every rank:
- resume: from DeepSpeed's `checkpoints/latest` when there is one (the trainer restores its
  counters from the checkpoint's client state), train_log.jsonl cut back to that step;
- each step: its record appended to train_log.jsonl and sent to the tracker (rank 0;
  otbuild/train/tracking.py), the progress shown (otbuild/progress.py), and every `save_steps`
  a resumable checkpoint (otbuild/train/checkpoint.py);
- the end: where each rank ran (`placement`), the weights and tokenizer saved by rank 0, the
  resume state removed, then the manifest `checkpoint.json`, written last: the trainer's own
  fields, the run's (steps, world size, placement, tracking) and every file with its sha256.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from otbuild.artifact import top_files
from otbuild.fsio import write_json
from otbuild.hashing import file_sha256
from otbuild.progress import StepProgress
from otbuild.train.checkpoint import CHECKPOINTS, LOG, MANIFEST, save_checkpoint, truncate_log
from otbuild.train.dist import placement
from otbuild.train.tracking import Tracker

if TYPE_CHECKING:
    from otbuild.settings.stages import RlSettings, SftSettings


class Trainer:
    """What a trainer plugs into `run`. Set by the subclass: `kind` ("sft", "rl": the log's
    prefix, the tracker's stage), `cfg` (its settings: `save_steps`, `tracking`), `engine` (the
    DeepSpeed engine), `total_steps`."""

    kind: str
    cfg: SftSettings | RlSettings  # each subclass its own
    engine: Any  # DeepSpeed's engine (untyped)
    total_steps: int
    save_limit = 1  # resumable checkpoints kept
    keep_checkpoints = False  # keep checkpoints/ after the final save
    log_every = StepProgress.LOG_EVERY  # seconds between two step lines in the log (0: every step)

    def restore(self, client: dict) -> None:
        """Resuming: the counters from a checkpoint's client state (what client_state gave)."""

    def client_state(self) -> dict:
        """What a checkpoint keeps beside DeepSpeed's state and the step."""
        return {}

    def step(self, step: int) -> dict:
        """Optimizer step `step` + 1, on every rank: its line of train_log.jsonl."""
        raise NotImplementedError

    def note(self, rec: dict) -> str:
        """The step's progress note ("loss 0.53")."""
        raise NotImplementedError

    def close(self) -> None:
        """After the steps, also when one failed."""

    def weights(self) -> tuple[Any, Any, dict | None]:
        """On every rank (a ZeRO-3 state is gathered): (model, tokenizer, state dict to save or
        None for the model's own)."""
        raise NotImplementedError

    def finish(self, outdir: Path) -> dict:
        """Rank 0, once the weights are saved: remove what only training needed; the trainer's
        own fields of the manifest."""
        raise NotImplementedError


def run(t: Trainer, outdir: Path, log) -> dict:
    """Train `t` into `outdir` (resuming) and write the artifact; the manifest (rank 0, {} on
    the other ranks)."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    ckdir = outdir / CHECKPOINTS
    step = 0
    if (ckdir / "latest").exists():
        _, client = t.engine.load_checkpoint(str(ckdir))
        step = client["step"]
        t.restore(client)
        log(f"{t.kind}: resumed from step {step} of {t.total_steps}")
    if rank == 0:
        truncate_log(outdir / LOG, step)
    logf = open(outdir / LOG, "a") if rank == 0 else None  # noqa: SIM115
    tracker = Tracker(
        t.cfg.tracking,
        stage=t.kind,
        outdir=outdir,
        first_step=step + 1,
        config=t.cfg.model_dump(mode="json"),
        active=rank == 0,
    )
    progress = StepProgress(t.kind.upper(), t.total_steps, step, log if rank == 0 else None, every=t.log_every)
    try:
        while step < t.total_steps:
            rec = t.step(step)
            step += 1
            if logf:
                logf.write(json.dumps(rec) + "\n")
                logf.flush()
            tracker.log(rec)
            progress.step(step, t.note(rec))
            if step % t.cfg.save_steps == 0 and step < t.total_steps:
                save_checkpoint(t.engine, ckdir, step, t.save_limit, rank, {"step": step, **t.client_state()})
                tracker.flush()
                log(f"{t.kind}: checkpoint step {step}")
    finally:
        progress.finish()
        if logf:
            logf.close()
        tracked = tracker.close()
        t.close()

    places = [None] * world
    dist.all_gather_object(places, placement(t.engine.device))
    model, tok, state = t.weights()
    manifest = {}
    if rank == 0:
        model.save_pretrained(outdir, state_dict=state, safe_serialization=True, max_shard_size="10000GB")
        tok.save_pretrained(outdir)
        if not t.keep_checkpoints:
            shutil.rmtree(ckdir, ignore_errors=True)
        manifest = {
            "kind": t.kind,
            **t.finish(outdir),
            "steps": step,
            "world_size": world,
            "placement": places,
            "tracking": tracked,
        }
        manifest["files"] = {p.name: file_sha256(p) for p in top_files(outdir) if p.name != MANIFEST}
        write_json(outdir / MANIFEST, manifest)
    dist.barrier()
    return manifest
