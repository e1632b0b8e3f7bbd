"""Realistic agent traces for scale checks (bench/scale.py, the trace-path memory test).

Sizes follow what terminus-2 rollouts of a reasoning teacher look like at the paper's scale:
- turns (assistant messages): 85% uniform in 5..60, 10% uniform in 61..100, 5% in 1..4
  (below the paper's min_turns of 5, so the trace filter has something to reject);
- each assistant turn: a `<think>` block of 500-3000 chars (log-uniform), then a terminus-2
  JSON answer (analysis, plan, one or two commands) of ~200-400 chars;
- each observation (user turn after the first): terminal output of 200-4000 chars (log-uniform);
- the first user turn: a task instruction of 300-1500 chars; one system prompt of ~300 chars.
That makes ~110 KB per trace on average (about 2.8 KB per turn, 38 turns). Rewards are
1.0 for ~40% of traces; ~3% time out, ~2% end without a verdict (a verifier error: the
trace filter drops them; a resumed rollout keeps them, as it reruns only infrastructure
failures, docs/failures.md), ~1% are subagent traces, ~1% repeat an earlier trace's conversation (dedup has work to do).

Text is drawn as windows of a seeded pool of pseudo-words (fast: 100K traces are ~11 GB of
text), so it compresses roughly like real terminal text, not like random bytes.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from pathlib import Path

POOL_CHARS = 1 << 22
SYSTEM = (
    "You are an AI assistant solving command-line tasks in a Linux environment. You will be given a "
    "task description and the output from previously executed commands. Respond with a JSON object "
    "with the fields analysis, plan, commands and task_complete. "
)


def _pool(seed: int) -> str:
    rng = random.Random(seed)
    syll = [
        "ab",
        "er",
        "in",
        "on",
        "st",
        "ar",
        "ing",
        "ed",
        "th",
        "re",
        "an",
        "ou",
        "/usr",
        "lib",
        "src",
        "py",
        "0",
        "1",
        "2",
        "x",
        "-",
        "_",
        ".",
        "==",
        "ok",
        "error",
        "file",
        "test",
        "def",
        "self",
    ]
    words = ["".join(rng.choice(syll) for _ in range(rng.randint(1, 4))) for _ in range(5000)]
    out, n = [], 0
    while n < POOL_CHARS:
        w = rng.choice(words)
        sep = "\n" if rng.random() < 0.08 else " "
        out.append(w + sep)
        n += len(w) + 1
    return "".join(out)


class TraceGen:
    def __init__(self, seed: int = 0):
        self.pool = _pool(seed)
        self.seed = seed

    def _text(self, rng: random.Random, lo: int, hi: int) -> str:
        n = int(math.exp(rng.uniform(math.log(lo), math.log(hi))))
        at = rng.randrange(0, len(self.pool) - n)
        return self.pool[at : at + n]

    def _turns(self, rng: random.Random) -> int:
        r = rng.random()
        return rng.randint(5, 60) if r < 0.85 else rng.randint(61, 100) if r < 0.95 else rng.randint(1, 4)

    def conversation(self, rng: random.Random) -> list[dict]:
        conv = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Task: " + self._text(rng, 300, 1500)},
        ]
        turns = self._turns(rng)
        for t in range(turns):
            answer = json.dumps(
                {
                    "analysis": self._text(rng, 80, 200),
                    "plan": self._text(rng, 50, 120),
                    "commands": [{"keystrokes": self._text(rng, 10, 60) + "\n", "duration": 1.0}],
                    "task_complete": t == turns - 1,
                }
            )
            conv.append({"role": "assistant", "content": f"<think>{self._text(rng, 500, 3000)}</think>\n{answer}"})
            if t < turns - 1:
                conv.append({"role": "user", "content": "New Terminal Output:\n" + self._text(rng, 200, 4000)})
        return conv

    def traces(self, n: int) -> Iterator[dict]:
        """n trace rows (TRACE_SCHEMA's keys), trial t's conversation from its own seed."""
        previous = None
        for t in range(n):
            rng = random.Random(f"{self.seed}:{t}")
            conv = previous if previous and rng.random() < 0.01 else self.conversation(rng)
            previous = conv
            yield trace_row(t, conv, rng)


def trace_row(t: int, conv: list[dict], rng: random.Random) -> dict:
    r = rng.random()
    exception = "VerifierTimeoutError" if r < 0.02 else None
    timed_out = 0.02 <= r < 0.05
    reward = None if exception else (1.0 if rng.random() < 0.4 else 0.0)
    turns = sum(1 for m in conv if m["role"] == "assistant")
    return {
        "conversations": conv,
        "agent": "terminus-2",
        "model": "glm-4.7-awq",
        "model_provider": "hosted_vllm",
        "date": "2026-01-01T00:00:00Z",
        "task": f"task-{t // 2:06d}",
        "episode": f"episode-{turns - 1}",
        "run_id": "bench",
        "trial_name": f"task-{t // 2:06d}__{t % 2}",
        "result": exception or str(reward),
        "task_id": f"{t // 2:016x}",
        "source": "bench",
        "teacher": "vllm:glm-4.7-awq",
        "sample_idx": t % 2,
        "n_turns": turns,
        "reward": reward,
        "timed_out": timed_out,
        "exception": exception,
        "is_subagent": rng.random() < 0.01,
        "n_input_tokens": 30000 * turns,
        "n_output_tokens": 700 * turns,
        "duration_s": 12.0 * turns,
        "metadata": json.dumps({"stop_reason": "task_complete"}),
    }


def write_partials(shards_dir: Path, n: int, shards: int, seed: int = 0) -> int:
    """Trials 0..n-1 as rollout partial files shards_dir/K-of-S.partial.jsonl (trial t in
    shard t mod S), as a rollout killed after every trial finished leaves them. Returns bytes."""
    shards_dir.mkdir(parents=True, exist_ok=True)
    files = [open(shards_dir / f"{k}-of-{shards}.partial.jsonl", "w") for k in range(shards)]
    size = 0
    try:
        for t, row in enumerate(TraceGen(seed).traces(n)):
            line = json.dumps({"_trial": t, **row}) + "\n"
            size += len(line)
            files[t % shards].write(line)
    finally:
        for f in files:
            f.close()
    return size


def write_messages_jsonl(dest: Path, n: int, seed: int = 0) -> int:
    """n traces as a messages-jsonl trajectory file (the trace import's input). Returns bytes."""
    size = 0
    with open(dest, "w") as f:
        for row in TraceGen(seed).traces(n):
            line = (
                json.dumps(
                    {
                        "messages": row["conversations"],
                        "instance_id": row["task"],
                        "model": row["model"],
                        "reward": row["reward"],
                        "timed_out": row["timed_out"],
                        "exception": row["exception"],
                        "is_subagent": row["is_subagent"],
                        "trial_name": row["trial_name"],
                    }
                )
                + "\n"
            )
            size += len(line)
            f.write(line)
    return size
