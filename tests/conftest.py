"""Shared test helpers: small task parquets, a throwaway project, real snakemake runs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

from otbuild.tasks.table import TaskRecord, write_tasks
from otbuild.tasks.taskdir import TaskDir
from tests.support.standin import Scripted, chat_answer, invalid_api_key  # noqa: F401 (the tests import them from here)

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the tests never reach the Hugging Face Hub
DATA = REPO.parent / "shared" / "data" / "dev"


def source(kind: str, path, **settings):
    """A source's settings as its adapter gets them (otbuild/settings/stages.py), from its recipe keys."""
    return _settings("source", kind, path, settings)


def trace_import(kind: str, path=None, **settings):
    """A trace import's settings as its importer gets them, from its recipe keys (an
    hf-dataset import has no path)."""
    return _settings("trace_import", kind, path, settings)


def _settings(stage: str, kind: str, path, settings: dict):
    from otbuild.stages import STAGES

    plain = {k: str(v) if isinstance(v, Path) else v for k, v in settings.items()}
    located = {} if path is None else {"path": str(path)}
    return STAGES[stage].config({"name": "test", "kind": kind, **located, **plain})


def make_task(name: str, instruction: str, **metadata) -> TaskRecord:
    t = TaskDir(name)
    t.add("instruction.md", instruction)
    t.add("task.toml", 'version = "1.0"\n')
    t.add("tests/test.sh", "#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n", executable=True)
    return TaskRecord(t, runnable_locally=True, metadata=metadata)


# What OT-Agent tasks' environments look like: a distribution image, packages installed by RUN,
# the task's files copied in. The RUN layer comes first, so podman builds it once for all tasks.
OT_AGENT_DOCKERFILE = """\
FROM ubuntu:24.04
RUN apt-get update && apt-get install -y --no-install-recommends tmux python3 procps
WORKDIR /app
COPY app/ /app/
"""


def in_ot_agent_image(task: TaskDir) -> TaskDir:
    """A copy of `task` whose environment is built from OT_AGENT_DOCKERFILE (files under
    environment/app/ are what it copies)."""
    out = TaskDir(task.name)
    for rel, f in task.files.items():
        out.add(rel, f.data, f.executable)
    out.add("environment/Dockerfile", OT_AGENT_DOCKERFILE)
    return out


def write_source(path: Path, source: str, instructions: list[str], **metadata_lists) -> Path:
    records = [
        make_task(f"{source}-{i}", text, **{k: v[i] for k, v in metadata_lists.items()})
        for i, text in enumerate(instructions)
    ]
    write_tasks(path, records, source=source)
    return path


def make_project(path: Path) -> Path:
    """An empty otbuild project at `path`: the repo's Snakefile (the packaged workflow) and
    profiles, own recipes/."""
    for name in ("Snakefile", "profiles"):
        (path / name).symlink_to(REPO / name)
    (path / "recipes").mkdir()
    return path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path)


@pytest.fixture(scope="session")
def smoke_build(tmp_path_factory) -> tuple[Path, Counter]:
    """The smoke recipe built once per test session by the real snakemake CLI, in its own
    project: (the project, the jobs that build ran per rule). Tests read it, never change it."""
    project = make_project(tmp_path_factory.mktemp("smoke"))
    shutil.copy(REPO / "recipes" / "smoke.yaml", project / "recipes")
    ran, log = snakemake(project, "smoke", env={"OTBUILD_PROGRESS_SECONDS": "0.5"})  # progress twice a second
    (project / SMOKE_LOG).write_text(log)
    return project, ran


SMOKE_LOG = "smoke-build.log"  # what `snakemake smoke` printed, in smoke_build's project


def snakemake(project: Path, *args: str, check: bool = True, env: dict | None = None) -> tuple[Counter, str]:
    """Run the real snakemake CLI in `project`; return the jobs it ran per rule, and its log."""
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", *args],
        cwd=project,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    log = proc.stdout + proc.stderr
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed ({proc.returncode}):\n{log[-6000:]}")
    return job_counts(log), log


def job_counts(log: str) -> Counter:
    counts: Counter = Counter()
    if "Job stats:" in log:
        table = log.split("Job stats:", 1)[1]
        for line in table.splitlines()[3:]:
            m = re.match(r"^(\S+)\s+(\d+)$", line.strip())
            if not m or m.group(1) == "total":
                break
            counts[m.group(1)] = int(m.group(2))
    return counts


def otbuild(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "otbuild", *args],
        cwd=project,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )


# --- a scripted OpenAI-like server --------------------------------------------------------


@pytest.fixture
def scripted():
    servers = []

    def start(script, delay=0.0, api_key=None):
        srv = Scripted(script, delay, api_key)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


# --- the tiny chat model, served -----------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A tiny random chat model built here (no download), with a 1600-token context: room for
    the terminus2 first prompt and an answer or two, not for a whole trial."""
    pytest.importorskip("transformers")
    from otbuild.engines.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-model", max_position_embeddings=1600)


@pytest.fixture(scope="session")
def local_server(tiny_model):
    """`otbuild serve` on the tiny model, shared by the session: its /v1 base URL."""
    from otbuild.engines.local import start_local_server

    base_url, stop = start_local_server(tiny_model, device="cpu")
    yield base_url
    stop()


FAKE_VLLM = """\
#!{python}
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_VLLM_LOG"], "a") as f:
    f.write(json.dumps(args) + "\\n")
if os.environ.get("FAKE_VLLM_FAIL"):
    print("RuntimeError: CUDA out of memory", flush=True)
    sys.exit(1)
def opt(name):
    return args[args.index(name) + 1]
if "--uds" in args:  # vLLM on a unix socket: otbuild serve's handler there
    import socketserver
    from otbuild.serve import ChatModel, Handler
    class UnixHandler(Handler):
        def address_string(self):
            return "unix"
    server = socketserver.ThreadingUnixStreamServer(opt("--uds"), UnixHandler)
    server.model, server.served_model_name = ChatModel(args[1], "cpu"), opt("--served-model-name")
    server.serve_forever()
os.execv(sys.executable, [sys.executable, "-m", "otbuild.serve", args[1], "--device", "cpu",
         "--host", opt("--host"), "--port", opt("--port"),
         "--served-model-name", opt("--served-model-name")])
"""


@pytest.fixture
def fake_vllm_bin(tmp_path, monkeypatch) -> Path:
    """A `vllm` executable on PATH that is `otbuild serve` underneath (vLLM itself needs a
    CUDA build): the real launch, health check and stop paths run against it. Returns the
    file where it records the argv it was given (also exported as FAKE_VLLM_LOG)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "vllm"
    exe.write_text(FAKE_VLLM.format(python=sys.executable))
    exe.chmod(0o755)
    log = tmp_path / "argv.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_VLLM_LOG", str(log))
    return log


def run_bench(script: str, *args: str, timeout: float) -> str:
    """`python bench/SCRIPT ARGS...` from the repository root; its output, once it exited 0."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / script), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    return out


def tool_answer(python: Path, script: str, given: dict, out: Path, timeout: float = 600, **env_vars) -> dict:
    """Run tests/support/SCRIPT (a contract check) with a pinned tool's `python`: `given` as JSON on
    stdin, its answer read back from `out`. Without otbuild's PYTHONPATH: the tool's own packages."""
    from otbuild.train.dist import outside_group

    env = {**outside_group(dict(os.environ)), **env_vars}  # its own process group, if it starts one
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [str(python), str(REPO / "tests" / "support" / script), str(out)],
        input=json.dumps(given),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )
    assert proc.returncode == 0 and out.is_file(), (proc.stdout + proc.stderr)[-4000:]
    return json.loads(out.read_text())


def pinned_release(extra: str) -> str:
    """The one release of `extra`'s package that pyproject.toml's extra of that name pins (the
    contract tests' tools: vllm, llamafactory)."""
    import tomllib

    reqs = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"][extra]
    (pin,) = [r for r in reqs if r.startswith(f"{extra}==")]
    return pin.removeprefix(f"{extra}==")


# --- where CI's time goes ------------------------------------------------------------------
# CI has 40 minutes for set-up and the suite on 2 cores. After every run the suite prints each
# test file's seconds (its tests' setup, call and teardown: a shared fixture is charged to the
# first test that asks for it) beside its budget in tests/data/time_budget.json, and names the
# files over budget: a slow change shows where it lands. A report, never a failure (timings
# are noisy); set a new file's budget, or raise one, with the reason in the commit.
TIME_BUDGET = Path(__file__).with_name("data") / "time_budget.json"
_file_seconds: Counter = Counter()


# CI runs the suite on both cores (`make test`: pytest-xdist, `-n 2 --dist loadgroup`). A file is
# one unit of work (its module fixtures built once); every file that reads the session's smoke
# build is one unit together, so one worker builds it and its readers never run beside each
# other (some run snakemake in its project). Units go out longest first, by their budget.
SMOKE_GROUP = "smoke_build"


@pytest.hookimpl(tryfirst=True)  # before xdist names each test's group
def pytest_collection_modifyitems(config, items) -> None:
    if not getattr(config.option, "loadgroup", False):  # xdist's workers collect with it set, not `dist`
        return
    files = {item.nodeid.split("::")[0] for item in items}
    readers = {item.nodeid.split("::")[0] for item in items if "smoke_build" in getattr(item, "fixturenames", ())}
    group = {f: SMOKE_GROUP if f in readers else f for f in files}
    budget = json.loads(TIME_BUDGET.read_text())
    seconds: Counter = Counter()
    for f in files:
        seconds[group[f]] += budget["seconds"].get(f, budget["default"])
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group[item.nodeid.split("::")[0]]))
    items.sort(key=lambda item: (-seconds[group[item.nodeid.split("::")[0]]], group[item.nodeid.split("::")[0]]))


def pytest_runtest_logreport(report) -> None:
    _file_seconds[report.nodeid.split("::")[0].split("@")[0]] += report.duration


def pytest_terminal_summary(terminalreporter) -> None:
    if not _file_seconds:
        return
    budget = json.loads(TIME_BUDGET.read_text())
    allowed = {path: budget["seconds"].get(path, budget["default"]) for path in _file_seconds}
    over = [path for path, secs in _file_seconds.items() if secs > allowed[path]]
    tr = terminalreporter
    tr.section("time per test file, against tests/data/time_budget.json")
    for path, secs in _file_seconds.most_common():
        if secs >= 10 or path in over:
            tr.write_line(f"{secs:8.1f} s  {allowed[path]:>6} s  {path}{'  OVER' if path in over else ''}")
    tr.write_line(f"{sum(_file_seconds.values()):8.1f} s  {sum(allowed.values()):>6} s  in all")
    if over:
        tr.write_line(f"over budget: {', '.join(sorted(over))}")
