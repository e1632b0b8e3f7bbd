"""A run of trials that is broken says so (docs/failures.md, "A broken run"): real trials in the
sandbox, merged by the real stage code, judged in DuckDB over the merged traces."""

import json

import pyarrow.parquet as pq
import pytest

from otbuild.settings.stages import RolloutSettings
from otbuild.sources.synthetic import generate
from otbuild.stagekit.run_health import RunBroken
from otbuild.stages import eval as eval_stage
from otbuild.stages import rollout
from otbuild.stages.eval import EvalSettings
from otbuild.tasks.table import write_tasks
from otbuild.traces.table import write_traces
from tests.conftest import chat_answer
from tests.harness.test_harness import answer
from tests.stagekit.test_failures import needs_sandbox, row

OVERFLOW = {
    "error": {
        "message": "This model's maximum context length is 512 tokens. However, you requested 2100 tokens.",
        "type": "BadRequestError",
        "code": 400,
    }
}


def _tasks(tmp_path, n=4, solution=None):
    records = list(generate(n, 3))
    for rec in records:
        if solution is not None:
            rec.task.add("solution/solve.sh", solution, executable=True)
    write_tasks(tmp_path / "tasks.parquet", records, source="synth")
    return tmp_path / "tasks.parquet"


def _rollout(cfg, tasks, out):
    rollout.run_shard(cfg, [tasks], out, 0)
    return rollout.run(cfg, [tasks], out)


@needs_sandbox
def test_a_model_that_overflows_its_context_every_trial_fails_the_rollout(tmp_path, scripted):
    """Every trial ends in ContextLengthExceededError (a task failure: max_infra_failures never
    counts it), with no turn: the rollout fails naming the error, its share, its message and
    the mean turns, and keeps its shards."""
    srv = scripted(lambda body: (400, OVERFLOW))
    cfg = RolloutSettings(engine="openai", base_url=srv.base_url, model="m", health={"min_trials": 4})
    with pytest.raises(
        RunBroken,
        match=r"rollout: the run is broken: its 4 trials average 0 turns \(health.max_mean_turns: 1.5\); "
        r"ContextLengthExceededError \(task_failure\) ended 4 of 4 trials \(100%.*"
        r"e\.g\. .*maximum context length is 512 tokens",
    ):
        _rollout(cfg, _tasks(tmp_path), tmp_path / "out")
    assert (tmp_path / "out" / "shards" / "0-of-1.parquet").exists()


@needs_sandbox
def test_an_oracle_whose_tasks_all_fail_fails_the_rollout(tmp_path):
    """The tasks' solutions do nothing, so every trial scores 0: one reward value."""
    cfg = RolloutSettings(engine="oracle", health={"min_trials": 4})
    tasks = _tasks(tmp_path, solution="#!/bin/sh\ncd /app\ntrue\nls\n")
    with pytest.raises(RunBroken, match=r"all 4 verified trials got reward 0 \(health.same_reward\)") as e:
        _rollout(cfg, tasks, tmp_path / "out")
    assert "turns" not in str(e.value)  # the oracle ran its commands: several turns each


@needs_sandbox
def test_a_one_turn_run_fails_and_warns_when_asked(tmp_path, scripted):
    """Trials that end after one turn each (here a turn budget of one: a shell that exits or an
    endpoint that fails the second request end them alike). With health.on_broken: warn the
    same shards merge into the artifact, the stats say why."""
    srv = scripted(lambda body: (200, chat_answer(answer("ls\n"))))
    tasks = _tasks(tmp_path)
    cfg = RolloutSettings(engine="openai", base_url=srv.base_url, model="m", max_episodes=1, health={"min_trials": 4})
    with pytest.raises(RunBroken, match=r"its 4 trials average 1 turns \(health.max_mean_turns: 1.5\)"):
        _rollout(cfg, tasks, tmp_path / "out")
    requests = len(srv.requests)
    warn = cfg.model_copy(update={"health": cfg.health.model_copy(update={"on_broken": "warn"})})
    stats = rollout.run(warn, [tasks], tmp_path / "out")  # the shard job is done: snakemake reruns the merge
    assert len(srv.requests) == requests
    assert pq.read_metadata(tmp_path / "out" / "traces.parquet").num_rows == 4
    health = stats["health"]
    assert health["trials"] == 4 and health["mean_turns"] == 1
    assert any("average 1 turns" in w for w in health["warnings"])


@needs_sandbox
def test_a_healthy_run_passes_and_records_its_numbers(tmp_path):
    """The oracle passing every task is what it should do, not one reward value gone wrong."""
    stats = _rollout(RolloutSettings(engine="oracle", health={"min_trials": 4}), _tasks(tmp_path), tmp_path / "out")
    health = stats["health"]
    assert (
        health["warnings"] == []
        and health["reward_range"] == [1.0, 1.0]
        and health["distinct_rewards"] == 1
        and health["mean_turns"] > 2
    )
    assert health["top_error"] is None


# -- the rules, over merged traces written as the harness writes them ----------------------
def _merged(tmp_path, rows):
    write_traces(tmp_path / "shards" / "0-of-1.parquet", rows)
    return tmp_path


def test_a_run_smaller_than_min_trials_is_not_judged(tmp_path):
    out = _merged(tmp_path, [row("0", reward=0.0, n_turns=1)] * 19)
    stats = rollout.run(RolloutSettings(engine="openai", model="m", base_url="http://x/v1"), [], out)
    assert stats["health"]["warnings"] == [] and stats["health"]["mean_turns"] == 1


def test_a_model_that_passes_everything_is_suspect_an_oracle_is_not(tmp_path):
    out = _merged(tmp_path, [row("1", reward=1.0)] * 20)
    assert rollout.run(RolloutSettings(engine="oracle"), [], out)["health"]["warnings"] == []
    with pytest.raises(RunBroken, match=r"all 20 verified trials got reward 1"):
        rollout.run(RolloutSettings(engine="openai", model="m", base_url="http://x/v1"), [], out)


def test_one_error_past_its_share_fails_naming_it_and_unset_thresholds_check_nothing(tmp_path):
    meta = json.dumps({"exception_message": "litellm.InternalServerError: OpenAIException - 500"})
    rows = [row("InternalServerError", "InternalServerError", reward=None, n_turns=1, metadata=meta)] * 10
    rows += [row("1", reward=1.0, n_turns=6), row("0", reward=0.0, n_turns=6)] * 5
    out = _merged(tmp_path, rows)
    cfg = RolloutSettings(engine="openai", model="m", base_url="http://x/v1", max_infra_failures=1.0)
    with pytest.raises(
        RunBroken,
        match=r"InternalServerError \(infrastructure\) ended 10 of 20 trials \(50%, health.max_error_share: 0.5\), "
        r"e\.g\. litellm\.InternalServerError: OpenAIException - 500",
    ):
        rollout.run(cfg, [], out)
    off = cfg.model_copy(update={"health": cfg.health.model_copy(update={"max_error_share": None})})
    assert rollout.run(off, [], out)["health"]["top_error"]["share"] == 0.5


def test_an_eval_only_warns_on_its_models_turns_and_rewards_and_fails_on_the_runs_errors(tmp_path, capsys):
    """An untrained model may fail every task in one turn: a true result. An eval whose
    verifier never gave a verdict measured nothing."""
    cfg = EvalSettings(engine="oracle", model_label="base")
    stats = eval_stage.run(cfg, [], _merged(tmp_path / "a", [row("0", reward=0.0, n_turns=1)] * 20))
    assert len(stats["health"]["warnings"]) == 2 and stats["benchmarks"]["bench"]["mean"] == 0
    assert "warning: eval: all 20 verified trials got reward 0" in capsys.readouterr().err
    rows = [row("RewardFileNotFoundError", "RewardFileNotFoundError", reward=None)] * 20
    with pytest.raises(RunBroken, match=r"RewardFileNotFoundError \(verifier_error\) ended 20 of 20"):
        eval_stage.run(cfg, [], _merged(tmp_path / "b", rows))


@needs_sandbox
@pytest.mark.slow
def test_a_broken_rollout_fails_the_build_and_warn_merges_its_shards(project, scripted):
    """Through the real snakemake CLI: the merge job fails naming the numbers and leaves no
    traces; `health.on_broken: warn` (execution-only: the same id) reruns only the merge."""
    from tests.conftest import snakemake

    srv = scripted(lambda body: (400, OVERFLOW))
    recipe = f"""
sources:
  a: {{kind: synthetic, count: 4, seed: 1}}
teacher: {{engine: openai, base_url: '{srv.base_url}', model: m, shards: 2, health: {{min_trials: 4}}}}
trace_filter: {{min_turns: 0}}
"""
    (project / "recipes" / "r.yaml").write_text(recipe)
    _, log = snakemake(project, "r", check=False)
    assert "rollout: the run is broken: its 4 trials average 0 turns" in log, log[-3000:]
    assert "ContextLengthExceededError (task_failure) ended 4 of 4 trials (100%" in log
    assert not list((project / "artifacts").glob("rollout/*/traces.parquet"))
    requests = len(srv.requests)
    (project / "recipes" / "r.yaml").write_text(recipe.replace("min_trials: 4", "min_trials: 4, on_broken: warn"))
    ran, log = snakemake(project, "r")
    assert ran.get("rollout_merge") == 1 and "rollout" not in ran and len(srv.requests) == requests, log[-3000:]
    [record] = [json.loads(p.read_text()) for p in (project / "artifacts").glob("rollout/*/provenance.json")]
    assert record["stats"]["health"]["mean_turns"] == 0 and len(record["stats"]["health"]["warnings"]) == 2


def test_a_pilot_fails_on_its_runs_errors_and_only_warns_on_its_rewards(tmp_path):
    """The difficulty pilot measures its tasks (every trial failing is a verdict: impossible),
    but a verifier that gave no verdict on most trials measured nothing."""
    from otbuild.stagekit import Inputs
    from otbuild.stages import difficulty
    from otbuild.stages.difficulty import DifficultySettings

    tasks = _tasks(tmp_path, 10)
    ids = pq.read_table(tasks, columns=["task_id"]).column(0).to_pylist()
    cfg = DifficultySettings(engine="oracle")
    failed = [row("0", reward=0.0, n_turns=4, task_id=t) for t in ids for _ in range(2)]
    write_traces(tmp_path / "a" / "shards" / "0-of-1.parquet", failed)
    stats = difficulty.run(
        cfg.model_copy(update={"allow_all_impossible": True}), Inputs.of(tasks=[tasks]), tmp_path / "a"
    )
    assert stats["health"]["warnings"] == ["all 20 verified trials got reward 0 (health.same_reward)"]
    broken = [row("RewardFileNotFoundError", "RewardFileNotFoundError", reward=None, task_id=t) for t in ids]
    write_traces(tmp_path / "b" / "shards" / "0-of-1.parquet", broken + [row("1", reward=1.0, task_id=t) for t in ids])
    with pytest.raises(RunBroken, match=r"difficulty: .*RewardFileNotFoundError \(verifier_error\) ended 10 of 20"):
        difficulty.run(cfg, Inputs.of(tasks=[tasks]), tmp_path / "b")
