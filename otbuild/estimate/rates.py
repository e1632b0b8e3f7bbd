"""The per-item rates an estimate multiplies its counts by, and the documented defaults it falls
back on where no pilot measured a rate (each an assumption, with its source; docs/estimate.md).

A rate is a `Span` (estimate, low, high) in units that grow the work with the value (seconds per
trial, GPU-seconds per token), so the ranges of the totals follow from the rates' ranges."""

from __future__ import annotations

import re
from dataclasses import dataclass

from otbuild.span import Span
from otbuild.stagekit import DefaultRate
from otbuild.stages import STAGES


def _d(est: float, low: float, high: float, unit: str, source: str) -> DefaultRate:
    return DefaultRate(Span(est, low, high), unit, source)


_TRIAL = "no figure in the paper: long terminal sessions of a large model"
# (kind of work, rate) -> the default, where the stage declares none of its own (`StageDef.rates`):
# "trials" covers every stage that runs trials (rollout, eval, rl), "requests" every one that asks an
# LLM (augment, task_score, skills); "benchmark", "job", "server" and "model" are no stage's.
DEFAULTS: dict[tuple[str, str], DefaultRate] = {
    ("trials", "turns_per_trial"): _d(30, 10, 60, "turns", _TRIAL + "; capped at max_episodes"),
    ("trials", "input_tokens_per_request"): _d(
        12_000, 4_000, 32_000, "tokens", "the conversation so far: half a 32K context on average"
    ),
    ("trials", "output_tokens_per_request"): _d(
        1_500, 500, 4_000, "tokens", "reasoning and a JSON answer; capped at max_tokens"
    ),
    ("trials", "seconds_per_trial"): _d(
        600, 200, 1_800, "s per concurrent slot", _TRIAL + "; 30 turns of ~20 s (generation and commands)"
    ),
    ("requests", "input_tokens_per_request"): _d(800, 300, 2_000, "tokens", "a task instruction and a prompt"),
    ("requests", "output_tokens_per_request"): _d(
        1_000, 300, 4_000, "tokens", "capped at max_tokens (a reasoning model uses more)"
    ),
    ("requests", "seconds_per_request"): _d(20, 5, 60, "s per concurrent slot", "a short answer of a served model"),
    ("benchmark", "tasks"): _d(
        100, 89, 100, "tasks", "the data is not there to count; the paper's benchmarks hold 89-100 tasks"
    ),
    ("job", "overhead_s"): _d(30, 10, 120, "s per job", "start-up and writing outputs"),
    ("job", "merge_s"): _d(30, 10, 120, "s per merge job", "reading the shards and writing one table"),
    ("server", "overhead_s"): _d(900, 300, 1_800, "s per job", "loading a large model into vLLM"),
    ("model", "params_b"): _d(8, 4, 32, "B params", "the size is not in the model's name"),
}


@dataclass(frozen=True)
class Rate:
    """A rate as used for one stage: its value, unit, and where it came from."""

    name: str
    value: Span
    unit: str
    source: str  # "pilot NAME: LABEL (n ITEMS)" or the default's source
    assumed: bool
    n: int | None = None  # the pilot's sample size behind it

    def json(self) -> dict:
        return {
            "rate": self.name,
            **self.value.json(),
            "unit": self.unit,
            "source": self.source,
            "assumed": self.assumed,
            **({"n": self.n} if self.n is not None else {}),
        }


def default(stage: str, name: str) -> Rate:
    """The stage's own default for a rate (`StageDef.rates`), else its kind of work's; `stage` may
    name a group of rates of its own (benchmark, job, server, model)."""
    st = STAGES.get(stage)
    kind = "trials" if st and st.trials else "requests" if st and st.llm else stage
    d = st.rates[name] if st and name in st.rates else DEFAULTS[(kind, name)]
    return Rate(name, d.value, d.unit, d.source, assumed=True)


def model_params_b(spec: dict | None) -> tuple[float, str] | None:
    """A model's parameters in billions: from an `NB` in its name (Qwen/Qwen3-32B), or counted from
    a tiny model's shape; None when neither says."""
    if not spec:
        return None
    if spec.get("kind") == "tiny":
        h, i, n = spec.get("hidden_size", 64), spec.get("intermediate_size", 128), spec.get("num_hidden_layers", 2)
        v = spec.get("vocab_size", 1024)
        return (2 * v * h + n * (4 * h * h + 3 * h * i)) / 1e9, "counted from the tiny model's shape"
    m = re.search(r"(\d+(?:\.\d+)?)[Bb](?![a-z])", str(spec.get("path") or spec.get("model") or ""))
    return (float(m.group(1)), "from the model's name") if m else None


def model_key(node) -> str:
    """Who does a node's work, for matching a pilot's rates: ENGINE:MODEL for LLM stages, the
    base model for training, the served checkpoint's base model for an eval of it."""
    s = node.settings
    if STAGES[node.stage].training:
        return f"train:{_spec_key(_base_model(node))}"
    if any(STAGES[i.stage].training for i in node.inputs[-1:]):  # an eval of a checkpoint
        return f"eval:{s.get('engine')}:{_spec_key(_base_model(node.inputs[-1]))}"
    return f"{s.get('engine')}:{s.get('model') or s.get('engine')}"


def _base_model(node) -> dict | None:
    while trained := [i for i in node.inputs if STAGES[i.stage].training]:
        node = trained[0]  # back to the first training run: its base model
    return node.settings.get("model") if STAGES[node.stage].training else None


def _spec_key(spec: dict | None) -> str:
    if not spec:
        return "?"
    if spec.get("kind") == "pretrained":
        return str(spec.get("path")).rstrip("/").rsplit("/", 2)[-1] if "/" in str(spec.get("path")) else spec["path"]
    if spec.get("kind") == "tiny":
        return (
            f"tiny(hidden {spec.get('hidden_size')}, layers {spec.get('num_hidden_layers')}, "
            f"vocab {spec.get('vocab_size')}, seed {spec.get('seed')}, {spec.get('tokenizer')})"
        )
    return ",".join(f"{k}={spec[k]}" for k in sorted(spec) if k != "chat_template")
