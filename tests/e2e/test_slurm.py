"""`snakemake --profile slurm` for real, on the single-host Slurm cluster of
scripts/slurm-cluster.sh (4 fake nodes with 8 "h100" GPUs each; `make setup` installs and
starts it, this test starts it when it is down). The profile is profiles/slurm with its
placeholders filled in and smaller numbers; the jobs really run here, on the CPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, snakemake

CLUSTER = REPO / "scripts" / "slurm-cluster.sh"

RECIPE = """
sources:
  synth: {kind: synthetic, rank: 1, count: 4, seed: 1, families: [files]}
mix: {n: 1, total: 4}
teacher: {engine: oracle, shards: 1, concurrency: 2}
trace_filter: {min_turns: 1}
sft:
  model: {kind: tiny, vocab_size: 400, hidden_size: 32, intermediate_size: 64}
  epochs: 1
  global_batch_size: 4
  cutoff_len: 4096
  zero_stage: 2
  gradient_checkpointing: false
rl: {steps: 1, batch_size: 2, samples_per_task: 2, max_tokens: 16, max_context: 2048, sandbox: {max_episodes: 1}}
"""


@pytest.fixture(scope="module")
def cluster():
    if not shutil.which("slurmctld"):
        pytest.skip("Slurm is not installed (make setup: scripts/slurm-cluster.sh install)")
    if os.geteuid() != 0:
        pytest.skip("the local Slurm cluster's daemons run as root")
    if subprocess.run([CLUSTER, "status"], check=False).returncode:
        subprocess.run([CLUSTER, "start"], check=True, timeout=120)


def test_the_local_profile_fills_in_every_placeholder(tmp_path):
    conf = local_profile(tmp_path)
    assert conf["set-resources"]["sft"]["gres"] == "gpu:h100:2" and "<" not in json.dumps(conf)


@pytest.mark.slow
def test_slurm_profile_runs_the_dag_on_a_real_cluster(project, cluster):
    """The tasks and traces are built here (the quick part), the rest through sbatch: the trace
    filter on the cpu partition, SFT on 2 nodes with 2 GPUs on each (4 ranks), RL on 1 node
    with 2 (2 ranks). What Slurm granted, per node, is what the profile asked for, and every
    rank ran where Slurm put it. (Each Slurm job costs ~15 s of wrapper and polling here.)"""
    (project / "recipes" / "tiny.yaml").write_text(RECIPE)
    local_profile(project / "slurm-test")
    snakemake(project, "--until", "rollout_merge", "tiny")
    t0 = time.monotonic()
    snakemake(project, "--profile", "slurm-test", "--retries", "0", "tiny")
    print(f"slurm part of the DAG: {time.monotonic() - t0:.0f} s")

    jobs = {}  # rule -> what Slurm's accounting says about its job(s), for this project only
    out = subprocess.run(
        [
            "sacct",
            "-X",
            "-n",
            "-P",
            "-S",
            "now-2hours",
            "-o",
            "Comment%200,Partition,NNodes,AllocTRES%200,State,WorkDir%500",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for line in out.splitlines():
        comment, partition, nnodes, tres, state, workdir = line.split("|")
        if workdir == str(project):
            rule = comment.removeprefix("rule_").split("_wildcards")[0]
            gpus = dict(kv.split("=") for kv in tres.split(",")).get("gres/gpu", "0")
            jobs.setdefault(rule, []).append((partition, int(nnodes), int(gpus), state))
    assert jobs == {
        "trace_filter": [("cpu", 1, 0, "COMPLETED")],
        "sft": [("gpu", 2, 4, "COMPLETED")],
        "rl": [("gpu", 1, 2, "COMPLETED")],
    }, jobs

    for stage, world, nodes in (("sft", 4, 2), ("rl", 2, 1)):
        manifest = json.loads((project / "results" / "tiny" / stage / "checkpoint.json").read_text())
        ranks = manifest["placement"]
        assert manifest["world_size"] == world and sorted(r["rank"] for r in ranks) == list(range(world))
        assert len({r["node"] for r in ranks}) == nodes and all(r["node"].startswith("node") for r in ranks)
        # each node saw its 2 GPUs (character devices standing in), one rank per GPU; no CUDA here
        assert all((r["gpus_on_node"], r["cuda_visible_devices"], r["device"]) == (2, "0,1", "cpu") for r in ranks), (
            ranks
        )
        assert sorted(r["local_rank"] for r in ranks) == sorted([0, 1] * nodes)
    rl_log = (project / "results" / "tiny" / "rl" / "train_log.jsonl").read_text().splitlines()
    assert [json.loads(x)["trajectories"] for x in rl_log] == [4]  # 2 tasks x 2 samples, over 2 ranks

    # each job's benchmark counts the GPUs Slurm granted it (gres per node x nodes): the report's GPU-hours
    from otbuild.report.costs import benchmark_files, read_benchmark

    for rule in jobs:
        (files,) = [benchmark_files(rule, (project / "results" / "tiny" / rule).resolve().name, project)]
        runs = [r for f in files for r in read_benchmark(f)]
        assert [r["gpus"] for r in runs] == [jobs[rule][0][2]] and runs[0]["s"] > 0, (rule, runs)


def local_profile(dest, source=REPO / "profiles" / "slurm" / "config.yaml"):
    """profiles/slurm (or `source`) with the local cluster's account, partitions and GPU model
    filled in, jobs sized for a 2-core machine, and status checks from the first second."""
    text = Path(source).read_text()
    for placeholder, value in {
        "<account>": "otbuild",
        "<cpu-partition>": "cpu",
        "<gpu-partition>": "gpu",
        "<gpu-model>": "h100",
    }.items():
        text = text.replace(placeholder, value)
    conf = yaml.safe_load(text)
    conf["slurm-init-seconds-before-status-checks"] = 1
    small = {"runtime": 15, "mem_mb": 2000, "cpus_per_task": 1}
    conf["default-resources"].update(small)
    for resources in conf["set-resources"].values():
        resources.update(small)
    conf["set-resources"]["sft"].update(nodes=2, gres="gpu:h100:2", tasks_per_node=2)
    conf["set-resources"]["rl"].update(nodes=1, gres="gpu:h100:2", tasks_per_node=2)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.yaml").write_text(yaml.safe_dump(conf))
    return conf
