"""Calibration: the rates a built pilot recipe measured, read from its artifacts.

- trials (rollout, eval): each trial's row of traces.parquet: turns, input and output tokens,
  duration_s (seconds per concurrent slot); the shard jobs' benchmarks less the trials' time
  give the per-job overhead (start-up, a model server's load);
- LLM requests (augment, task_score): `llm_usage` in the provenance stats, the jobs' benchmarks;
- filters: each one's kept share of its input, from its stats (its caps, such as `sample`,
  counted as kept; drops that follow from an earlier stage left out: `StageDef.keep_rate_reasons`);
- sft: the tokenized set (`data.tokens` per trace), `train_seconds` x devices per token seen,
  each step's time per token of train_log.jsonl (its spread); rl: its job time per trial;
- every other stage: its job seconds (benchmarks/STAGE/ID.tsv).

A rate is offered only for the same kind of work: the same engine and model (ENGINE:MODEL,
a trained model's base), a filter with the same rules behind the same teacher; otherwise the
target falls back on a default and says which pilot rate it did not take, and why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from otbuild import duck
from otbuild.artifact import PROVENANCE
from otbuild.errors import ConfigError
from otbuild.estimate.rates import Rate, model_key, model_params_b
from otbuild.report.costs import benchmark_files, read_benchmark
from otbuild.span import Span, mean_span, rate_span, ratio_span
from otbuild.stages import STAGES

SMALL_PILOT = 30  # items below which a pilot's rate is flagged as saying little


@dataclass
class Measured:
    """A rate one pilot artifact measured: per-item values (a cap may apply at the target) or a span."""

    name: str
    unit: str
    source: str
    values: list[float] | None = None
    span: Span | None = None
    n: int | None = None
    per: float | None = None  # the amount of data the pilot's figure was for (sft: its tokens per epoch)

    def rate(self, cap: float | None = None) -> Rate:
        if self.values is not None:
            vals = [min(v, cap) for v in self.values] if cap is not None else self.values
            span = mean_span(vals)
        elif self.span is not None:
            span = self.span.cap(cap)
        else:
            raise ValueError(f"measured {self.name}: neither values nor a span")
        return Rate(self.name, span, self.unit, self.source, assumed=False, n=self.n)


@dataclass
class Pilot:
    name: str
    root: Path
    measured: dict[tuple[str, str], dict[str, Measured]] = field(default_factory=dict)  # (stage, match) -> rates

    def find(self, stage: str, match: str, name: str) -> Measured | None:
        return self.measured.get((stage, match), {}).get(name)

    def other(self, stage: str, name: str) -> list[tuple[str, Measured]]:
        """The same rate measured for other work (another model or filter): why it was not taken."""
        return [(m, r[name]) for (s, m), r in self.measured.items() if s == stage and name in r]


def match(node) -> str:
    """What a target node must share with a pilot's to take its rates."""
    if STAGES[node.stage].llm or STAGES[node.stage].training:  # a model does the work
        return model_key(node)
    if STAGES[node.stage].filter:
        rules = {k: v for k, v in node.identity.items() if k not in ("sample", "score", "llm")}
        upstream = [model_key(i) for i in node.inputs if STAGES[i.stage].traces and STAGES[i.stage].llm]
        return json.dumps({"rules": rules, "teacher": upstream}, sort_keys=True, default=str)
    return ""


def calibrate(plan, root: Path) -> Pilot:
    """The rates of `plan` (a pilot recipe, planned in its project `root`), from its artifacts.
    Every artifact but the report must be built (ConfigError naming those that are not)."""
    name = plan.recipe.name
    records = {n.id: _record(root / n.dir) for n in plan.nodes}
    missing = [
        f"{n.label} ({n.dir / PROVENANCE})" for n in plan.nodes if records[n.id] is None and n is not plan.nodes[-1]
    ]  # the last: its report
    if missing:
        raise ConfigError(
            f"--from {name} ({plan.recipe.path}): the pilot is not built; missing in {root}: "
            f"{', '.join(dict.fromkeys(missing))}. Build it first (`otbuild build {name}`)"
        )
    pilot = Pilot(name, root)
    seen = set()
    for n in plan.nodes:
        record = records[n.id]
        if n.id in seen or record is None:
            continue
        seen.add(n.id)
        rates = _measure(n, record, root, f"pilot {name}: {n.label}")
        if rates:
            pilot.measured.setdefault((n.stage, match(n)), {}).update(rates)
    return pilot


def _record(d: Path) -> dict | None:
    try:
        return json.loads((d / PROVENANCE).read_text())
    except (OSError, ValueError):
        return None


def _jobs(n, root: Path) -> tuple[list[float], list[float]]:
    """Seconds of the artifact's work jobs (shards, or its one job) and of its merge job."""
    work: list[float] = []
    merge: list[float] = []
    for p in benchmark_files(n.stage, n.id, root):
        (merge if p.name == "merge.tsv" else work).extend(j["s"] for j in read_benchmark(p))
    return work, merge


def _measure(n, record: dict, root: Path, source: str) -> dict[str, Measured]:
    stats = record.get("stats") or {}
    work, merge = _jobs(n, root)
    out: dict[str, Measured] = {}
    d = STAGES[n.stage]
    if d.trials and d.sharded:
        out = _trials(n, root, source, work)
    elif d.llm and d.sharded:
        out = _requests(n, stats, source, work)
    elif own := getattr(_Measure, n.stage, None):
        out = own(n, record, stats, root, source, work)
    if d.filter:
        out = {**out, **_keep_rate(n, stats, source)}
    if work:  # what a stage estimated by its jobs (Model._table) takes
        out["job_s"] = Measured("job_s", "s per job", f"{source} ({len(work)} job(s))", values=work)
    if merge:
        out["merge_s"] = Measured("merge_s", "s per merge job", f"{source} (merge)", values=merge)
    return out


class _Measure:
    """The rates a stage's own record gives, by stage (those with trials or LLM requests are
    measured by what they ran)."""

    @staticmethod
    def sft(n, record: dict, stats: dict, root: Path, source: str, work: list[float]) -> dict[str, Measured]:
        return _sft(n, record, stats, root, source, work)

    @staticmethod
    def rl(n, record: dict, stats: dict, root: Path, source: str, work: list[float]) -> dict[str, Measured]:
        return _rl(n, stats, source, work)


def _keep_rate(n, stats: dict, source: str) -> dict[str, Measured]:
    """A filter's kept share of its input, from its stats: its rejections that are caps count as
    kept, those that follow from an earlier stage are left out (`StageDef.keep_rate_reasons`)."""
    counted = STAGES[n.stage].keep_rate_reasons
    reasons = stats.get("rejected_by_reason") or {}
    capped = sum(v for k, v in reasons.items() if counted.get(k) == "kept")
    total = (
        stats.get("kept", 0)
        + stats.get("rejected", 0)
        - sum(v for k, v in reasons.items() if counted.get(k) == "apart")
    )
    if total <= 0:
        return {}
    kept = stats.get("kept", 0) + capped
    return {
        "keep_rate": Measured(
            "keep_rate", "kept / in", f"{source} ({total} rows)", span=rate_span(kept, total), n=total
        )
    }


def _trials(n, root: Path, source: str, work: list[float]) -> dict[str, Measured]:
    from otbuild.settings.engines import concurrency
    from otbuild.usage import FAILED_REQUEST

    # its traces.parquet, or one per folder where it runs several kinds of trial (task_check: oracle/, noop/)
    here = root / n.main_output.parent
    paths = [here / "traces.parquet"] if (here / "traces.parquet").exists() else sorted(here.glob("*/traces.parquet"))
    if not paths:
        return {}
    rows = (
        duck.connect()
        .execute(
            f"SELECT n_turns + CASE WHEN {FAILED_REQUEST} THEN 1 ELSE 0 END, coalesce(n_input_tokens, 0), "
            f"coalesce(n_output_tokens, 0), coalesce(duration_s, 0), "
            "coalesce(try_cast(json_extract_string(metadata, '$.verifier_s') AS DOUBLE), 0) "
            f"FROM read_parquet([{', '.join(duck.sql_literal(p) for p in paths)}]) "
            "WHERE NOT coalesce(is_subagent, false)"
        )
        .fetchall()
    )
    if not rows:
        return {}
    k = len(rows)
    src = f"{source} ({k} trials)"
    reqs = [max(r[0], 1) for r in rows]
    out = {
        "turns_per_trial": Measured("turns_per_trial", "turns", src, values=[float(r[0]) for r in rows], n=k),
        # pooled over the trials' requests: a long trial's requests carry longer conversations
        "input_tokens_per_request": Measured(
            "input_tokens_per_request", "tokens", src, span=ratio_span([r[1] for r in rows], reqs), n=k
        ),
        "output_tokens_per_request": Measured(
            "output_tokens_per_request", "tokens", src, span=ratio_span([r[2] for r in rows], reqs), n=k
        ),
        "seconds_per_trial": Measured(
            "seconds_per_trial", "s per concurrent slot", src, values=[float(r[3]) for r in rows], n=k
        ),
    }
    if any(r[4] for r in rows):  # the verifier ran: its share, and a trial without it (teacher.verify: false)
        out["verifier_s_per_trial"] = Measured(
            "verifier_s_per_trial", "s per trial", src, values=[float(r[4]) for r in rows], n=k
        )
        out["unverified_seconds_per_trial"] = Measured(
            "unverified_seconds_per_trial",
            "s per concurrent slot",
            src,
            values=[max(float(r[3] - r[4]), 0.0) for r in rows],
            n=k,
        )
    if work:  # what a shard job spends besides its trials: start-up, a server's load, writing
        busy = sum(r[3] for r in rows) / concurrency(n.config) / len(work)
        out["overhead_s"] = Measured(
            "overhead_s", "s per job", f"{source} ({len(work)} job(s))", values=[max(s - busy, 0.0) for s in work]
        )
    return out


def _requests(n, stats: dict, source: str, work: list[float]) -> dict[str, Measured]:
    from otbuild.settings.engines import concurrency

    usage = next(iter((stats.get("llm_usage") or {}).values()), None)
    if not usage or not usage.get("requests"):
        return {}
    q = usage["requests"]
    src = f"{source} ({q} requests)"
    out = {
        "input_tokens_per_request": Measured(
            "input_tokens_per_request", "tokens", src, span=Span.of(usage["input_tokens"] / q), n=q
        ),
        "output_tokens_per_request": Measured(
            "output_tokens_per_request", "tokens", src, span=Span.of(usage["output_tokens"] / q), n=q
        ),
    }
    if work:
        per = sum(work) * concurrency(n.config) / q
        out["seconds_per_request"] = Measured(
            "seconds_per_request", "s per concurrent slot", src, span=Span(per, per * 0.5, per * 1.5), n=q
        )
    return out


def _sft(n, record: dict, stats: dict, root: Path, source: str, work: list[float]) -> dict[str, Measured]:

    data = stats.get("data") or {}
    out = {}
    if data.get("traces") and data.get("tokens"):
        per = data["tokens"] / data["traces"]
        out["tokens_per_trace"] = Measured(
            "tokens_per_trace",
            "tokens",
            f"{source} ({data['traces']} traces)",
            span=Span(per, per * 0.9, per * 1.1),
            n=data["traces"],
        )
    seen, secs = stats.get("tokens_seen"), stats.get("train_seconds")
    if seen and secs:
        jobs = [j for p in benchmark_files(n.stage, n.id, root) for j in read_benchmark(p)]
        devices = max([j["gpus"] for j in jobs] + [len(stats.get("placement") or []), 1])
        per = secs * devices / seen
        steps = _step_rates(root / n.dir / "train_log.jsonl")
        spread = mean_span(steps) if len(steps) > 1 else Span(per, per * 0.8, per * 1.25)
        scale = per / spread.estimate if spread.estimate else 1.0
        params = (
            model_params_b(n.settings.get("model"))
            if n.settings.get("model", {}).get("kind") == "pretrained" and any(j["gpus"] for j in jobs)
            else None
        )  # on GPUs: scalable to another model's size
        out["gpu_seconds_per_token"] = Measured(
            "gpu_seconds_per_token",
            "device-s per token",
            f"{source} ({seen:,} tokens on {devices} device(s))",
            span=Span(per, spread.low * scale, spread.high * scale),
            n=len(steps),
            per=params[0] if params else None,
        )
        if work:  # start-up, the tokenizer, tokenization, saving: partly growing with the data
            out["overhead_s"] = Measured(
                "overhead_s",
                "s per job",
                f"{source} (job less training)",
                values=[max(s - secs, 0.0) for s in work],
                per=data.get("tokens"),
            )
    return out


def _step_rates(path: Path) -> list[float]:
    """Seconds per token of each optimizer step (the log's cumulative `time` and `tokens`)."""
    out: list[float] = []
    last = 0.0
    try:
        lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    except (OSError, ValueError):
        return out
    for r in lines:
        t, k = r.get("time"), r.get("tokens")
        if isinstance(t, int | float) and k:
            out.append(max(t - last, 0.0) / k)
            last = t
    return out[1:] if len(out) > 2 else out  # the first step carries the warm-up


def _rl(n, stats: dict, source: str, work: list[float]) -> dict[str, Measured]:
    cfg = n.config
    trials = cfg.steps * cfg.batch_size * cfg.samples_per_task
    usage = next(iter((stats.get("llm_usage") or {}).values()), None)
    out = {}
    src = f"{source} ({trials} trials)"
    if usage and usage.get("requests"):
        q = usage["requests"]
        out["turns_per_trial"] = Measured("turns_per_trial", "turns", src, span=Span.of(q / trials), n=trials)
        out["input_tokens_per_request"] = Measured(
            "input_tokens_per_request", "tokens", src, span=Span.of(usage["input_tokens"] / q), n=trials
        )
        out["output_tokens_per_request"] = Measured(
            "output_tokens_per_request", "tokens", src, span=Span.of(usage["output_tokens"] / q), n=trials
        )
    if work:
        per = sum(work) / trials
        out["seconds_per_trial"] = Measured(
            "seconds_per_trial", "s per trial (job)", src, span=Span(per, per * 0.8, per * 1.25), n=trials
        )
    return out
