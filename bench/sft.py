"""SFT throughput: otbuild's trainer (DeepSpeed, CPU/gloo) against TRL's SFTTrainer, on identical
data, model and settings, in one run on this machine; prints tokens/s and the ratio.

    python bench/sft.py [--traces 96] [--epochs 1] [--cutoff 2048] [--repeats 1]

Both trainers get the same tiny Qwen3 model dir (the `tiny` student, built once), the same
conversations tokenized once by otbuild (input ids + assistant-token labels: TRL receives them
pre-tokenized, so both optimise the same loss on the same tokens), the same optimiser settings
(AdamW, lr 4e-5 cosine, warmup 0.1, grad clip 1.0, fp32), the same global batch (2 per device
x 4 accumulation) and no packing. Each trainer runs in its own child process (so neither one's
process group or threads affect the other); a trainer's time is its training loop, and its
tokens are the non-padding tokens it trained on (prompt and completion).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SETTINGS = {
    "learning_rate": 4e-5,
    "lr_scheduler": "cosine",
    "warmup_ratio": 0.1,
    "global_batch_size": 8,
    "per_device_batch_size": 2,
    "max_grad_norm": 1.0,
    "adam_betas": [0.9, 0.999],
    "weight_decay": 0.0,
    "zero_stage": 0,
    "gradient_checkpointing": False,
    "packing": False,
    "precision": "fp32",
    "save_steps": 10**6,
    "seed": 0,
}


def prepare(work: Path, n: int, cutoff: int) -> dict:
    from otbuild.settings.train import TinyModel
    from otbuild.train.data import build
    from otbuild.train.model import materialise
    from otbuild.train.tokenized import TokenizedSet, build_tokenized_set
    from otbuild.train.toy import write_toy_traces

    traces = write_toy_traces(work / "kept.parquet", n, seed=0)
    model = materialise(TinyModel(kind="tiny"), work / "model", traces)  # the schema's tiny student
    build_tokenized_set(traces, model, "auto", cutoff, work / "tokenized")
    ds = build(TokenizedSet(work / "tokenized"), cutoff_len=cutoff)
    rows = []
    for i in range(len(ds)):
        r = ds.row(i)
        rows.append(
            {
                "input_ids": r.input_ids.tolist(),
                "labels": [int(t) if m else -100 for t, m in zip(r.input_ids, r.mask, strict=True)],
            }
        )
    (work / "rows.json").write_text(json.dumps(rows))
    return {"traces": str(traces), "model": str(model), "rows": len(rows), "tokens": ds.stats["tokens"]}


def run_otbuild(work: Path, epochs: float, cutoff: int) -> dict:
    from otbuild.settings.stages import SftSettings
    from otbuild.train.sft import train

    s = SftSettings(
        **SETTINGS, model={"kind": "pretrained", "path": str(work / "model")}, epochs=epochs, cutoff_len=cutoff
    )  # the typed settings the stage passes
    m = train(s, [work / "kept.parquet"], work / "out-otbuild", log=lambda *_: None)
    return {"tokens": m["tokens_seen"], "seconds": m["train_seconds"], "steps": m["steps"]}


def run_trl(work: Path, epochs: float, cutoff: int) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    rows = json.loads((work / "rows.json").read_text())
    tok = AutoTokenizer.from_pretrained(work / "model")
    model = AutoModelForCausalLM.from_pretrained(work / "model", dtype=torch.float32)
    cfg = SFTConfig(
        output_dir=str(work / "out-trl"),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=4,
        learning_rate=SETTINGS["learning_rate"],
        lr_scheduler_type="cosine",
        warmup_steps=0.1,
        num_train_epochs=epochs,
        max_grad_norm=1.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        weight_decay=0.0,
        max_length=cutoff,
        packing=False,
        bf16=False,
        fp16=False,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_steps=10**6,
        seed=0,
        dataloader_num_workers=0,
        gradient_checkpointing=False,
        disable_tqdm=True,
    )
    trainer = SFTTrainer(model=model, args=cfg, train_dataset=Dataset.from_list(rows), processing_class=tok)
    t0 = time.perf_counter()
    out = trainer.train()
    seconds = time.perf_counter() - t0
    tokens = int(sum(len(r["input_ids"]) for r in rows) * epochs)
    return {"tokens": tokens, "seconds": seconds, "steps": out.global_step}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--traces", type=int, default=96)
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--cutoff", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=3, help="interleaved runs of each (a shared machine is noisy)")
    p.add_argument("--worker", choices=["otbuild", "trl"])
    p.add_argument("--work", type=Path)
    a = p.parse_args()
    if a.worker:
        fn = run_otbuild if a.worker == "otbuild" else run_trl
        print("RESULT " + json.dumps(fn(a.work, a.epochs, a.cutoff)), flush=True)
        return 0
    work = Path(tempfile.mkdtemp(prefix="otbuild-bench-sft-"))
    info = prepare(work, a.traces, a.cutoff)
    print(
        f"data: {info['rows']} conversations, {info['tokens']} tokens; tiny Qwen3 (hidden 64, 2 layers); "
        f"global batch 8 (2 x 4 accumulation), {a.epochs:g} epoch(s), cutoff {a.cutoff}, fp32, CPU"
    )
    from otbuild.train.dist import outside_group

    results: dict[str, list[dict]] = {"otbuild": [], "trl": []}
    for _ in range(a.repeats):
        for who in ("trl", "otbuild"):
            proc = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--worker",
                    who,
                    "--work",
                    str(work),
                    "--epochs",
                    str(a.epochs),
                    "--cutoff",
                    str(a.cutoff),
                ],
                check=False,
                capture_output=True,
                text=True,
                env=outside_group(dict(os.environ)),  # each worker its own group, not the caller's
                cwd=REPO,
            )
            line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
            if proc.returncode or not line:
                print(proc.stdout[-3000:], proc.stderr[-3000:])
                return 1
            results[who].append(json.loads(line[0][7:]))
    import statistics

    rate = {k: [r["tokens"] / r["seconds"] for r in v] for k, v in results.items()}
    print(f"{'trainer':<22}{'steps':>6}{'tokens':>9}{'best s':>9}{'best tok/s':>12}{'median tok/s':>14}  runs")
    for who, name in (("otbuild", "otbuild (DeepSpeed)"), ("trl", "TRL SFTTrainer")):
        r = min(results[who], key=lambda x: x["seconds"])
        runs = ", ".join(f"{x:.0f}" for x in rate[who])
        print(
            f"{name:<22}{r['steps']:>6}{r['tokens']:>9}{r['seconds']:>9.2f}{max(rate[who]):>12.0f}"
            f"{statistics.median(rate[who]):>14.0f}  [{runs}]"
        )
    print(
        f"ratio otbuild / TRL: best {max(rate['otbuild']) / max(rate['trl']):.2f}x, "
        f"median {statistics.median(rate['otbuild']) / statistics.median(rate['trl']):.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
