"""OT-Agent-format tasks (a Dockerfile that installs packages with RUN) through `sandbox: auto`:
podman builds and runs their images, bwrap the tasks that need no image; a real snakemake run
of the paper's recipe shape with the oracle teacher yields traces."""

from __future__ import annotations

import fnmatch
import os
import secrets
import signal
import socket
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from otbuild.sandbox import (
    Limits,
    TaskNotRunnableLocally,
    backend_for,
    backend_problem,
    needs_image,
    open_sandbox,
)
from otbuild.sandbox.podman import cli as podman_cli
from otbuild.sandbox.podman import container, images
from otbuild.sandbox.podman.container import OWNER_LABEL
from otbuild.sandbox.podman.images import (
    IMAGE_REPO,
    ImageBuildError,
    ensure_image,
    environment_hash,
    image_exists,
)
from otbuild.sandbox.podman.network import NetworkPolicyError
from otbuild.sandbox.procs import owner, owner_is_gone
from otbuild.sandbox.reward import read_reward
from otbuild.sources.synthetic import generate
from otbuild.stagekit.trials import check_podman
from otbuild.tasks.base_image import base_images, host_images
from otbuild.tasks.table import TaskRecord, write_tasks
from otbuild.tasks.taskdir import TaskDir
from tests.conftest import OT_AGENT_DOCKERFILE, otbuild, snakemake

# OT-Agent's Dockerfiles `apt-get install`: their builds may fetch only where a recipe says so
FETCHING = Limits(build_network="public")
needs_podman = pytest.mark.skipif(
    backend_problem("podman") is not None, reason=f"podman unusable here: {backend_problem('podman')}"
)

SOLVE = """\
#!/bin/bash
cd /app
ls -la
grep -n port config.ini
sed -i 's/^port = .*/port = {port}/' config.ini
python3 -c "import configparser; c = configparser.ConfigParser(); c.read('config.ini'); print(c['server']['port'])"
tmux -V
echo done > /app/status.txt
"""
TEST = """\
#!/bin/bash
ok=1
grep -qx 'port = {port}' /app/config.ini || ok=0
command -v tmux >/dev/null && python3 -c pass || ok=0
echo $ok > /logs/verifier/reward.txt
"""


def ot_agent_task(name: str, port: int, dockerfile: str = OT_AGENT_DOCKERFILE) -> TaskDir:
    """An OT-Agent-style Harbor task: fix a port in a config file (the verifier also needs
    the packages the Dockerfile installs)."""
    t = TaskDir(name)
    t.add("instruction.md", f"The server in /app/config.ini must listen on port {port}. Fix the config.")
    t.add(
        "task.toml",
        'version = "1.0"\n\n[agent]\ntimeout_sec = 120.0\n\n[verifier]\ntimeout_sec = 60.0\n\n'
        "[environment]\ncpus = 1\nmemory_mb = 1024\nallow_internet = false\n",
    )
    t.add("environment/Dockerfile", dockerfile)
    t.add("environment/app/config.ini", "[server]\nhost = 0.0.0.0\nport = 80\n")
    t.add("solution/solve.sh", SOLVE.format(port=port), executable=True)
    t.add("tests/test.sh", TEST.format(port=port), executable=True)
    return t


# no RUN lines and FROM the host's own release: a local sandbox lays it out on the host's /usr
NO_RUN = f"FROM {host_images()[0]}\nWORKDIR /app\nCOPY app/ /app/\n"


def test_auto_sends_a_task_whose_base_image_the_host_is_not_to_podman(monkeypatch):
    monkeypatch.setattr(podman_cli, "available", lambda: None)
    monkeypatch.delenv("OTBUILD_HOST_IMAGES", raising=False)
    backend_problem.cache_clear()
    host_images.cache_clear()
    try:
        other_python = ot_agent_task("py313", 1, "FROM python:3.13\nWORKDIR /app\nCOPY app/ /app/\n")
        if any(fnmatch.fnmatchcase("python:3.13", p) for p in host_images()):
            pytest.skip("the host is a python:3.13 image")
        assert needs_image(other_python) and backend_for(other_python, "auto") == "podman"
        assert backend_for(ot_agent_task("same-release", 1, NO_RUN), "auto") == "bwrap"
        says_so = ot_agent_task("says-so", 1, "FROM python:3.13\nWORKDIR /app\n")
        says_so.add("task.toml", "[metadata]\nhost_compatible = true\n")
        assert backend_for(says_so, "auto") == "bwrap"
        synthetic = next(generate(1, 0)).task  # otbuild's own tasks: FROM python:3.12-slim, stdlib only
        assert "python:3.12-slim" in synthetic.text("environment/Dockerfile")
        assert backend_for(synthetic, "auto") == "bwrap"
        monkeypatch.setenv("OTBUILD_HOST_IMAGES", "python:3.13*")  # the declared list, extended
        host_images.cache_clear()
        assert backend_for(other_python, "auto") == "bwrap"
    finally:
        backend_problem.cache_clear()
        host_images.cache_clear()


def test_base_images_are_the_dockerfiles_external_froms():
    assert base_images(
        "ARG V=3.13\nFROM --platform=linux/amd64 python:${V} AS build\nRUN x\n"
        "FROM build\nFROM docker.io/library/ubuntu\nFROM ghcr.io/o/r:1 AS b\n"
    ) == ["python:3.13", "ubuntu:latest", "ghcr.io/o/r:1"]


def test_auto_picks_the_backend_per_task_and_names_a_task_it_cannot_run(monkeypatch):
    assert backend_for(ot_agent_task("local", 1, NO_RUN), "auto") == "bwrap"
    assert backend_for(ot_agent_task("img", 1), "bwrap") == "bwrap"  # other backends as asked
    monkeypatch.setattr(podman_cli, "available", lambda: "podman is not installed")
    backend_problem.cache_clear()
    try:
        with pytest.raises(TaskNotRunnableLocally, match="task 'needs-image'.*podman is not installed"):
            open_sandbox(ot_agent_task("needs-image", 1), "/nonexistent", backend="auto")
        with pytest.raises(RuntimeError, match="tasks a, b need their container image.*not installed"):
            check_podman("auto", [{"path": "b"}, {"path": "a"}])
        check_podman("auto", [])  # nothing needs podman: fine without it
        with pytest.raises(RuntimeError, match="sandbox podman: the recipe asks for it"):
            check_podman("podman", [])
    finally:
        backend_problem.cache_clear()


@needs_podman
def test_image_is_cached_by_environment_content(tmp_path):
    a, b = ot_agent_task("a", 8080), ot_agent_task("b", 9090)
    assert environment_hash(a) == environment_hash(b)  # same environment/: one image
    a.add("environment/app/extra.txt", "x")
    assert environment_hash(a) != environment_hash(b)
    with open_sandbox(a, tmp_path, backend="podman", limits=FETCHING) as box:
        assert image_exists(f"{IMAGE_REPO}:{environment_hash(a)[:24]}")
        assert box.workdir == "/app" and box.run("cat extra.txt", timeout=10).output == "x"


@needs_podman
def test_a_failed_build_names_the_task_and_leaves_nothing(tmp_path):
    broken = ot_agent_task("broken", 1, "FROM no-such-base:1\nWORKDIR /app\n")
    with pytest.raises(ImageBuildError, match=r"task 'broken': podman build failed .*base image is missing"):
        open_sandbox(broken, tmp_path, backend="podman", limits=FETCHING)
    assert not any(tmp_path.iterdir())  # no trial root left behind


RECIPE = """
description: the shape of otagent_v2_100k over OT-Agent-format tasks, with the oracle teacher
sources:
  swesmith: {kind: harbor-parquet, rank: 1, path: data/swesmith.parquet}
  stackexchange_superuser: {kind: harbor-parquet, rank: 2, path: data/superuser.parquet}
  stackexchange_tezos: {kind: harbor-parquet, rank: 3, path: data/tezos.parquet}
mix: {n: 3, total: 4, order: shuffle, seed: 0}
task_filter: {dedup: true}
teacher:
  engine: oracle
  sandbox: auto
  build_network: public  # OT-Agent's Dockerfiles apt-get install
  shards: 2
  concurrency: 2
  max_episodes: 20
trace_filter: {min_turns: 5, drop_timed_out: true, drop_subagent: true, drop_exceptions: true}
"""


@pytest.mark.slow
@needs_podman
def test_ot_agent_tasks_yield_traces_end_to_end(project):
    (project / "data").mkdir()
    tasks = {
        "swesmith": [ot_agent_task("swe-1", 8081), ot_agent_task("swe-2", 8082)],
        "superuser": [ot_agent_task("su-1", 8083)],
        "tezos": [ot_agent_task("tezos-local", 8084, NO_RUN)],
    }
    for source, ts in tasks.items():
        write_tasks(project / "data" / f"{source}.parquet", [TaskRecord(t, True) for t in ts], source=source)
    (project / "recipes" / "ot.yaml").write_text(RECIPE)

    snakemake(project, "ot", "--cores", "2")

    results = project / "results" / "ot"
    table = pq.read_table(results / "task_filter" / "kept.parquet").to_pylist()
    assert {r["path"]: r["runnable_locally"] for r in table} == {
        "swe-1": False,
        "swe-2": False,
        "su-1": False,
        "tezos-local": True,
    }  # the source decides
    traces = pq.read_table(results / "teacher" / "traces.parquet").to_pylist()
    assert sorted(t["task"] for t in traces) == ["su-1", "swe-1", "swe-2", "tezos-local"]
    for t in traces:
        assert t["exception"] is None and t["reward"] == 1.0, (t["task"], t["metadata"])
        assert t["n_turns"] >= 5 and t["conversations"][0]["role"] == "user"
    kept = pq.read_table(results / "trace_filter" / "kept.parquet").to_pylist()
    assert len(kept) == 4
    # the RUN tasks ran in their own images (built by podman); the other one in bwrap
    by_name = {t.name: t for ts in tasks.values() for t in ts}
    assert image_exists(f"{IMAGE_REPO}:{environment_hash(by_name['swe-1'])[:24]}")
    assert not image_exists(f"{IMAGE_REPO}:{environment_hash(by_name['tezos-local'])[:24]}")
    assert "traces <b>4</b>" in (results / "report" / "report.html").read_text()


def _with_environment(task: TaskDir, environment: str) -> TaskDir:
    task.add("task.toml", f"[agent]\ntimeout_sec = 120.0\n\n[environment]\n{environment}")
    return task


@pytest.fixture
def own_network(monkeypatch):
    """A podman network of the test's own with an HTTP server in it (never an outside
    address); trials that may use the network join it. Yields the server's URL."""
    net, server = f"otbuild-test-{secrets.token_hex(4)}", f"otbuild-test-srv-{secrets.token_hex(4)}"
    image = ensure_image(ot_agent_task("server", 1), network="public")
    subprocess.run(["podman", "network", "create", net], check=True, capture_output=True)
    try:
        subprocess.run(
            [
                "podman",
                "run",
                "-d",
                "--name",
                server,
                "--network",
                net,
                "--entrypoint",
                "python3",
                image,
                "-m",
                "http.server",
                "8000",
            ],
            check=True,
            capture_output=True,
        )
        address = f'{{{{(index .NetworkSettings.Networks "{net}").IPAddress}}}}'
        ip = subprocess.run(
            ["podman", "inspect", "-f", address, server], check=True, capture_output=True, text=True
        ).stdout.strip()
        monkeypatch.setenv("OTBUILD_PODMAN_NETWORK", net)
        yield f"http://{ip}:8000/"
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", server], capture_output=True)
        subprocess.run(["podman", "network", "rm", "-f", net], capture_output=True)


@needs_podman
def test_a_podman_trial_gets_the_network_its_task_allows(tmp_path, own_network):
    probe = (
        'python3 -c "import time, urllib.request\nfor _ in range(20):\n    try:\n        print(urllib.request'
        f".urlopen('{own_network}', timeout=2).status); break\n    except OSError as e:\n        err = e; "
        'time.sleep(0.25)\nelse:\n    raise SystemExit(str(err))"'
    )

    def reaches(task, limits=FETCHING):
        with open_sandbox(task, tmp_path, backend="podman", limits=limits, cleanup=True) as box:
            r = box.run(probe, timeout=30)
            return r.exit_code == 0 and r.output.strip() == "200"

    harbor_default = ot_agent_task("net-default", 1)
    harbor_default.files.pop("task.toml")
    assert reaches(harbor_default)  # as Harbor: the network unless the task says otherwise
    assert reaches(_with_environment(ot_agent_task("net-on", 1), "allow_internet = true\n"))
    assert not reaches(_with_environment(ot_agent_task("net-off", 1), "allow_internet = false\n"))
    assert not reaches(_with_environment(ot_agent_task("net-mode", 1), 'network_mode = "no-network"\n'))
    assert not reaches(harbor_default, Limits(network="none", build_network="public"))  # the recipe forces it off


@needs_podman
def test_a_podman_trial_honours_each_phases_network_and_refuses_an_allowlist(tmp_path, own_network):
    """An offline agent and a verifier that needs the network (to install its tools) share one
    container, taken off the network for the agent; an allowlist is refused, never widened."""
    probe = (
        'python3 -c "import urllib.request\ntry:\n    print(urllib.request.urlopen('
        f"'{own_network}', timeout=3).status)\nexcept OSError as e:\n    print('offline', e)\""
    )

    def phases(task):
        with open_sandbox(task, tmp_path, backend="podman", limits=FETCHING, cleanup=True) as box:
            agent = box.run(probe, timeout=30).output.strip()
            box.kill_all()
            return agent, box.run(probe, timeout=30, with_tests=True).output.strip()

    split = 'network_mode = "no-network"\n[verifier]\nnetwork_mode = "public"\n'
    agent, verifier = phases(_with_environment(ot_agent_task("net-split", 1), split))
    assert agent.startswith("offline") and verifier == "200", (agent, verifier)
    agent, verifier = phases(
        _with_environment(ot_agent_task("net-agent-only", 1), '[verifier]\nnetwork_mode = "no-network"\n')
    )
    assert agent == "200" and verifier.startswith("offline"), (agent, verifier)

    allow = _with_environment(
        ot_agent_task("net-allowlist", 1), 'network_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n'
    )
    before = _trial_containers()
    with pytest.raises(NetworkPolicyError, match=r"task 'net-allowlist': its agent may reach only pypi.org"):
        open_sandbox(allow, tmp_path, backend="podman", limits=FETCHING, cleanup=True)
    assert _trial_containers() == before  # nothing was started


def _trial_containers() -> set[str]:
    r = subprocess.run(
        ["podman", "ps", "-a", "-q", "--no-trunc", "--filter", f"label={OWNER_LABEL}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(r.stdout.split())


SLOW_RECIPE = """
sources:
  swesmith: {kind: harbor-parquet, rank: 1, path: data/swesmith.parquet}
teacher: {engine: oracle, sandbox: podman, build_network: public, concurrency: 2, max_episodes: 20}
trace_filter: {min_turns: 1}
"""


@pytest.mark.slow
@needs_podman
def test_kill_9_mid_rollout_leaves_no_trial_container_after_the_rebuild(project):
    (project / "data").mkdir()
    tasks = [ot_agent_task(f"slow-{i}", 8090 + i) for i in range(2)]
    for t in tasks:  # a long step, so the kill finds the trials running
        t.add(
            "solution/solve.sh", "#!/bin/bash\nsleep 6\n" + SOLVE.format(port=8090 + int(t.name[-1])), executable=True
        )
    write_tasks(project / "data" / "swesmith.parquet", [TaskRecord(t, False) for t in tasks], source="swesmith")
    (project / "recipes" / "slow.yaml").write_text(SLOW_RECIPE)
    before = _trial_containers()
    proc = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "slow", "--cores", "2"],
        cwd=project,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 240
        while len(_trial_containers() - before) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # snakemake and its jobs: a lost node
        proc.wait()
    left = _trial_containers() - before
    assert len(left) == 2  # what kill -9 leaves: containers nothing will close
    owners = subprocess.run(
        ["podman", "inspect", "--format", f'{{{{index .Config.Labels "{OWNER_LABEL}"}}}}', *left],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    deadline = time.monotonic() + 60  # a SIGKILLed job takes a moment to be gone (as a lost node is)
    while not all(map(owner_is_gone, owners)) and time.monotonic() < deadline:
        time.sleep(0.2)

    _, log = snakemake(project, "slow", "--cores", "2")  # the restart cleans up and rebuilds
    # the restart removes them, unless another build on this host (a test beside this one) did first
    assert "removed 2 trial container(s) of builds that are no longer running" in log or not left & _trial_containers()
    assert not left & _trial_containers()
    assert not _trial_containers() - before  # and the rebuild's own trials were closed
    traces = pq.read_table(project / "results" / "slow" / "teacher" / "traces.parquet").to_pylist()
    assert [t["reward"] for t in traces] == [1.0, 1.0]


def test_clean_containers_removes_only_those_of_dead_builds(monkeypatch):
    removed = []
    monkeypatch.setattr(
        container,
        "_podman",
        lambda *a, **k: (
            removed.append(a)
            or subprocess.CompletedProcess(
                a, 0, stdout=f"aaa {owner()}\nbbb {socket.gethostname()}:999999999:1\nccc other-host:1:1\n"
            )
        ),
    )
    monkeypatch.setattr(container.shutil, "which", lambda _: "/usr/bin/podman")
    assert container.leaked_containers() == ["bbb"]  # a live owner's and another host's stay


@needs_podman
def test_images_load_imports_saved_tarballs_for_offline_clusters(tmp_path, project):
    ref = f"localhost/otbuild-test-load:{secrets.token_hex(4)}"
    subprocess.run(["podman", "tag", "docker.io/library/debian:bookworm", ref], check=True)
    archives = tmp_path / "images"
    archives.mkdir()
    subprocess.run(["podman", "save", "-q", "-o", str(archives / "base.tar"), ref], check=True)
    subprocess.run(["podman", "rmi", ref], check=True, capture_output=True)
    task = ot_agent_task("from-registry", 1, f"FROM {ref}\nWORKDIR /app\nCOPY app/ /app/\n")
    try:
        assert not image_exists(ref)
        with pytest.raises(ImageBuildError, match="base image is missing.*otbuild images load DIR"):
            open_sandbox(task, tmp_path / "w", backend="podman", limits=Limits(pull="never", build_network="public"))
        r = otbuild(project, "images", "load", str(archives))
        assert r.returncode == 0 and ref in r.stdout and image_exists(ref)
        with open_sandbox(
            task, tmp_path / "w", backend="podman", limits=Limits(pull="never", build_network="public")
        ) as box:
            assert box.run("cat /etc/debian_version", timeout=30).output.startswith("12")
        (archives / "junk.tar").write_text("not an image")
        r = otbuild(project, "images", "load", str(archives))
        assert r.returncode == 2 and "junk.tar: not a docker-archive or OCI image tarball" in r.stderr
    finally:
        subprocess.run(["podman", "rmi", "-f", ref], capture_output=True)
        subprocess.run(["podman", "rmi", "-f", f"{IMAGE_REPO}:{environment_hash(task)[:24]}"], capture_output=True)


@needs_podman
def test_validate_images_lists_each_base_image_and_whether_it_is_here(project):
    (project / "data").mkdir()
    tasks = [
        ot_agent_task("a", 1),
        ot_agent_task("b", 2),
        ot_agent_task("c", 3, "FROM localhost/swesmith.x86_64.repo_1234:latest\nRUN true\n"),
    ]
    write_tasks(project / "data" / "t.parquet", [TaskRecord(t, False) for t in tasks], source="t")
    (project / "recipes" / "imgs.yaml").write_text(
        "sources:\n  t: {kind: harbor-parquet, rank: 1, path: data/t.parquet}\n"
        "teacher: {engine: oracle, sandbox: podman}\n"
    )
    r = otbuild(project, "validate", "--images", "imgs")
    lines = [line for line in r.stdout.splitlines() if line.startswith("│ ")]
    cells = [[c.strip() for c in line.strip("│ ").split("│")] for line in lines]
    rows = {c[0]: c[1:] for c in cells}
    assert rows["ubuntu:24.04"] == ["2", "present"]
    assert rows["localhost/swesmith.x86_64.repo_1234:latest"] == ["1", "missing"]
    assert r.returncode == 1


@needs_podman
def test_a_podman_trial_is_stopped_at_its_disk_cap_wherever_it_writes(tmp_path):
    task = ot_agent_task("disk-hog", 1)
    with open_sandbox(
        task, tmp_path, backend="podman", limits=Limits(storage_mb=32, build_network="public"), cleanup=True
    ) as box:
        assert box.run("head -c 4000000 /dev/zero > /usr/local/small", timeout=30).exit_code == 0
        assert not box.disk_exceeded
        r = box.run(
            "for i in $(seq 1 200); do head -c 1048576 /dev/zero > /usr/local/f$i; sleep 0.02; done", timeout=60
        )  # the image's own filesystem, not a mounted dir
        assert box.disk_exceeded and r.exit_code != 0 and r.duration_s < 30


@needs_podman
def test_otbuild_s_own_tasks_run_in_the_python_image_set_up_provides(tmp_path):
    """Issue 39.4: otbuild's own tasks start FROM python:3.12-slim, which scripts/podman-setup.sh
    bootstraps offline: a synthetic task builds and its oracle passes under podman (no registry)."""
    task = next(generate(1, 0)).task
    assert task.text("environment/Dockerfile").startswith("FROM python:3.12-slim\n")
    with open_sandbox(
        task,
        tmp_path,
        backend="podman",
        limits=Limits(pull="never", build_network="public"),
        with_solution=True,
        cleanup=True,
    ) as box:
        assert box.run("python --version && python3 -c 'import json, sqlite3'", timeout=30).output.startswith(
            "Python 3."
        )
        assert box.run("bash /solution/solve.sh", timeout=60).exit_code == 0
        r = box.run("bash /tests/test.sh", timeout=60, with_tests=True)
        assert r.exit_code == 0, r.output
        reward = read_reward(box.root)
        assert (reward if isinstance(reward, float) else reward["reward"]) == 1.0


def _storage_containers() -> dict[str, str]:
    """Containers only `podman ps --external` shows (buildah's working containers): id -> name."""
    r = subprocess.run(
        ["podman", "ps", "-a", "--external", "--no-trunc", "--format", "{{.ID}} {{.State}} {{.Names}}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return {
        cid: name
        for cid, state, name in (ln.split(" ", 2) for ln in r.stdout.splitlines())
        if state.lower() == "storage"
    }


def _dangling_images() -> set[str]:
    r = subprocess.run(
        ["podman", "images", "-a", "-q", "--no-trunc", "--filter", "dangling=true"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(r.stdout.split())


def _kill_mid_image_build(project) -> dict[str, str]:
    """Start `snakemake slow`, kill its process group once its image build runs its second RUN
    (a working container made from the first RUN's intermediate image); what the kill left."""
    before = _storage_containers()
    proc = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "slow", "--cores", "1"],
        cwd=project,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and all(
            name.startswith("debian-") for cid, name in _storage_containers().items() if cid not in before
        ):
            assert proc.poll() is None, "the build ended before its image build was caught"
            time.sleep(0.3)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # snakemake, its job and the job's `podman build`
        proc.wait()
    left = dict(_storage_containers().items() - before.items())
    assert left, "no working container was left"
    deadline = time.monotonic() + 60  # a SIGKILLed job takes a moment to be gone
    while set(images.leaked_build_containers()) < set(left) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.mark.slow
@needs_podman
def test_a_killed_image_build_leaves_no_working_container_or_intermediate_image(project):
    """Issue 39.5: kill -9 of a build while `podman build` runs leaves buildah working containers
    (seen by `podman ps -a --external`) and intermediate images; the restart's recovery and
    `otbuild clean --containers` remove them, and nothing of a live or another tool's build."""
    (project / "data").mkdir()
    slow = f"FROM debian:bookworm\nRUN echo {secrets.token_hex(8)} > /layer\nRUN sleep 300\nWORKDIR /app\n"
    task = ot_agent_task("slow-build", 8099, slow)
    write_tasks(project / "data" / "swesmith.parquet", [TaskRecord(task, False)], source="swesmith")
    (project / "recipes" / "slow.yaml").write_text(SLOW_RECIPE)
    dangling = _dangling_images()

    left = _kill_mid_image_build(project)
    made = _dangling_images() - dangling
    assert made  # the first RUN's intermediate image
    _, log = snakemake(project, "slow", "-n")  # the restart: recovery runs before the DAG
    # the restart removes them, unless another build on this host (a test beside this one) did first
    removed = f"removed {len(left)} image-build working container(s) of builds that are no longer running"
    assert removed in log or not left.keys() & _storage_containers().keys(), log
    assert not left.keys() & _storage_containers().keys()
    assert not made & _dangling_images()

    left = _kill_mid_image_build(project)
    res = otbuild(project, "clean", "--containers")
    assert res.returncode == 0, res.stdout
    gone = not left.keys() & _storage_containers().keys()  # by this clean, or by another build's clean-up first
    assert f"removed {len(left)} image-build working container(s)" in res.stdout or gone, res.stdout
    assert gone
    assert images.leaked_build_containers() == {}


@pytest.mark.slow
@needs_podman
def test_the_smoke_recipe_builds_with_its_teacher_in_podman(project):
    """Issue 39's done: the smoke recipe with `teacher.sandbox: podman` builds on the project's
    own set-up (no registry: its tasks' python:3.12-slim is bootstrapped by make setup), each
    teacher trial in its task's own image; SFT trains on those traces (24 of the smoke's tasks,
    100 steps; RL and eval, which run in bwrap as before, are left out to keep the check short)."""
    import shutil

    from tests.conftest import REPO

    shutil.copy(REPO / "recipes" / "smoke.yaml", project / "recipes")
    (project / "recipes" / "smoke_podman.yaml").write_text(
        "extends: smoke\nteacher: {sandbox: podman, limits: {pull: never}}\ntask_filter: {sample: {n: 24, seed: 0}}\n"
        "sft: {max_steps: 100}\nrl: null\neval: null\nharness: {constrained_decoding: false}\n"
    )
    snakemake(project, "smoke_podman", "--cores", "2")
    results = project / "results" / "smoke_podman"
    traces = pq.read_table(results / "teacher" / "traces.parquet").to_pylist()
    assert len(traces) == 24 and all(t["exception"] is None and t["reward"] == 1.0 for t in traces)
    tasks = {
        r["path"]: TaskDir.unpack(r["path"], r["task_binary"])
        for r in pq.read_table(results / "task_filter" / "kept.parquet").to_pylist()
    }
    assert all(image_exists(f"{IMAGE_REPO}:{environment_hash(t)[:24]}") for t in tasks.values())
    assert (results / "sft" / "checkpoint.json").is_file()
