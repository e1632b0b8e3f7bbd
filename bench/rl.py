"""RL with rollout: vllm: a step's time split (weight sync, rollouts, update) when each step's
policy is served by a new `vllm serve` (weight_sync: restart) against one live server whose
weights are reloaded in place (weight_sync: reload), side by side in one run.

    python bench/rl.py [--steps 3] [--tasks 2] [--samples 2] [--max-tokens 16] [--out DIR]

Both runs train the same tiny Qwen3 student (random weights, the smoke student's shape) with
otbuild's RLOO trainer (otbuild/train/rl.py) on the same synthetic tasks, through the harness
and bwrap sandboxes, with the real vLLM (.venv-vllm: its CPU build here). Printed per mode and
step: how the weights got to the server (start / reload), seconds to sync them, to roll out and
to update; then the mean sync of the steps after the first in each mode and their ratio (the
first step starts a server in both). Exit status: 0 when both runs finished, 2 otherwise.
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

    make_tiny_model(dest, arch="qwen3", hidden_size=64, intermediate_size=128, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=32, vocab_size=1024, max_position_embeddings=4096,
                    chat_template=qwen3_template(), special_tokens=QWEN3_SPECIAL)
    (dest / "checkpoint.json").write_text("{}")
    return dest / "checkpoint.json"


def run_mode(mode: str, checkpoint: Path, tasks: Path, args, work: Path) -> list[dict]:
    from otbuild.settings.stages import RlSettings
    from otbuild.train import rl

    cfg = RlSettings(steps=args.steps, batch_size=args.tasks, samples_per_task=args.samples, max_tokens=args.max_tokens,
                     max_context=4096, learning_rate=1e-3, temperature=1.0, rollout="vllm", weight_sync=mode,
                     prompt="compact", sandbox={"max_episodes": 2},
                     vllm_args={"dtype": "float32", "max_model_len": 4096, "log_path": str(work / f"vllm-{mode}.log")})
    out = work / f"rl-{mode}"
    rl.train(cfg, [checkpoint, tasks], out)
    return [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]


def main(argv=None) -> int:
    from outdir import out_dir

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--tasks", type=int, default=2, help="tasks per step")
    p.add_argument("--samples", type=int, default=2, help="samples per task (>= 2)")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--out", type=out_dir, help="where the runs go (default: a temporary dir)")
    args = p.parse_args(argv)
    if args.steps < 2 or args.samples < 2 or args.tasks < 1:
        p.error("--steps and --samples must be >= 2, --tasks >= 1")

    from otbuild.engines.vllm import vllm_executable
    from otbuild.settings.engines import VLLMOptions
    from otbuild.sources.synthetic import generate
    from otbuild.tasks.table import write_tasks

    if vllm_executable(VLLMOptions()) is None:
        print("bench/rl.py: no vLLM here: make vllm-env (scripts/vllm-env.sh)", file=sys.stderr)
        return 2
    work = args.out or Path(tempfile.mkdtemp(prefix="otbuild-bench-rl-"))
    checkpoint = student(work / "student")
    tasks = work / "tasks.parquet"
    write_tasks(tasks, generate(args.tasks, seed=3), source="synth")
    logs = {}
    try:
        for mode in MODES:
            logs[mode] = run_mode(mode, checkpoint, tasks, args, work)
    except Exception as e:  # noqa: BLE001 (reported, exit 2)
        print(f"bench/rl.py: {e}", file=sys.stderr)
        return 2
    print(f"RL steps with rollout: vllm, {args.tasks} tasks x {args.samples} samples a step (seconds)")
    head = ("weight_sync", "step", "how", "sync", "rollout", "update")
    print("  ".join(f"{h:>11}" for h in head))
    for mode in MODES:
        for r in logs[mode]:
            cells = (mode, r["step"], r["weight_sync"], f"{r['sync_seconds']:.2f}", f"{r['rollout_seconds']:.2f}",
                     f"{r['update_seconds']:.2f}")
            print("  ".join(f"{x:>11}" for x in cells))
    later = {m: [r["sync_seconds"] for r in logs[m][1:]] for m in MODES}
    mean = {m: sum(v) / len(v) for m, v in later.items()}
    print(f"sync after the first step: restart {mean['restart']:.2f} s, reload {mean['reload']:.3f} s "
          f"({mean['restart'] / max(mean['reload'], 1e-9):.0f}x faster in place)")
    print(f"results: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
