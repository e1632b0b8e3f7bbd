"""RL stage (RLOO): inputs [an SFT checkpoint's checkpoint.json, a task parquet] -> the
checkpoint dir (otbuild/train/rl/). Outputs: checkpoint.json (manifest, written last: feeds
downstream), model.safetensors, train_log.jsonl (reward and loss per step), config.json,
tokenizer files. A killed run resumes from outdir/checkpoints/."""

from __future__ import annotations

from pathlib import Path

from otbuild import usage
from otbuild.settings.stages import RlSettings
from otbuild.settings.train import Rl
from otbuild.span import Span
from otbuild.stagekit import TRAINING, DefaultRate, Inputs, StageDef, stage_run
from otbuild.stagekit.training import REWARD_KEYS, TRAIN_FILES, TRAINED, run_training


@stage_run
def run(cfg: RlSettings, inputs: Inputs, outdir: Path) -> dict:
    inputs, skipped = without_bands(cfg, inputs, Path(outdir))
    if cfg.trainer == "skyrl":
        from otbuild.train.skyrl import train

        manifest = train(cfg, inputs, outdir)
        return {**skipped, **{k: manifest[k] for k in ("steps", "world_size", "files", "skyrl")}}

    def here() -> dict:
        from otbuild.train.rl.trainer import train

        return train(cfg, inputs, outdir)

    stats = run_training("rl", cfg, inputs, outdir, here)
    # the rollouts' requests and tokens: the policy served by vLLM, or generating in process
    # (rollout: auto is the one its steps name)
    log = Path(outdir) / "train_log.jsonl"
    engines = usage.rollout_engines(log)
    model = f"{rollout_engine_name(engines, cfg.rollout)}:policy"
    return {**skipped, **stats, "rollout_engines": engines, "llm_usage": usage.of_log(log, model)}


def without_bands(cfg: RlSettings, inputs: Inputs, outdir: Path) -> tuple[Inputs, dict]:
    """The task table less the tasks in `skip_bands`, where it has a `band` column (the
    difficulty stage's): written to outdir/.rl_tasks.parquet by DuckDB, streamed, in order.
    Returns the inputs to train on and what was left out (`skipped_bands`, per band)."""
    import pyarrow.parquet as pq

    from otbuild import duck

    tasks = Path(inputs[1])
    if not cfg.skip_bands or "band" not in pq.read_schema(tasks).names:
        return inputs, {}
    con = duck.connect()
    src = f"read_parquet({duck.sql_literal(tasks)})"
    skip = ", ".join(duck.sql_literal(b) for b in cfg.skip_bands)
    counts = dict(con.execute(f"SELECT band, count(*) FROM {src} WHERE band IN ({skip}) GROUP BY ALL").fetchall())
    (total,) = con.execute(f"SELECT count(*) FROM {src}").fetchone() or (0,)
    left = total - sum(counts.values())
    if total and not left:
        raise RuntimeError(
            f"rl: every one of the {total} tasks is in skip_bands {cfg.skip_bands} ({counts}): "
            "nothing to train on; draw tasks of other bands (task_filter.draw) or set rl.skip_bands: []"
        )
    dest = outdir / ".rl_tasks.parquet"
    outdir.mkdir(parents=True, exist_ok=True)
    duck.copy_to_parquet(con, f"SELECT * FROM {src} WHERE band IS NULL OR band NOT IN ({skip})", dest)
    print(f"rl: {total - left} of {total} tasks left out by band ({counts}), {left} to train on", flush=True)
    return Inputs([inputs[0], dest, *inputs[2:]], getattr(inputs, "names", None)), {
        "skipped_bands": {b: counts.get(b, 0) for b in cfg.skip_bands},
        "tasks_trained_on": left,
    }


def rollout_engine_name(engines: list[str], rollout: str) -> str:
    """The engine of the rollouts ("vllm 0.32.0" -> vllm), else the recipe's `rollout`."""
    return engines[-1].split()[0] if engines else rollout


def estimate(m, n, e) -> None:
    """steps x batch x samples trials of the policy, each of its turns a request, at a pilot's
    seconds per trial (else the default) over the GPUs granted."""
    cfg = n.config
    trials = Span.of(cfg.steps * cfg.batch_size * cfg.samples_per_task)
    turns = m.rate(e, n, "turns_per_trial", cap=cfg.sandbox.max_episodes)
    e.requests = trials * turns
    e.counts.update(steps=Span.of(cfg.steps), trials=trials, requests=e.requests)
    m.tokens(n, e, e.requests, cfg.max_tokens, f"{cfg.rollout}:policy")
    m.job(e, n.stage, 1, trials * m.rate(e, n, "seconds_per_trial") / max(m.grant(n.stage).gpus, 1))
    m.rows[n.id] = Span.of(1)


STAGE = StageDef(
    "rl",
    4,
    TRAINED,
    __name__,
    RlSettings,
    consumes=("checkpoint", "tasks"),
    produces="checkpoint",
    gpu=True,
    trials=True,
    llm=True,
    training=True,
    curve=REWARD_KEYS,
    volatile=TRAIN_FILES,
    reported=(("train_log.jsonl", TRAINING),),
    recipe_field=(Rl | None, None),
    estimate=estimate,
    rates={
        "seconds_per_trial": DefaultRate(Span(300, 100, 900), "GPU-s per trial", "rollout and update of one sample"),
    },
)
