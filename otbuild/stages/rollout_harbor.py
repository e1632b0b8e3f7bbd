"""Rollout shards through Harbor: for tasks that need their container image (docker, daytona,
modal, ...), or to use Harbor's own agents. The shard's tasks go to one Harbor job per number
of attempts; the job dirs are ingested into trace rows in the shard's trial order. A rerun
of a killed shard runs its Harbor jobs again (Harbor's job dir is the unit of work here)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from otbuild.tasks.table import TASK_SCHEMA


def run_harbor_shard(settings: dict, inputs: list[Path], outdir: Path, shard: int, trials: list) -> list[dict]:
    return asyncio.run(_run(settings, inputs, outdir, shard, trials))


async def _run(settings: dict, inputs: list[Path], outdir: Path, shard: int, trials: list) -> list[dict]:
    from otbuild.harbor.ingest import read_job
    from otbuild.harbor.job import run_harbor_job
    from otbuild.stages.rollout import task_rows

    rows = task_rows(inputs, {t.row for t in trials}, columns=TASK_SCHEMA.names)
    per_task: dict[int, int] = defaultdict(int)
    for t in trials:
        per_task[t.row] += 1
    by_attempts: dict[int, list[int]] = defaultdict(list)
    for row, n in per_task.items():
        by_attempts[n].append(row)
    work = outdir / "harbor" / f"shard-{shard}-of-{settings['shards']}"
    work.mkdir(parents=True, exist_ok=True)
    hb = settings["harbor"]
    traces: dict[tuple[str, int], dict] = {}
    engine = None
    try:
        agent = hb["agent"] or ("oracle" if settings["engine"] == "oracle" else "terminus-2")
        model, base_url = settings.get("model"), settings.get("base_url")
        if settings["engine"] in ("vllm", "transformers"):  # start the server; Harbor talks to it
            from otbuild.engines import engine_settings, open_engine

            engine = await open_engine(engine_settings(settings))
            model, base_url = engine.model, engine.base_url
        for n, task_rows_n in sorted(by_attempts.items()):
            tasks = work / f"tasks-{n}.parquet"
            pq.write_table(pa.Table.from_pylist([rows[r] for r in task_rows_n], TASK_SCHEMA), tasks)
            job = await asyncio.to_thread(
                run_harbor_job, tasks, work, agent=agent, model=f"openai/{model}" if model else None,
                base_url=base_url, environment=hb["environment"], n_attempts=n,
                n_concurrent=settings["concurrency"], job_name=f"attempts-{n}",
                agent_kwargs=hb["agent_kwargs"] or None, environment_kwargs=hb["environment_kwargs"] or None,
                timeout_multiplier=settings["timeout_multiplier"], agent_timeout_sec=settings.get("agent_timeout_sec"),
                api_key_env=settings.get("api_key_env"), log=work / f"attempts-{n}.log")
            for trace in read_job(job):
                traces[(trace["task"], trace["sample_idx"])] = trace
    finally:
        if engine is not None:
            await engine.aclose()
    out, seen = [], defaultdict(int)
    for t in trials:  # the j-th attempt of a task fills its j-th trial in this shard
        row = rows[t.row]
        j = seen[row["path"]]
        seen[row["path"]] += 1
        out.append({**traces[(row["path"], j)], "task_id": row["task_id"], "source": row["source"],
                    "sample_idx": t.sample_idx, "run_id": outdir.name,
                    "teacher": f"{settings['engine']}:{settings.get('model') or 'oracle'}"})
    return out
