"""Rollout shards through Harbor: for tasks that need their container image (docker, daytona,
modal, ...), or to use Harbor's own agents. The shard's tasks go to one Harbor job per number
of attempts; the job dirs are ingested into trace rows in the shard's trial order. A rerun
of a killed shard runs its Harbor jobs again (Harbor's job dir is the unit of work here).
Subagent trajectories (terminus-2's context summarization) come as extra `is_subagent` rows
after the shard's trials, as Harbor's own trace export has them: `trace_filter.drop_subagent`
decides whether they train; eval scores count trials only.

An installed agent (mini-swe-agent) in otbuild's environment runs inside the sandbox from
otbuild's own install (`agent_dir`), and reaches its model through the shard's capture proxy
only: a unix socket per trial (`model_proxy`, the proxy's control socket), the proxy holding the
key. Its trace is built from that trial's captured calls (otbuild/harbor/captured.py)."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import pyarrow as pa
import pyarrow.parquet as pq

from otbuild.capture.proxy import CaptureProxy
from otbuild.engines import SERVERS
from otbuild.harbor.job import SANDBOX_MODEL_URL
from otbuild.progress import JobProgress
from otbuild.settings.engines import concurrency
from otbuild.settings.stages import RolloutSettings
from otbuild.settings.trials import SCRIPTED, harbor_agent
from otbuild.tasks.table import TASK_SCHEMA, task_rows
from otbuild.tasks.task_toml import host_env_refusal, task_config
from otbuild.tasks.taskdir import TaskDir

HOST_ENV_NOT_ALLOWED = "HostEnvNotAllowed"  # otbuild/harness/endings.py's exception (outcome not_run)


def run_harbor_shard(
    cfg: RolloutSettings, inputs: list[Path], outdir: Path, shard: int, trials: list, ask_tokens: bool = True
) -> tuple[list[dict], list[dict]]:
    """The shard's trace rows, and its captured calls (with `capture`, for Harbor's terminus
    agents: each Harbor job's, in the order they came; not yet matched to trials). A job no
    proxy captured gives the calls its trials report as Harbor's rollout details (their token
    ids and log-probs, keyed by trial name). `ask_tokens`: a vLLM otbuild started is asked for
    token ids and log-probs (not for an eval's model)."""
    return asyncio.run(_run(cfg, inputs, outdir, shard, trials, ask_tokens))


async def _run(
    cfg: RolloutSettings, inputs: list[Path], outdir: Path, shard: int, trials: list, ask_tokens: bool
) -> tuple[list[dict], list[dict]]:
    from otbuild.harbor.ingest import read_job
    from otbuild.harbor.job import run_harbor_job
    from otbuild.tasks.export import export_names

    rows = task_rows(inputs, {t.row for t in trials}, columns=TASK_SCHEMA.names)
    # Harbor fills a task.toml's `${VAR}` from its own environment: a task asking for one the
    # recipe's host_env does not name is not handed to it (as otbuild's harness refuses it)
    refused = {r: why for r, row in rows.items() if (why := host_env_refused(row, cfg.host_env))}
    per_task: dict[int, int] = defaultdict(int)
    for t in trials:
        if t.row not in refused:
            per_task[t.row] += 1
    by_attempts: dict[int, list[int]] = defaultdict(list)
    for row, n in per_task.items():
        by_attempts[n].append(row)
    work = outdir / "harbor" / f"shard-{shard}-of-{cfg.shards}"
    work.mkdir(parents=True, exist_ok=True)
    options = harbor_options(cfg)
    names: dict[int, str] = {}  # row -> its task dir in the Harbor jobs (copies apart)
    job_rows: list[dict] = []
    engine = proxy = None
    calls: list[dict] = []
    by_trial: dict[str, list[dict]] = {}  # an installed agent's calls, per Harbor trial name
    installed = sandboxed_agent(cfg)
    version = None  # the installed agent's, from otbuild's install
    watching = asyncio.create_task(_show_progress(work, len(trials)))
    try:
        model, base_url = cfg.model, cfg.base_url
        managed = cfg.engine in SERVERS  # a server otbuild starts
        if cfg.engine not in SCRIPTED and by_attempts:  # Harbor's agent talks to the endpoint; it is asked once first
            from otbuild.engines import open_engine
            from otbuild.engines.endpoint import probe

            engine = await open_engine(cfg)  # vllm, transformers: the server starts here
            await probe(engine)  # a wrong key, an unknown model: EndpointError before any trial
            if managed:  # a server otbuild started: its model and address
                from otbuild.engines.managed import ManagedServerEngine

                server = cast(ManagedServerEngine, engine)
                model, base_url = server.model, server.base_url
            # Harbor's terminus agents ask the model from Harbor's own process, on this host: they
            # reach a proxy on loopback (an agent installed in the task's container would not)
            if cfg.capture and base_url and options["agent"].startswith("terminus"):
                from otbuild.engines.capture import harbor_proxy

                proxy = harbor_proxy(base_url, cfg, managed=managed, ask_tokens=ask_tokens)
            # an installed agent asks from inside the sandbox: the proxy's socket is its one way out
            if installed and base_url:
                proxy, options = sandbox_proxy(cfg, base_url, options, ask_tokens)
                base_url = SANDBOX_MODEL_URL
                version = installed_agent_version(options)
        for n, task_rows_n in sorted(by_attempts.items()):
            tasks = work / f"tasks-{n}.parquet"
            pq.write_table(pa.Table.from_pylist([rows[r] for r in task_rows_n], TASK_SCHEMA), tasks)
            names.update(zip(task_rows_n, export_names(tasks)))
            job = await asyncio.to_thread(
                run_harbor_job,
                tasks,
                work,
                model=f"openai/{model}" if model else None,
                base_url=proxy.url(f"attempts-{n}") if proxy is not None and not installed else base_url,
                n_attempts=n,
                n_concurrent=concurrency(cfg),
                job_name=f"attempts-{n}",
                api_key_env=None if installed else cfg.api_key_env,  # the proxy holds the key
                host_env=cfg.host_env,
                max_retries=cfg.infra_retries,
                log=work / f"attempts-{n}.log",
                **options,
            )
            job_rows += read_job(job, subagents=True)
            if proxy is not None and installed:  # each trial's own scope: its Harbor trial name
                for trial_dir in sorted(p for p in job.iterdir() if p.is_dir()):
                    by_trial[trial_dir.name] = await asyncio.to_thread(proxy.take, trial_dir.name)
            elif proxy is None:  # the token ids the agent reported itself (terminus-2's rollout details)
                calls += await asyncio.to_thread(_reported_calls, job)
            else:
                calls += [
                    {**c, "trial": None, "trial_name": None, "harness_agrees": None}
                    for c in await asyncio.to_thread(proxy.take, f"attempts-{n}")
                ]
    finally:
        watching.cancel()
        if proxy is not None:
            proxy.close()
        if engine is not None:
            await engine.aclose()
    ids = [
        {
            "task": rows[t.row]["path"],
            "task_id": rows[t.row]["task_id"],
            "source": rows[t.row]["source"],
            "sample_idx": t.sample_idx,
            "run_id": outdir.name,
            "teacher": f"{cfg.engine}:{cfg.model or cfg.engine}",
        }
        for t in trials
    ]
    not_run = {
        i: not_run_row(rows[t.row]["path"], HOST_ENV_NOT_ALLOWED, refused[t.row], options["agent"], cfg.model)
        for i, t in enumerate(trials)
        if t.row in refused
    }
    out = shard_rows([names.get(t.row, "") for t in trials], ids, job_rows, not_run)
    number = {row["trial_name"]: t.index for t, row in zip(trials, out)}  # the trials' rows come first
    for call in calls:  # a reported call names its trial: its number in the run
        if call["trial_name"] is not None:
            call["trial"] = number.get(call["trial_name"])
    if installed:
        out, captured = captured_rows(out, trials, by_trial, cfg.keep_reasoning, version)
        calls += captured if cfg.capture else []
    return out, calls


def _reported_calls(job: Path) -> list[dict]:
    from otbuild.harbor.ingest import read_job_calls

    return list(read_job_calls(job))


def sandboxed_agent(cfg: RolloutSettings) -> bool:
    """The section's Harbor agent runs inside otbuild's environment (an installed agent)."""
    from otbuild.harbor.job import INSTALLED_AGENTS, OTBUILD_ENV

    return cfg.harbor.environment == OTBUILD_ENV and harbor_agent(cfg.harbor.agent, cfg.engine) in INSTALLED_AGENTS


def sandbox_proxy(
    cfg: RolloutSettings, base_url: str, options: dict, ask_tokens: bool = True
) -> tuple[CaptureProxy, dict]:
    """The shard's proxy for an agent inside the sandbox, holding the recipe's key (the agent
    gets a placeholder), with its control socket; and the options that give Harbor's
    environment that socket and the agent's install."""
    import os
    import secrets

    from otbuild.engines.capture import harbor_proxy
    from otbuild.harbor.job import agent_venv
    from otbuild.rundir import private_dir, runtime_dir

    venv = agent_venv(options["agent"])  # AgentNotInstalled before any trial
    proxy = harbor_proxy(base_url, cfg, managed=cfg.engine in SERVERS, ask_tokens=ask_tokens)
    proxy.api_key = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
    control = proxy.serve_control(private_dir(runtime_dir() / "model") / f"{secrets.token_hex(8)}.ctl")
    kwargs = {**(options["environment_kwargs"] or {}), "agent_dir": str(venv), "model_proxy": control}
    return proxy, {**options, "environment_kwargs": kwargs}


def installed_agent_version(options: dict) -> str | None:
    from otbuild.harbor.job import installed_version

    venv = (options["environment_kwargs"] or {}).get("agent_dir")
    return installed_version(Path(venv), options["agent"]) if venv else None


def captured_rows(
    rows: list[dict], trials: list, by_trial: Mapping[str, list[dict]], keep_reasoning: bool, version: str | None
) -> tuple[list[dict], list[dict]]:
    """Each trial's row with its trace from its captured calls, and the call rows (by trial);
    the agent's version, from otbuild's install, where Harbor could not tell it."""
    from otbuild.harbor.captured import apply

    out, calls = [], []
    for i, row in enumerate(rows):
        if i < len(trials) and row.get("trial_name") in by_trial:
            row, mine = apply(row, by_trial[row["trial_name"]], trials[i].index, keep_reasoning)
            calls += mine
            meta = json.loads(row["metadata"])
            if version and meta.get("agent_version") in (None, "", "unknown"):  # Harbor's, when it found none
                row["metadata"] = json.dumps({**meta, "agent_version": version}, sort_keys=True, default=str)
        out.append(row)
    return out, calls


def host_env_refused(row: dict, allowed: Collection[str]) -> str | None:
    """HostEnvNotAllowed's message for a task row whose task.toml asks for a host variable
    `allowed` does not name (otbuild's harness's check); None otherwise, and for a task.toml
    that does not parse (Harbor's own error is that trial's)."""
    try:
        task = TaskDir.unpack(row["path"], row["task_binary"])
        config = task_config(task)
    except ValueError:  # TaskFormatError and the like: Harbor says why
        return None
    return host_env_refusal(task.name, config, allowed)


def not_run_row(task: str, exception: str, message: str, agent: str, model: str | None) -> dict:
    """A trace row for a trial never handed to Harbor (its outcome `not_run`), as otbuild's
    harness writes one: no conversation, the error's name, its message in the metadata."""
    return {
        "conversations": [],
        "agent": agent,
        "model": model,
        "model_provider": "openai" if model else None,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "task": task,
        "episode": "episode-0",
        "run_id": "",
        "trial_name": task,
        "result": exception,
        "task_id": task,
        "source": "",
        "teacher": agent,
        "sample_idx": 0,
        "n_turns": 0,
        "reward": None,
        "timed_out": False,
        "exception": exception,
        "is_subagent": False,
        "n_input_tokens": 0,
        "n_output_tokens": 0,
        "duration_s": 0.0,
        "metadata": json.dumps({"exception_message": message[:2000]}, sort_keys=True),
    }


async def _show_progress(work: Path, total: int, every: float = 2.0) -> None:
    """The shard's trials done (each Harbor trial dir's result.json) on the run's console."""
    progress = JobProgress("trials", total)
    try:
        while True:
            await asyncio.sleep(every)
            progress.update(min(total, sum(1 for _ in work.glob("jobs/attempts-*/*/result.json"))))
    finally:
        progress.finish()


def shard_rows(
    names: list[str], ids: list[dict], job_rows: list[dict], not_run: Mapping[int, dict] | None = None
) -> list[dict]:
    """One row per trial (its task dir `names[i]`, its columns `ids[i]`) from the Harbor jobs'
    rows: the j-th trial of a task takes the task's j-th attempt; a trial never handed to
    Harbor takes its row in `not_run` (by position). Subagent rows follow all the trials, so
    that merged shards keep the trials in order."""
    not_run = not_run or {}
    main, subagents = {}, defaultdict(list)
    for r in job_rows:
        key = (r["task"], r["sample_idx"])
        if r["is_subagent"]:
            subagents[key].append(r)
        else:
            main[key] = r
    out, subs = [], []
    seen: defaultdict[str, int] = defaultdict(int)
    for i, (name, cols) in enumerate(zip(names, ids)):
        if i in not_run:
            trial = f"{cols['task']}__{cols['sample_idx']}__{cols['run_id'][:8]}"  # as the harness names it
            out.append({**not_run[i], **cols, "trial_name": trial})
            continue
        key = (name, seen[name])
        seen[name] += 1
        out.append({**main[key], **cols})
        subs += [{**sub, **cols} for sub in subagents[key]]
    return out + subs


def harbor_options(cfg: RolloutSettings) -> dict:
    """The trial settings as `run_harbor_job` options: the agent, its timeout and the cap
    (Harbor's min(timeout, max) x multiplier = min(timeout x multiplier, cap)), and for the
    terminus agents the episode limit, temperature and max_tokens, and for a server otbuild
    starts the model's context and output limits (`model_info`: terminus-2 summarizes its
    context by them; litellm knows no self-served model's) at no cost, and on vLLM without
    `capture` Harbor's rollout details (the token ids per call) (harbor.agent_kwargs win)."""
    hb = cfg.harbor
    agent = harbor_agent(hb.agent, cfg.engine)
    kwargs = dict(hb.agent_kwargs)
    if agent.startswith("terminus"):
        kwargs = {"max_turns": cfg.max_episodes, "temperature": cfg.temperature, **kwargs}
        kwargs["llm_call_kwargs"] = {"max_tokens": cfg.max_tokens, **(kwargs.get("llm_call_kwargs") or {})}
        if cfg.engine == "vllm" and not cfg.capture:  # no proxy records the token ids: the agent reports them
            kwargs.setdefault("collect_rollout_details", True)
        context = getattr(cfg.launch, "max_model_len", None)
        if context:
            kwargs["model_info"] = {
                "max_input_tokens": context,
                "max_output_tokens": cfg.max_tokens,
                "input_cost_per_token": 0,
                "output_cost_per_token": 0,
                **(kwargs.get("model_info") or {}),
            }
    return {
        "agent": agent,
        "agent_kwargs": kwargs or None,
        "environment": hb.environment,
        "environment_kwargs": hb.environment_kwargs or None,
        "timeout_multiplier": cfg.timeout_multiplier,
        "agent_timeout_sec": cfg.agent_timeout_sec,
        "max_timeout_sec": cfg.timeout_cap_sec / cfg.timeout_multiplier,
        "verify": cfg.verify,
    }
