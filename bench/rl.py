"""RL step times, side by side in one run:

- `--part sync` (rollout: vllm): a step's time split (weight sync, rollouts, update) when each
  step's policy is served by a new `vllm serve` (weight_sync: restart) against one live server
  whose weights are reloaded in place (weight_sync: reload);
- `--part staleness` (rollouts in process): the same steps with max_staleness 0 (synchronous)
  and 1 (the next step's rollouts run while this step's update trains), their wall time and
  its ratio, on tasks whose verifier flips a coin (so every step has advantages and a real
  update), after an untimed warm-up run.

    python bench/rl.py [--part all|sync|staleness] [--steps 3] [--tasks 2] [--samples 2]
                       [--max-tokens 16] [--out DIR] [--eager]

Every run trains the same tiny Qwen3 student (random weights, the smoke student's shape) with
otbuild's RLOO trainer (otbuild/train/rl/) on the same synthetic tasks, through the harness
and bwrap sandboxes; `sync` with the real vLLM (.venv-vllm: its CPU build here), left out
(saying so) where it is not installed. Printed per mode and step: how the weights got to the
server (start / reload), seconds to sync them, to roll out and to update; the mean sync of the
steps after the first in each mode and their ratio (the first step starts a server in both);
then each staleness's wall time and the ratio. Exit status: 0 when every run finished, 2
otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

MODES = ("restart", "reload")


def student(dest: Path) -> Path:
    from otbuild.engines.tiny import make_tiny_model
    from otbuild.train.chat import QWEN3_SPECIAL, qwen3_template

    make_tiny_model(
        dest,
        arch="qwen3",
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=1024,
        max_position_embeddings=4096,
        chat_template=qwen3_template(),
        special_tokens=QWEN3_SPECIAL,
    )
    (dest / "checkpoint.json").write_text("{}")
    return dest / "checkpoint.json"


def run_mode(mode: str, checkpoint: Path, tasks: Path, args, work: Path) -> list[dict]:
    from otbuild.settings.stages import RlSettings
    from otbuild.train.rl.trainer import train

    cfg = RlSettings(
        steps=args.steps,
        batch_size=args.tasks,
        samples_per_task=args.samples,
        max_tokens=args.max_tokens,
        max_context=4096,
        learning_rate=1e-3,
        temperature=1.0,
        rollout="vllm",
        weight_sync=mode,
        prompt="compact",
        sandbox={"max_episodes": 2},
        vllm_args={
            "dtype": "float32",
            "max_model_len": 4096,
            "enforce_eager": args.eager,
            "log_path": str(work / f"vllm-{mode}.log"),
        },
    )
    out = work / f"rl-{mode}"
    train(cfg, [checkpoint, tasks], out)
    return [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]


def coin_tasks(dest: Path, n: int) -> Path:
    """Tasks whose verifier flips a coin: the random student earns rewards that differ within a
    task, so every step has advantages and a real update (its answers never solve a task)."""
    from otbuild.tasks.table import TaskRecord, write_tasks
    from otbuild.tasks.taskdir import TaskDir

    records = []
    for i in range(n):
        t = TaskDir(f"coin-{i}")
        t.add("instruction.md", f"Print the number {i}.\n")
        t.add("tests/test.sh", "#!/bin/bash\necho $((RANDOM % 2)) > /logs/verifier/reward.txt\n", executable=True)
        records.append(TaskRecord(t, runnable_locally=True))
    write_tasks(dest, records, source="coin")
    return dest


def run_staleness(
    staleness: int, checkpoint: Path, tasks: Path, args, work: Path, name: str = ""
) -> tuple[float, list[dict]]:
    """The run's wall time and log with rollouts in process and `max_staleness`."""
    import time

    from otbuild.settings.stages import RlSettings
    from otbuild.train.rl.trainer import train

    cfg = RlSettings(
        steps=args.steps,
        batch_size=args.tasks,
        samples_per_task=args.samples,
        max_tokens=args.max_tokens,
        max_context=4096,
        learning_rate=1e-3,
        temperature=1.0,
        prompt="compact",
        sandbox={"max_episodes": 2},
        max_staleness=staleness,
    )
    out = work / f"rl-staleness-{staleness}{name}"
    start = time.monotonic()
    train(cfg, [checkpoint, tasks], out)
    return time.monotonic() - start, [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]


def print_sync(logs: dict) -> None:
    print("  ".join(f"{h:>11}" for h in ("weight_sync", "step", "how", "sync", "rollout", "update")))
    for mode in MODES:
        for r in logs[mode]:
            cells = (
                mode,
                r["step"],
                r["weight_sync"],
                f"{r['sync_seconds']:.2f}",
                f"{r['rollout_seconds']:.2f}",
                f"{r['update_seconds']:.2f}",
            )
            print("  ".join(f"{x:>11}" for x in cells))
    later = {m: [r["sync_seconds"] for r in logs[m][1:]] for m in MODES}
    mean = {m: sum(v) / len(v) for m, v in later.items()}
    print(
        f"sync after the first step: restart {mean['restart']:.2f} s, reload {mean['reload']:.3f} s "
        f"({mean['restart'] / max(mean['reload'], 1e-9):.0f}x faster in place)"
    )


def print_staleness(runs: dict) -> None:
    print("  ".join(f"{h:>13}" for h in ("max_staleness", "step", "versions", "rollout", "update")))
    for staleness, (_, log) in runs.items():
        for r in log:
            cells = (
                staleness,
                r["step"],
                ",".join(map(str, r.get("weight_versions", ["-"]))),
                f"{r['rollout_seconds']:.2f}",
                f"{r['update_seconds']:.2f}",
            )
            print("  ".join(f"{x:>13}" for x in cells))
    wall = {k: w for k, (w, _) in runs.items()}
    print(
        f"wall time: max_staleness 0 {wall[0]:.1f} s, max_staleness 1 {wall[1]:.1f} s "
        f"(x{wall[1] / wall[0]:.2f} of the synchronous loop)"
    )


def main(argv=None) -> int:
    from outdir import out_dir

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=("all", "sync", "staleness"), default="all")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--tasks", type=int, default=2, help="tasks per step")
    p.add_argument("--samples", type=int, default=2, help="samples per task (>= 2)")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--out", type=out_dir, help="where the runs go (default: a temporary dir)")
    p.add_argument(
        "--eager",
        action="store_true",
        help="serve uncompiled (vLLM's --enforce-eager): a start in seconds; what the tests' tiny runs take",
    )
    args = p.parse_args(argv)
    if args.steps < 2 or args.samples < 2 or args.tasks < 1:
        p.error("--steps and --samples must be >= 2, --tasks >= 1")

    from otbuild.engines.vllm import vllm_executable
    from otbuild.settings.engines import VLLMOptions
    from otbuild.sources.synthetic import generate
    from otbuild.tasks.table import write_tasks

    sync = args.part in ("all", "sync") and vllm_executable(VLLMOptions()) is not None
    if args.part == "sync" and not sync:
        print("bench/rl.py: no vLLM here: make vllm-env (scripts/vllm-env.sh)", file=sys.stderr)
        return 2
    work = args.out or Path(tempfile.mkdtemp(prefix="otbuild-bench-rl-"))
    checkpoint = student(work / "student")
    tasks = work / "tasks.parquet"
    write_tasks(tasks, generate(args.tasks, seed=3), source="synth")
    logs, runs = {}, {}
    try:
        for mode in MODES if sync else ():
            logs[mode] = run_mode(mode, checkpoint, tasks, args, work)
        if args.part in ("all", "staleness"):
            coins = coin_tasks(work / "coin_tasks.parquet", args.tasks)
            run_staleness(0, checkpoint, coins, args, work, "-warmup")  # first imports and kernels: not timed
            for staleness in (0, 1):
                runs[staleness] = run_staleness(staleness, checkpoint, coins, args, work)
    except Exception as e:  # noqa: BLE001 (reported, exit 2)
        print(f"bench/rl.py: {e}", file=sys.stderr)
        return 2
    head = f"{args.tasks} tasks x {args.samples} samples a step (seconds)"
    if logs:
        print(f"RL steps with rollout: vllm, {head}")
        print_sync(logs)
    elif args.part == "all":
        print("weight sync: left out, no vLLM here (make vllm-env)")
    if runs:
        print(f"RL steps with rollouts in process, max_staleness 0 and 1, {head}")
        print_staleness(runs)
    print(f"results: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
