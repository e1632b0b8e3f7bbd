"""The checkpoint dir of a resumable trainer (SFT and RL alike).

OUTDIR/checkpoints/step-N, latest   DeepSpeed's checkpoints while training (resume from `latest`)
OUTDIR/train_log.jsonl              one line per step; cut back to the resumed step on resume
OUTDIR/checkpoint.json              the artifact's manifest, written last
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

LOG = "train_log.jsonl"
MANIFEST = "checkpoint.json"
CHECKPOINTS = "checkpoints"
# What a rebuild from the same inputs changes in the manifest and the log: measurements and where
# the run was (docs/reproducibility.md). The manifest's `files` holds every file's sha256, event
# files included (their bytes are compared file by file instead).
VOLATILE_MANIFEST_KEYS = {
    "train_seconds": "elapsed time",
    "wall_seconds": "elapsed time",
    "placement": "the hosts and devices",
    "tracking": "TensorBoard's event file names (time, host, pid)",
    "files": "sha256s of the event files too",
}
VOLATILE_LOG_KEYS = {
    "time": "elapsed time",
    "tokens_per_second": "throughput",
    "update_seconds": "elapsed time",
    "rollout_seconds": "elapsed time",
    "sync_seconds": "elapsed time",
}


def save_checkpoint(engine, ckdir: Path, step: int, limit: int, rank: int, client: dict) -> None:
    """DeepSpeed's checkpoint CKDIR/step-STEP (weights, optimizer, scheduler, `client` state) on
    every rank; rank 0 then keeps the newest `limit` of them."""
    engine.save_checkpoint(str(ckdir), tag=f"step-{step}", client_state=client)
    if rank == 0:
        old = sorted((p for p in ckdir.glob("step-*") if p.is_dir()), key=lambda p: int(p.name.split("-")[1]))[:-limit]
        for p in old:
            shutil.rmtree(p, ignore_errors=True)


def truncate_log(path: Path, step: int) -> None:
    """Keep the log lines of steps up to the resumed one: a resumed run adds no duplicates."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("step", 0) <= step:
            keep.append(line)
    path.write_text("".join(x + "\n" for x in keep))
