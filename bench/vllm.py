"""otbuild's rollouts against vLLM's own ceiling, on one `vllm serve`.

    python bench/vllm.py [--concurrency 1,8,32] [--trials 2] [--max-tokens 32] [--episodes 3]
                         [--repeats 1] [--model DIR] [--out DIR] [--eager]

The server is the one a recipe's `engine: vllm` starts (otbuild/engines/vllm.py: the pinned
release from .venv-vllm, its CPU build on a machine without CUDA), on --model (default: a random
Qwen3 of the smoke student's shape, built here), in float32, without prefix caching (otbuild's
turns share their conversation's prefix, vLLM's random prompts share nothing: with the cache
the two loads would not be the same work). At each concurrency C, in turn:

- otbuild: C x --trials trials of synthetic tasks through the rollout stage's shard runner
  (otbuild's harness, bwrap sandboxes, the compact prompt), C in flight, every request
  generating exactly --max-tokens (vLLM's `ignore_eos`), --episodes requests per trial;
  wall time from the shard's start to its end; requests and tokens from its traces.
- vLLM: `vllm bench serve` (vLLM's own load generator: `--backend openai-chat --dataset-name
  random`) with as many requests, otbuild's mean prompt length, the same output length and
  `--max-concurrency C`.

- otbuild before: the same trials with the harness as it was before issue 48's part 5 (each
  trial's sandbox start and verifier inside its concurrency slot, the model's client loading
  the CA store for a plain-http server: `legacy_harness`), against now (trials pipelined around
  the model: otbuild/harness/slots.py).
- otbuild with capture: the same trials through the recording proxy (otbuild/capture/),
  asking the server for the token ids (what `capture_logprobs: false` asks a vLLM that otbuild
  started for), and again for the token ids and log-probs (the default): the proxy's cost and
  the server's for what it is asked.

The runs go now, before, ids, captured, vLLM's, captured, ids, before, now (a drift of the
machine's load weighs on each alike), --repeats times, after one request that warms up the
server's log-prob path and two untimed trials, without and with capture (the imports of a
process's first); each kind pools its runs.

Printed per C: vLLM's output tokens/s (the engine's ceiling for that load), otbuild's, their
ratio, otbuild's trials/s, and the share of otbuild's wall time that is not the model's
(1 - ratio: the harness, the sandbox, the verifier, the first request sent alone); then
otbuild's tokens/s before and now, the share before and now and their ratio, beside the
capture's cost; then otbuild's tokens/s without capture, with capture of the token ids and
with capture of the token ids and log-probs, and their costs (1 - ratio). On a GPU node the
same script gives the absolute figures (--model a real checkpoint).
Exit status: 0 when every level ran, 2 when vLLM is not installed or a level failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import reduce
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

SERVED_AS = "bench"


def random_student(dest: Path) -> Path:
    from otbuild.engines.tiny import make_tiny_model
    from otbuild.train.chat import QWEN3_SPECIAL, qwen3_template

    return make_tiny_model(
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


def otbuild_level(base_url: str, c: int, args, work: Path, capture: bool | None = None, before: bool = False) -> dict:
    """C x --trials trials through the rollout stage against the server: wall time and counts.
    `capture` None: straight to the server; else through the recording proxy
    (otbuild/capture/), asking for the token ids, and with True the log-probs too (what the
    proxy asks a vLLM that otbuild started for, `capture_logprobs` false or true). `before`:
    the harness as it was before issue 48's part 5 (`legacy_harness`)."""
    import pyarrow.parquet as pq

    from otbuild.settings.stages import RolloutSettings
    from otbuild.sources.synthetic import generate
    from otbuild.stagekit.trials import run_trials_shard
    from otbuild.tasks.table import write_tasks

    # the proxy asks a vLLM otbuild started for these (engines/capture.py); here the client does
    asked = {} if capture is None else {"return_token_ids": True, **({"logprobs": True} if capture else {})}
    tasks = work / f"tasks-c{c}.parquet"
    work.mkdir(parents=True, exist_ok=True)
    write_tasks(tasks, generate(c * args.trials, seed=c), source="synth")
    # no per-request seed: vLLM 0.32's CPU build dies on a seeded request whose prefill is
    # chunked ("CPU Generator does not use offset", docs/engines.md)
    settings = RolloutSettings(
        engine="openai",
        base_url=base_url,
        model=SERVED_AS,
        temperature=0.7,
        max_tokens=args.max_tokens,
        max_episodes=args.episodes,
        concurrency=c,
        sandbox="bwrap",
        prompt="compact",
        extra_body={"ignore_eos": True, **asked},
        capture=capture is not None,
    )
    kind = {None: "-before" if before else "", False: "-ids", True: "-capture"}[capture]
    out = work / f"rollout-c{c}{kind}"
    with legacy_harness(before):
        t0 = time.monotonic()
        run_trials_shard(settings, [tasks], out, 0, pipelined=not before)  # the rollout stage's shard
        wall = time.monotonic() - t0
    rows = pq.read_table(
        out / "shards" / "0-of-1.parquet", columns=["n_turns", "n_input_tokens", "n_output_tokens"]
    ).to_pylist()
    requests = sum(r["n_turns"] for r in rows)
    if capture is not None:
        calls = pq.read_table(out / "shards" / "0-of-1.calls.parquet", columns=["completion_token_ids", "logprobs"])
        assert calls.num_rows == requests, "capture kept every call"
        assert calls.column(0).null_count == 0, "capture kept every call's token ids"
        assert calls.column(1).null_count == (0 if capture else requests), "capture kept the log-probs asked for"
    return {
        "trials": len(rows),
        "wall": wall,
        "requests": requests,
        "prompt_tokens": sum(r["n_input_tokens"] for r in rows) / max(requests, 1),
        "output_tokens": sum(r["n_output_tokens"] for r in rows),
    }


@contextmanager
def legacy_harness(on: bool) -> Iterator[None]:
    """With `on`, the harness as it was before issue 48's part 5: a trial's verifier inside its
    concurrency slot (the next trial waited for it) and the model's HTTP client loading the CA
    store on the first request to a plain-http server."""
    if not on:
        yield
        return
    from otbuild.engines.openai import OpenAIEngine

    makes_tls = OpenAIEngine._makes_tls
    OpenAIEngine._makes_tls = lambda self: True  # type: ignore[method-assign]
    try:
        yield
    finally:
        OpenAIEngine._makes_tls = makes_tls  # type: ignore[method-assign]


def pooled(a: dict, b: dict) -> dict:
    """Two runs of a level as one: their trials, requests, tokens and wall time added up."""
    requests = a["requests"] + b["requests"]
    prompt = (a["prompt_tokens"] * a["requests"] + b["prompt_tokens"] * b["requests"]) / max(requests, 1)
    return {
        "trials": a["trials"] + b["trials"],
        "wall": a["wall"] + b["wall"],
        "requests": requests,
        "prompt_tokens": prompt,
        "output_tokens": a["output_tokens"] + b["output_tokens"],
    }


def vllm_pooled(results: list[dict]) -> dict:
    """`vllm bench serve`'s runs of a level as one: their output tokens over their durations."""
    return {"output_throughput": sum(r["total_output_tokens"] for r in results) / sum(r["duration"] for r in results)}


def warm_up(base_url: str) -> None:
    """One request that asks for token ids and log-probs: the server's first such request is
    slower (its code path warms up), which no measured run should pay for."""
    import httpx

    body = {
        "model": SERVED_AS,
        "messages": [{"role": "user", "content": "warm up"}],
        "max_tokens": 4,
        "return_token_ids": True,
        "logprobs": True,
    }
    httpx.post(f"{base_url}/chat/completions", json=body, timeout=600, trust_env=False).raise_for_status()


def vllm_level(
    vllm: str, root: str, model: Path, c: int, requests: int, prompt_tokens: float, max_tokens: int, work: Path
) -> dict:
    """`vllm bench serve` at --max-concurrency C: its own JSON result."""
    name = f"vllm-bench-c{c}.json"
    cmd = [
        vllm,
        "bench",
        "serve",
        "--backend",
        "openai-chat",
        "--base-url",
        root,
        "--endpoint",
        "/v1/chat/completions",
        "--model",
        SERVED_AS,
        "--tokenizer",
        str(model),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(max(1, round(prompt_tokens))),
        "--random-output-len",
        str(max_tokens),
        "--random-range-ratio",
        "0",
        "--num-prompts",
        str(requests),
        "--max-concurrency",
        str(c),
        "--ignore-eos",
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        str(work),
        "--result-filename",
        name,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if proc.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return json.loads((work / name).read_text())


def main(argv=None) -> int:
    from outdir import out_dir

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", default="1,8,32", help="comma-separated levels")
    p.add_argument("--trials", type=int, default=2, help="trials per unit of concurrency")
    p.add_argument("--max-tokens", type=int, default=32, help="output tokens per request")
    p.add_argument("--episodes", type=int, default=3, help="requests per trial")
    p.add_argument("--repeats", type=int, default=1, help="the runs of each level this many times, pooled")
    p.add_argument("--model", type=Path, help="a model dir to serve (default: a random tiny Qwen3)")
    p.add_argument("--out", type=out_dir, help="where the results go (default: a temporary dir)")
    p.add_argument(
        "--eager",
        action="store_true",
        help="serve uncompiled (vLLM's --enforce-eager): a start in seconds; what the tests' tiny runs take",
    )
    args = p.parse_args(argv)
    try:
        levels = [int(x) for x in args.concurrency.split(",")]
        assert levels and all(c >= 1 for c in levels)
    except (ValueError, AssertionError):
        p.error(f"--concurrency: expected comma-separated integers >= 1, got {args.concurrency!r}")

    from otbuild.engines import LLM
    from otbuild.engines.vllm import VLLMEngine, vllm_executable
    from otbuild.settings.engines import VLLMOptions

    vllm = vllm_executable(VLLMOptions())
    if vllm is None:
        print("bench/vllm.py: no vLLM here: make vllm-env (scripts/vllm-env.sh)", file=sys.stderr)
        return 2
    work = args.out or Path(tempfile.mkdtemp(prefix="otbuild-bench-vllm-"))
    model = args.model or random_student(work / "model")
    # prefix caching off: otbuild's turns share their conversation's prefix, vLLM's random
    # prompts share nothing; with it on, the two loads would not be the same work
    engine = VLLMEngine(
        LLM(
            engine="vllm",
            model=str(model),
            engine_args={
                "dtype": "float32",
                "max_model_len": 4096,
                "served_model_name": SERVED_AS,
                "log_path": str(work / "vllm-serve.log"),
                "enforce_eager": args.eager,
                "extra_args": ["--no-enable-prefix-caching"],
            },
        )
    )
    base_url, server = engine._launch()
    root = base_url.removesuffix("/v1")
    rows = []
    try:
        warm_up(base_url)
        one = argparse.Namespace(**{**vars(args), "trials": 1})  # untimed: the first run's imports
        otbuild_level(base_url, 1, one, work / "warm-up")
        otbuild_level(base_url, 1, one, work / "warm-up", capture=True)
        for c in levels:
            # symmetric around vLLM's run: a drift of the machine's load (other jobs on the
            # cores) weighs on each kind alike; --repeats times
            kinds = ("now", "before", "ids", "capture", "vllm", "capture", "ids", "before", "now")
            runs: dict[str, list[dict]] = {kind: [] for kind in kinds}
            for r in range(args.repeats):
                for k, kind in enumerate(kinds):
                    if kind == "vllm":  # as many requests as two runs, their mean prompt
                        load = pooled(runs["now"][-1], runs["before"][-1])
                        runs[kind].append(
                            vllm_level(
                                vllm, root, model, c, load["requests"], load["prompt_tokens"], args.max_tokens, work
                            )
                        )
                        continue
                    where = work / f"{r}-{k}" if args.repeats > 1 else work / f"{k}"
                    logprobs = None if kind not in ("ids", "capture") else kind == "capture"
                    runs[kind].append(otbuild_level(base_url, c, args, where, logprobs, before=kind == "before"))
            ours, before, proxied, captured = (
                reduce(pooled, runs[kind]) for kind in ("now", "before", "ids", "capture")
            )
            theirs = vllm_pooled(runs["vllm"])
            rows.append((c, ours, theirs, captured, before, proxied))
    except Exception as e:  # noqa: BLE001 (reported, exit 2)
        print(f"bench/vllm.py: {e}", file=sys.stderr)
        return 2
    finally:
        server.stop()
    print(
        f"otbuild's rollouts against `vllm bench serve` on one vllm serve ({model}), "
        f"{args.max_tokens} output tokens a request, {args.episodes} requests a trial"
    )
    head = ("concurrency", "requests", "prompt tok", "vLLM tok/s", "otbuild tok/s", "ratio", "trials/s", "not model")
    print("  ".join(f"{h:>13}" for h in head))
    for c, ours, theirs, *_ in rows:
        tok_s = ours["output_tokens"] / ours["wall"]
        ratio = tok_s / theirs["output_throughput"]
        cells = (
            c,
            ours["requests"],
            f"{ours['prompt_tokens']:.0f}",
            f"{theirs['output_throughput']:.1f}",
            f"{tok_s:.1f}",
            f"{ratio:.2f}x",
            f"{ours['trials'] / ours['wall']:.3f}",
            f"{1 - ratio:.0%}",
        )
        print("  ".join(f"{x:>13}" for x in cells))
    print(
        "\nthe harness's share of wall time (not the model's: 1 - ratio to vLLM's) before issue 48's part 5 "
        "(the verifier inside the trial's slot, the CA store loaded for a plain-http server) and now; "
        "the capture's cost beside"
    )
    head = ("concurrency", "tok/s before", "tok/s now", "share before", "share now", "now/before", "capture cost")
    print("  ".join(f"{h:>13}" for h in head))
    for c, ours, theirs, captured, before, _ in rows:
        ceiling = theirs["output_throughput"]
        then, now = before["output_tokens"] / before["wall"], ours["output_tokens"] / ours["wall"]
        share_then, share_now = 1 - then / ceiling, 1 - now / ceiling
        cost = 1 - (captured["output_tokens"] / captured["wall"]) / now
        cells = (c, f"{then:.1f}", f"{now:.1f}", f"{share_then:.0%}", f"{share_now:.0%}")
        ratio = f"{share_now / share_then:.2f}x" if share_then > 0 and share_now >= 0 else "-"
        print("  ".join(f"{x:>13}" for x in (*cells, ratio, f"{cost:.1%}")))
    print(
        "\nthe capture's cost: the same trials through the recording proxy asking the server for the token ids "
        "(capture_logprobs: false), and for the token ids and log-probs (the default); the server's work included"
    )
    head = ("concurrency", "tok/s", "ids tok/s", "ids cost", "+logprobs tok/s", "+logprobs cost")
    print("  ".join(f"{h:>14}" for h in head))
    for c, ours, _, captured, _, proxied in rows:
        plain = ours["output_tokens"] / ours["wall"]
        through, recorded = (r["output_tokens"] / r["wall"] for r in (proxied, captured))
        cells = (c, f"{plain:.1f}", f"{through:.1f}", f"{1 - through / plain:.1%}", f"{recorded:.1f}")
        print("  ".join(f"{x:>14}" for x in (*cells, f"{1 - recorded / plain:.1%}")))
    print(f"results: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
