"""The count model: what each node of a plan will do, from the recipe's settings and the rates.

Counts follow the plan: a mix makes `total` tasks, a task filter keeps its input at its keep
rate up to `top_k` and `sample.n` and plans ceil(budget / keep_rate) rollouts, a rollout runs
each task's `n_rollouts` (else `samples_per_task`), the trace filter keeps at its keep rate up
to `sample.n`, SFT trains on traces x tokens per trace (at most cutoff_len) x epochs, RL runs
steps x batch x samples trials, eval benchmark tasks x repeats. An artifact already built
counts what its record says and costs nothing.

Work follows the counts: requests are trials x turns (at most max_episodes), tokens are
requests x tokens per request (output at most max_tokens), a shard job's time is its overhead
plus its trials x seconds per trial over its concurrent slots, SFT's device-seconds are tokens
x seconds per token (x the model's parameters for the paper's figure), GPU-hours are each
job's time x the GPUs the profile grants it, and wall time is the longest path through the
DAG with the shards of a stage in waves of the profile's parallel jobs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from otbuild.estimate.pilot import SMALL_PILOT, Pilot, match
from otbuild.estimate.profile import Grant, Profile
from otbuild.estimate.rates import Rate, default, model_params_b
from otbuild.span import ZERO, Span
from otbuild.stages import STAGES

# the generic estimates a stage may name (`StageDef.estimate`), each a method of Model
GENERIC = ("table", "request_per_task")


@dataclass
class Job:
    rule: str
    count: int  # jobs of this kind
    seconds: Span  # each
    grant: Grant


@dataclass
class StageEstimate:
    label: str
    stage: str
    id: str
    built: bool
    counts: dict[str, Span] = field(default_factory=dict)
    requests: Span = ZERO
    input_tokens: Span = ZERO
    output_tokens: Span = ZERO
    cost: Span | None = None
    model: str | None = None  # ENGINE:MODEL whose tokens these are
    jobs: list[Job] = field(default_factory=list)
    wall_s: Span = ZERO
    rates: list[Rate] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def gpu_hours(self) -> Span:
        return sum((j.seconds * (j.count * j.grant.gpus) for j in self.jobs), ZERO) / 3600

    @property
    def job_seconds(self) -> Span:
        return sum((j.seconds * j.count for j in self.jobs), ZERO)


class Model:
    """One estimate of a plan. `force` moves assumed rates ((stage, rate) -> "low" | "high") to
    one end of their range: how much each assumption moves the totals."""

    def __init__(self, plan, pilots: list[Pilot], profile: Profile, root: Path, force: dict | None = None):
        self.plan, self.pilots, self.profile, self.root = plan, pilots, profile, root
        self.prices = plan.recipe.recipe.prices
        self.force = force or {}
        self.rows: dict[str, Span] = {}  # node id -> rows of its main output
        self.rollouts: dict[str, Span] = {}  # task filter id -> rollouts it plans
        self.distinct: dict[str, Span] = {}  # rollout id -> distinct traces, where fewer than its trials
        self.stages: list[StageEstimate] = []
        self.assumed: dict[tuple[str, str], Rate] = {}
        self.small: dict[str, list[str]] = {}  # a pilot's rates taken from fewer than SMALL_PILOT items

    # -- rates -------------------------------------------------------------------------------
    def rate(
        self,
        e: StageEstimate,
        node,
        name: str,
        cap: float | None = None,
        scale: float = 1.0,
        fallback: Rate | None = None,
    ) -> Span:
        m = match(node)
        for p in self.pilots:
            if found := p.find(node.stage, m, name):
                r = found.rate(cap)
                e.rates.append(r)
                if r.n is not None and r.n < SMALL_PILOT:
                    self.small.setdefault(r.source, []).append(name)
                return r.value * scale
        value = self.assume(e, (node.stage, name), fallback or default(node.stage, name), cap, scale)
        for p in self.pilots:
            for their, meas in p.other(node.stage, name):
                why = (
                    f"it measured {their}, this is {m}"
                    if not STAGES[node.stage].filter
                    else "other rules or another teacher"
                )
                e.notes.append(f"rates of {meas.source.split(' (')[0]} not taken: {why}")
        return value

    def assume(
        self,
        e: StageEstimate,
        key: tuple[str, str],
        r: Rate | None = None,
        cap: float | None = None,
        scale: float = 1.0,
    ) -> Span:
        """A rate assumed (`r`, else the default at `key`: its place in DEFAULTS, or its stage and
        name), recorded as assumed (at one end of its range when `force` says so)."""
        r = r or default(*key)
        value = r.value.cap(cap) * scale
        if side := self.force.get(key):
            value = Span.of(getattr(value, side))
        r = Rate(r.name, value, r.unit, r.source, True)
        e.rates.append(r)
        self.assumed.setdefault(key, r)
        return value

    # -- the plan ----------------------------------------------------------------------------
    def run(self) -> Model:
        seen = set()
        for n in self.plan.nodes:
            if n.id in seen:
                continue
            seen.add(n.id)
            e = StageEstimate(n.label, n.stage, n.id, built=(self.root / n.provenance).is_file())
            if e.built:
                self._built(n, e)
            else:
                self._estimate(n, e)
                e.wall_s = self._wall(e)
            self.stages.append(e)
        return self

    def _estimate(self, n, e: StageEstimate) -> None:
        """The stage's own hook, or the generic estimate it names (checked below the class)."""
        hook = STAGES[n.stage].estimate
        if callable(hook):
            hook(self, n, e)
        else:
            getattr(self, hook)(n, e)

    def _built(self, n, e: StageEstimate) -> None:
        from otbuild.provenance import read_record

        rec = read_record(self.root / n.dir) or {}
        main = n.main_output.name
        rows = next((o.get("rows") for o in rec.get("outputs", []) if o["path"].endswith("/" + main)), None)
        self.rows[n.id] = Span.of(rows or 0)
        if rows is not None:
            e.counts["rows"] = Span.of(rows)
        stats = rec.get("stats") or {}
        if STAGES[n.stage].trials and STAGES[n.stage].sharded and stats.get("trials") is not None:
            e.counts["trials"] = Span.of(stats["trials"])
        if stats.get("rollouts_planned"):  # a task filter that sizes the rollouts
            self.rollouts[n.id] = Span.of(stats["rollouts_planned"])
        e.notes.append("built: reused, costs nothing")

    # -- helpers for the stages' hooks -------------------------------------------------------
    def rows_in(self, n, name: str | None = None) -> Span:
        """The rows of the node's inputs (those the plan names `name` only, when given: the names
        a job's `Inputs` has them by)."""
        return sum(
            (
                self.rows.get(i.id, ZERO)
                for i, named in zip(n.inputs, n.input_names, strict=True)
                if name in (None, named)
            ),
            ZERO,
        )

    def grant(self, rule: str) -> Grant:
        """What the profile grants a rule's jobs."""
        return self.profile.grant(rule)

    def job(self, e: StageEstimate, rule: str, count: int, seconds: Span) -> Grant:
        """`count` jobs of `rule`, `seconds` each, with what the profile grants them."""
        grant = self.grant(rule)
        e.jobs.append(Job(rule, count, seconds, grant))
        return grant

    def assumed_rate(self, name: str, value: Span, unit: str, source: str) -> Rate:
        """A rate the recipe assumes (a `fallback` for `rate`, where no pilot measured it)."""
        return Rate(name, value, unit, source, True)

    def kept_at_rate(self, n, e: StageEstimate, tasks_in: Span) -> Span:
        """A task filter's kept rows: `tasks_in` x its keep rate (a pilot's, else the stage's
        default), counted as tasks_in and tasks_kept."""
        kept = (tasks_in * self.rate(e, n, "keep_rate")).ceil()
        self.rows[n.id] = kept
        e.counts.update(tasks_in=tasks_in, tasks_kept=kept)
        return kept

    def known_rows(self, n) -> Span | None:
        """Rows a stage that brings data in will have, where its settings or its data say: a
        synthetic count, a parquet's rows, Harbor task dirs; at most its `sample.n`. None: unknown."""
        s = n.settings
        rows = None
        if s.get("kind") == "synthetic":
            rows = s["count"]
        elif s.get("path") and Path(s["path"]).exists():
            p = Path(s["path"])
            try:
                if p.is_file() and p.suffix == ".parquet":
                    import pyarrow.parquet as pq

                    rows = pq.ParquetFile(p).metadata.num_rows
                elif p.is_dir() and s.get("kind") in ("harbor-dir", "tb1-dir"):
                    rows = sum(1 for d in p.iterdir() if d.is_dir())
            except OSError:
                rows = None
        if rows is not None and (s.get("sample") or {}).get("n"):
            rows = min(rows, s["sample"]["n"])
        return Span.of(rows) if rows is not None else None

    def table(self, n, e: StageEstimate) -> None:
        """A generic estimate (`StageDef.estimate="table"`): a stage whose time hardly grows with
        rows at these sizes (DuckDB over parquet, the report, the ranking), its job time as a
        pilot measured it; its rows are its inputs'."""
        self.job(e, n.stage, 1, self.job_rate(e, n, "job_s"))
        self.rows[n.id] = self.rows_in(n)

    def request_per_task(self, n, e: StageEstimate) -> None:
        """A generic estimate (`StageDef.estimate="request_per_task"`): an LLM stage that asks one
        request per task of its input (task_score, skills) and keeps every row."""
        tasks = self.rows_in(n)
        self.requests(n, e, tasks)
        self.rows[n.id] = tasks
        e.counts["tasks"] = tasks

    def measured(self, n, name: str) -> bool:
        """A pilot measured rate `name` for this node's work."""
        return any(p.find(n.stage, match(n), name) for p in self.pilots)

    def job_rate(self, e: StageEstimate, n, name: str, server: bool = False, otherwise: str = "overhead_s") -> Span:
        """A job time a pilot measured for this work (`name`), else the default job overhead
        (`otherwise`; a vLLM server's load with `server`)."""
        if self.measured(n, name):
            return self.rate(e, n, name)
        key = ("server" if server else "job", otherwise)
        return self.assume(e, key)

    def brought(self, n, e: StageEstimate, assumed: tuple[str, str]) -> Span:
        """The rows a stage that brings data in will have (`known_rows`), else the rate assumed
        at `assumed` (a place in DEFAULTS); its job a table stage's (`table`)."""
        rows = self.known_rows(n)
        if rows is None:
            rows = self.assume(e, assumed)
        self.table(n, e)
        self.rows[n.id] = rows
        return rows

    def requests(self, n, e: StageEstimate, requests: Span) -> None:
        """A sharded stage that sends `requests` LLM requests (its settings an LLM section): their
        tokens and cost, its shard jobs and its merge."""
        from otbuild.settings.engines import concurrency

        cfg = n.config
        e.counts["requests"] = e.requests = requests
        self.tokens(n, e, requests, cfg.max_tokens, f"{cfg.engine}:{cfg.model}")
        shards = cfg.shards
        per = self.rate(e, n, "seconds_per_request")
        over = self.job_rate(e, n, "overhead_s", server=cfg.engine == "vllm")
        self.job(e, n.stage, shards, over + requests / shards * per / concurrency(cfg))
        self._merge(n, e)

    def tokens(self, n, e: StageEstimate, requests: Span, max_tokens: int, model: str) -> None:
        """The tokens of `requests` to `model` (ENGINE:MODEL; output at most `max_tokens`), priced."""
        from otbuild.report.costs import price_of
        from otbuild.usage import cost

        e.model = model
        if model.startswith("oracle:"):  # it replays solve.sh: no model, no tokens
            return
        e.input_tokens = requests * self.rate(e, n, "input_tokens_per_request")
        e.output_tokens = requests * self.rate(e, n, "output_tokens_per_request", cap=max_tokens)
        price = price_of(model, self.prices)
        if price is not None:
            e.cost = Span(
                *(
                    cost(
                        {
                            "input_tokens": getattr(e.input_tokens, k),  # priced: never None
                            "output_tokens": getattr(e.output_tokens, k),
                        },
                        price,
                    )
                    or 0.0
                    for k in ("estimate", "low", "high")
                )
            )
        elif e.input_tokens.high + e.output_tokens.high > 0 and model.startswith("openai:"):  # served: GPU-hours
            e.notes.append(f"no price for {model}: set `prices:` in the recipe")

    def _merge(self, n, e: StageEstimate) -> None:
        merge = self.job_rate(e, n, "merge_s", otherwise="merge_s")
        self.job(e, f"{n.stage}_merge", 1, merge)

    def trials(self, n, e: StageEstimate, trials: Span, model: str, server: bool) -> None:
        """A sharded stage that runs `trials` agent trials with `model` (its settings the trial
        settings; `server`: a vLLM server loads first): requests, tokens, shard jobs, merge."""
        from otbuild.settings.engines import concurrency

        cfg = n.config
        turns = self.rate(e, n, "turns_per_trial", cap=cfg.max_episodes)
        e.requests = trials * turns
        e.counts.update(trials=trials, requests=e.requests)
        self.tokens(n, e, e.requests, cfg.max_tokens, model)
        per = self._seconds_per_trial(n, e, trials)
        over = self.job_rate(e, n, "overhead_s", server)
        shards = cfg.shards
        self.job(e, n.stage, shards, over + trials / shards * per / concurrency(cfg))
        self._merge(n, e)

    def _seconds_per_trial(self, n, e: StageEstimate, trials: Span) -> Span:
        """A trial's time in a slot; a teacher with `verify: false` runs no verifier, so a pilot
        that ran one gives its trials' time without it, and the note says what that saves."""
        from otbuild.settings.engines import concurrency

        if getattr(n.config, "verify", True) or not self.measured(n, "verifier_s_per_trial"):
            if getattr(n.config, "verify", True) is False:
                e.notes.append(
                    "teacher.verify: false: no pilot measured a verifier, so its trials' time is "
                    "taken as the pilot's (or the default) as it stands"
                )
            return self.rate(e, n, "seconds_per_trial")
        saved = self.rate(e, n, "verifier_s_per_trial")
        hours = (trials * saved / concurrency(n.config)).estimate / 3600 * max(self.grant(n.stage).gpus, 1)
        e.notes.append(
            f"teacher.verify: false: no verifier runs; the pilot's took {saved.estimate:,.1f} s per "
            f"trial, {hours:,.1f} {'GPU' if self.grant(n.stage).gpus else 'job'}-hours saved here"
        )
        return self.rate(e, n, "unverified_seconds_per_trial")

    def device_seconds_per_token(self, n, e: StageEstimate) -> Span:
        """A training job's device-seconds per token: a pilot's, else another pilot's scaled by the
        model's parameters, else the paper's 8B figure scaled."""
        if self.measured(n, "gpu_seconds_per_token"):
            return self.rate(e, n, "gpu_seconds_per_token")
        found = model_params_b(n.settings.get("model"))
        if found is None:
            params = self.assume(e, ("model", "params_b"))
        else:
            params = Span.of(found[0])
            other = [m for p in self.pilots for _, m in p.other(n.stage, "gpu_seconds_per_token") if m.per]
            if other:  # a pretrained model trained on GPUs: its rate x the ratio of parameters (6N FLOPs a token)
                r = other[0].rate()
                ratio = found[0] / (other[0].per or 1.0)  # `per` is set: filtered above
                e.rates.append(
                    Rate(
                        r.name,
                        r.value * ratio,
                        r.unit,
                        f"{r.source}, a {other[0].per:g}B model: x {ratio:g} for {found[0]:g}B parameters",
                        False,
                        r.n,
                    )
                )
                return r.value * ratio
            e.notes.append(f"{found[0]:g}B parameters ({found[1]}): the paper's 8B figure x {found[0] / 8:g}")
        return self.rate(e, n, "gpu_seconds_per_token") * params

    def training_overhead(self, n, e: StageEstimate, per_epoch: Span) -> Span:
        """What a training job spends besides training. A pilot cannot tell how much of it is fixed
        (start-up, saving) and how much grows with the data (tokenizer, tokenization): the range
        spans both readings, the estimate is their middle."""
        found = next((m for p in self.pilots if (m := p.find(n.stage, match(n), "overhead_s"))), None)
        if found is None:
            return self.job_rate(e, n, "overhead_s")
        fixed = self.rate(e, n, "overhead_s").estimate
        grown = fixed * per_epoch.estimate / found.per if found.per else fixed
        lo, hi = sorted((fixed, grown))
        span = Span((fixed + grown) / 2, lo, hi)
        e.rates[-1] = Rate(
            "overhead_s",
            span,
            "s per job",
            e.rates[-1].source + ": fixed to grown with the tokens",
            False,
            e.rates[-1].n,
        )
        return span

    # -- time --------------------------------------------------------------------------------
    def _wall(self, e: StageEstimate) -> Span:
        """The stage's own wall time: its jobs of each kind in waves of the parallel jobs."""
        total = ZERO
        for j in e.jobs:
            total = total + j.seconds * math.ceil(j.count / max(self.profile.parallel, 1))
        return total

    def critical_path(self) -> Span:
        by_id = {s.id: s for s in self.stages}
        finish: dict[str, Span] = {}
        for n in self.plan.nodes:
            if n.id in finish:
                continue
            start = [finish[i.id] for i in n.inputs if i.id in finish]
            begin = Span(*(max([getattr(s, k) for s in start] + [0.0]) for k in ("estimate", "low", "high")))
            finish[n.id] = begin + by_id[n.id].wall_s
        return Span(*(max([getattr(s, k) for s in finish.values()] + [0.0]) for k in ("estimate", "low", "high")))


# Every stage is estimated by its own hook or the generic estimate it names (`StageDef.estimate`):
# a stage without one fails at import, never falls back to a guess.
if unestimated := [n for n, d in STAGES.items() if not callable(d.estimate) and d.estimate not in GENERIC]:
    raise ImportError(
        f"otbuild.estimate.model: no estimate for stage(s) {', '.join(unestimated)} "
        f"(StageDef.estimate: the stage's hook, or one of {', '.join(GENERIC)})"
    )
