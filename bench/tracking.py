"""Per-step cost of experiment tracking (otbuild/train/tracking.py) in the training loops.

    python bench/tracking.py [--steps 2000] [--out DIR]

Each mode logs `--steps` records shaped like a train_log.jsonl line (14 numbers) into a fresh
dir under --out (default: a temporary dir, removed after) and reports the mean time per step
and, apart, the one-off cost of opening and closing (imports, the event writer's final flush,
wandb's start and finish), paid once per run:

- jsonl: the baseline, the train_log.jsonl line the loops always write (json.dumps, write, flush);
- tensorboard: Tracker with TensorBoard event files (the default);
- tensorboard+wandb: the same plus a wandb run in offline mode (when wandb is installed).

Target: tracking adds < 1 ms per optimizer step (a tiny-student CPU step takes tens of ms, a
GPU step of an 8B model seconds).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import tempfile
import time
from pathlib import Path

from otbuild.settings.train import Tracking
from otbuild.train.tracking import Tracker


def record(step: int) -> dict:
    return {
        "step": step,
        "epoch": round(step / 100, 4),
        "loss": 3.0 * math.exp(-step / 500) + 0.4,
        "lr": 4e-5,
        "grad_norm": 1.0 / step,
        "tokens": 98304,
        "tokens_per_second": 21000.5,
        "supervised_tokens": 40000,
        "tokens_seen": 98304 * step,
        "supervised_tokens_seen": 40000 * step,
        "time": 0.5 * step,
        "copy_loss": 0.1,
        "kl": 0.0,
        "reward_mean": 0.5,
    }


def jsonl(outdir: Path, steps: int) -> tuple[float, float]:
    """(seconds of the steps, seconds of opening and closing)"""
    t = time.perf_counter()
    with open(outdir / "train_log.jsonl", "a") as f:
        for s in range(1, steps + 1):
            f.write(json.dumps(record(s)) + "\n")
            f.flush()
    return time.perf_counter() - t, 0.0


def tracked(tracking: dict):
    def run(outdir: Path, steps: int) -> tuple[float, float]:
        t0 = time.perf_counter()
        tracker = Tracker(Tracking(**tracking), stage="sft", outdir=outdir, first_step=1, config={})
        t1 = time.perf_counter()
        for s in range(1, steps + 1):
            tracker.log(record(s))
        t2 = time.perf_counter()
        tracker.close()
        return t2 - t1, t1 - t0 + time.perf_counter() - t2

    return run


def main() -> None:
    from outdir import out_dir  # bench/outdir.py: --out is made, or refused (exit 2)

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--out", type=out_dir, default=None)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="otbuild-bench-tracking-", dir=args.out))
    modes = {"jsonl": jsonl, "tensorboard": tracked({"tensorboard": True})}
    try:
        import wandb  # noqa: F401

        os.environ["WANDB_MODE"] = "offline"
        modes["tensorboard+wandb"] = tracked({"tensorboard": True, "wandb": {"project": "bench", "dir": str(root)}})
    except ImportError:
        print("wandb is not installed: its mode is left out")
    try:
        results = {}
        for name, fn in modes.items():
            d = root / name
            d.mkdir()
            steps_s, once_s = fn(d, args.steps)
            results[name] = (steps_s / args.steps * 1e6, once_s)
        base = results["jsonl"][0]
        print(f"\n{args.steps} steps; baseline: jsonl (the train_log.jsonl line)")
        print(f"{'mode':<20}{'us/step':>10}{'x jsonl':>10}{'added us/step':>15}{'open+close s':>14}")
        for name, (us, once) in results.items():
            print(f"{name:<20}{us:>10.1f}{us / base:>10.1f}{us - base:>15.1f}{once:>14.2f}")
        worst = max(us for us, _ in results.values()) - base
        print(f"target: tracking adds < 1000 us/step: {'PASS' if worst < 1000 else 'FAIL'}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
