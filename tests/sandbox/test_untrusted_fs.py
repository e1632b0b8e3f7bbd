"""Issue 44: what otbuild does on the host around a trial never follows what the trial made.

Each attack plants a link (or races one in) from inside a trial, or leaves a file where the
next step stages a folder, and shows the host untouched, the step's tests gone before the next
agent turn, and the hostile task's failure kept to its own trial (docs/security.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from otbuild.sandbox import Limits, TaskSetupError, backend_problem, open_sandbox, read_reward, safefs
from otbuild.sources.synthetic import generate
from otbuild.tasks.taskdir import TaskDir

FAST = Limits(cpu_seconds=30, memory_mb=1024, max_processes=64, wall_seconds=60, output_bytes=200_000)


def _backend(name: str):
    return pytest.param(
        name,
        marks=pytest.mark.skipif(
            backend_problem(name) is not None, reason=f"{name} unusable here: {backend_problem(name)}"
        ),
    )


LOCAL = [_backend("bwrap"), _backend("unshare")]
needs_podman = pytest.mark.skipif(backend_problem("podman") is not None, reason="podman unusable here")
TEST_SH = "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"


def two_step_task(
    name: str = "two-step",
    second: dict[str, str] | None = None,
    *,
    dockerfile: str = "FROM python:3.12-slim\nWORKDIR /app\n",
    first_solve: str = "true",
) -> TaskDir:
    """Steps `one` (its own tests, solve.sh running `first_solve`) and `two`, which stages
    `second` (paths under workdir/) into the working dir."""
    t = TaskDir(name)
    t.add("task.toml", '[agent]\ntimeout_sec = 30.0\n[[steps]]\nname = "one"\n[[steps]]\nname = "two"\n')
    t.add("environment/Dockerfile", dockerfile)
    t.add("steps/one/instruction.md", "Step one.\n")
    t.add("steps/one/solution/solve.sh", f"#!/bin/bash\n{first_solve}\n", executable=True)
    t.add(
        "steps/one/tests/test.sh",
        "#!/bin/bash\n# step-one-secret\necho 1 > /logs/verifier/reward.txt\n",
        executable=True,
    )
    t.add("steps/two/instruction.md", "Step two.\n")
    for rel, text in (second or {"notes.txt": "step two\n"}).items():
        t.add(f"steps/two/workdir/{rel}", text)
    t.add("tests/test.sh", TEST_SH, executable=True)
    return t


@pytest.fixture
def host(tmp_path) -> Path:
    """A host folder with one file: what a planted link points at."""
    d = tmp_path / "host"
    d.mkdir()
    (d / "file").write_text("host\n")
    return d


def untouched(host: Path) -> bool:
    st = (host / "file").stat()
    return (
        (host / "file").read_text() == "host\n"
        and sorted(os.listdir(host)) == ["file"]
        and (st.st_uid, st.st_gid) == (os.getuid(), os.getgid())
    )


# -- staging a step (attack 1) -------------------------------------------------------------------
@pytest.mark.parametrize("backend", LOCAL)
def test_a_step_is_staged_over_a_file_link_the_last_step_left_never_through_it(tmp_path, host, backend):
    task = two_step_task()
    with open_sandbox(task.step("one"), tmp_path / "trials", backend=backend, limits=FAST) as box:
        assert box.run(f"ln -s {host}/file /app/notes.txt", timeout=10).exit_code == 0
        box.begin_step(task.step("two"))
        assert box.run("cat /app/notes.txt", timeout=10).output == "step two\n"
        assert not (box.root / "app" / "notes.txt").is_symlink()
    assert untouched(host)


@pytest.mark.parametrize("backend", LOCAL)
def test_a_step_is_never_staged_through_a_folder_link_and_the_task_is_blamed(tmp_path, host, backend):
    task = two_step_task(second={"sub/data.txt": "x\n"})
    with open_sandbox(task.step("one"), tmp_path / "trials", backend=backend, limits=FAST) as box:
        box.run(f"ln -s {host} /app/sub", timeout=10)
        with pytest.raises(TaskSetupError, match="sub"):
            box.begin_step(task.step("two"))
    assert untouched(host)


@pytest.mark.parametrize("backend", LOCAL)
def test_a_file_where_a_step_stages_a_folder_is_the_tasks_setup_error(tmp_path, backend):
    task = two_step_task(second={"sub/data.txt": "x\n"})
    with open_sandbox(task.step("one"), tmp_path / "trials", backend=backend, limits=FAST) as box:
        box.run("echo x > /app/sub", timeout=10)
        with pytest.raises(TaskSetupError, match="sub"):
            box.begin_step(task.step("two"))


def test_staged_files_and_folders_belong_to_the_trial(tmp_path):
    """Folders a step's staging makes are the trial uid's, as its files are (it may write there)."""
    task = two_step_task(second={"deep/er/data.txt": "x\n"})
    with open_sandbox(task.step("one"), tmp_path / "trials", backend="bwrap", limits=FAST) as box:
        box.begin_step(task.step("two"))
        r = box.run("touch /app/deep/er/new && stat -c %u /app/deep /app/deep/er/data.txt", timeout=10)
        assert r.exit_code == 0 and set(r.output.split()) == {str(box.uid)}, r.output


# -- tests and the verifier's folder ------------------------------------------------------------
@pytest.mark.parametrize("backend", LOCAL)
def test_tests_are_never_written_through_a_link_in_a_tests_folder_the_image_left_writable(tmp_path, host, backend):
    """A task whose Dockerfile COPYs to /tests makes /tests one of the trial's writable dirs:
    the agent's link there is gone, and the verifier gets the task's own tests."""
    task = TaskDir("tests-in-image")
    task.add("instruction.md", "x")
    task.add("environment/Dockerfile", "FROM ubuntu:24.04\nWORKDIR /app\nCOPY notes /tests/\n")
    task.add("environment/notes/readme", "image file\n")
    task.add("tests/test.sh", TEST_SH, executable=True)
    with open_sandbox(task, tmp_path / "trials", backend=backend, limits=FAST) as box:
        plant = f"ln -sf {host}/file /tests/test.sh; ln -s {host} /tests/conftest; echo forged > /tests/extra"
        assert box.run(plant, timeout=10).exit_code == 0
        r = box.run("bash /tests/test.sh; ls /tests", timeout=10, with_tests=True)
        assert r.exit_code == 0 and r.output.split() == ["test.sh"], r.output
        assert read_reward(box.root) == 1.0
    assert untouched(host)


def test_step_two_of_a_task_whose_image_makes_tests_writable_sees_none_of_step_ones(tmp_path):
    task = two_step_task(dockerfile="FROM ubuntu:24.04\nWORKDIR /app\nCOPY notes /tests/\n")
    task.add("environment/notes/readme", "image file\n")
    with open_sandbox(task.step("one"), tmp_path / "trials", backend="bwrap", limits=FAST) as box:
        assert box.run("bash /tests/test.sh", timeout=10, with_tests=True).exit_code == 0
        box.begin_step(task.step("two"))
        r = box.run("ls -A /tests /logs/verifier", timeout=10)
        assert r.exit_code == 0 and r.output.split() == ["/logs/verifier:", "/tests:"], r.output


@pytest.mark.parametrize("backend", LOCAL)
def test_the_verifier_folder_is_reset_without_following_a_link_the_agent_left(tmp_path, host, backend):
    task = next(iter(generate(1, seed=0, families=["files"]))).task
    with open_sandbox(task, tmp_path / "trials", backend=backend, limits=FAST) as box:
        box.run(f"rm -rf /logs/verifier && ln -s {host} /logs/verifier", timeout=10)
        box.run("true", timeout=10, with_tests=True)
        assert not (box.root / "logs" / "verifier").is_symlink()
        r = box.run("ls -A /logs/verifier; stat -c %u /logs/verifier", timeout=10)
        assert r.output.split() == [str(box.uid)]
    assert untouched(host)


# -- the module everything goes through: links and races -----------------------------------------
def test_safefs_refuses_links_and_special_files_at_every_part_of_a_path(tmp_path, host):
    root = tmp_path / "root"
    (root / "app").mkdir(parents=True)
    (root / "app" / "dir").symlink_to(host)
    (root / "app" / "file").symlink_to(host / "file")
    os.mkfifo(root / "app" / "fifo")
    os.link(host / "file", root / "app" / "hard")
    with pytest.raises(safefs.UnsafePathError):
        safefs.write_file(root, "app/dir/new", b"x")
    with pytest.raises(safefs.UnsafePathError):
        safefs.read_file(root, "app/file", 100)
    with pytest.raises(safefs.UnsafePathError):
        safefs.read_file(root, "app/fifo", 100)  # never blocks on a pipe
    with pytest.raises(safefs.UnsafePathError):
        safefs.read_file(root, "app/dir/file", 100)
    with pytest.raises(ValueError, match=r"\.\."):
        safefs.write_file(root, "app/../../host/file", b"x")
    for name in ("file", "fifo", "hard"):  # a link, a pipe or a hard link there is replaced
        safefs.write_file(root, f"app/{name}", b"mine", mode=0o600)
        assert safefs.read_file(root, f"app/{name}", 100) == b"mine"
    safefs.remove(root, "app/dir")
    assert untouched(host) and not (root / "app" / "dir").exists()
    safefs.remove(root, "app")
    assert untouched(host) and not (root / "app").exists()


def test_safefs_copy_out_leaves_links_and_special_files_behind(tmp_path, host):
    root, out = tmp_path / "root", tmp_path / "out"
    (root / "logs" / "sub").mkdir(parents=True)
    (root / "logs" / "a.txt").write_text("a")
    (root / "logs" / "sub" / "b.txt").write_text("b")
    (root / "logs" / "link").symlink_to(host)
    (root / "logs" / "sub" / "flink").symlink_to(host / "file")
    os.mkfifo(root / "logs" / "fifo")
    safefs.copy_out(root, "logs", out)
    found = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    assert found == ["a.txt", "sub", "sub/b.txt"]
    with pytest.raises(safefs.UnsafePathError):
        safefs.copy_out(root, "logs/link", tmp_path / "out2")


SWAPPER = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
app, host = os.fsencode(sys.argv[1]), sys.argv[2]
os.symlink(host, os.path.join(sys.argv[1], "link"))
AT_FDCWD, RENAME_EXCHANGE = -100, 2
sub, link = app + b"/sub", app + b"/link"
while True:  # app/sub is the folder, then the link to the host, then the folder, ...
    libc.renameat2(AT_FDCWD, sub, AT_FDCWD, link, RENAME_EXCHANGE)
"""


def write_into_sub(root: Path, i: int, out: Path) -> None:
    safefs.write_file(root, f"app/sub/f{i % 5}", b"x")


def copy_sub_out(root: Path, i: int, out: Path) -> None:
    safefs.copy_out(root, "app", out / str(i % 5))


@pytest.mark.parametrize("action", [write_into_sub, copy_sub_out])
def test_safefs_never_goes_through_a_folder_swapped_for_a_link_meanwhile(tmp_path, host, action):
    """Another process swaps app/sub between a folder and a link to the host all along: no
    write lands on the host, no host file is copied out."""
    root, out = tmp_path / "root", tmp_path / "out"
    (root / "app" / "sub").mkdir(parents=True)
    (root / "app" / "sub" / "mine").write_text("trial\n")
    racer = subprocess.Popen([sys.executable, "-c", SWAPPER, str(root / "app"), str(host)])
    refused = 0
    try:
        for i in range(1500):
            try:
                action(root, i, out)
            except (safefs.UnsafePathError, FileNotFoundError):
                refused += 1
    finally:
        racer.kill()
        racer.wait()
    assert untouched(host)
    copied = [p.read_text() for p in out.rglob("*") if p.is_file()] if out.exists() else []
    assert "host\n" not in copied
    assert refused or copied  # the race was on


# -- podman (attack 3) -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def podman_steps() -> TaskDir:
    """A two-step task whose image is built once for this module."""
    from otbuild.sandbox.podman.images import ensure_image

    task = two_step_task("podman-steps", second={"notes.txt": "step two\n", "sub/data.txt": "x\n"})
    ensure_image(task)
    return task


@needs_podman
def test_a_steps_tests_and_verifier_logs_are_gone_before_the_next_agent_under_podman(tmp_path, podman_steps):
    with open_sandbox(podman_steps.step("one"), tmp_path / "trials", backend="podman", limits=FAST) as box:
        r = box.run("bash /tests/test.sh", timeout=20, with_tests=True)
        assert r.exit_code == 0 and read_reward(box.root) == 1.0
        box.begin_step(podman_steps.step("two"))
        r = box.run(
            "ls /tests; ls -A /logs/verifier; grep -rs step-one-secret / --exclude-dir=proc --exclude-dir=sys",
            timeout=30,
        )
        assert "step-one-secret" not in r.output and "test.sh" not in r.output, r.output
        assert "reward.txt" not in r.output
        r = box.run("cat /tests/test.sh", timeout=10, with_tests=True)
        assert "reward.txt" in r.output and "step-one-secret" not in r.output  # step two's own tests


@needs_podman
def test_a_file_where_a_step_stages_a_folder_is_the_tasks_setup_error_under_podman(tmp_path, podman_steps):
    with open_sandbox(podman_steps.step("one"), tmp_path / "trials", backend="podman", limits=FAST) as box:
        box.run("echo x > /app/sub", timeout=10)
        with pytest.raises(TaskSetupError, match="sub"):
            box.begin_step(podman_steps.step("two"))


@needs_podman
def test_podman_resets_the_verifier_folder_without_following_a_link(tmp_path, podman_steps, host):
    with open_sandbox(podman_steps.step("one"), tmp_path / "trials", backend="podman", limits=FAST) as box:
        box.run(f"rm -rf /logs/verifier && ln -s {host} /logs/verifier", timeout=10)
        assert box.run("bash /tests/test.sh", timeout=20, with_tests=True).exit_code == 0
        assert read_reward(box.root) == 1.0
    assert untouched(host)


# -- one task's failure is that trial's (attack 4) ----------------------------------------------
@pytest.mark.skipif(backend_problem("bwrap") is not None, reason="bubblewrap unusable here")
def test_a_hostile_task_ends_its_own_trial_and_the_shard_finishes(tmp_path):
    """Step one leaves a file where step two stages a folder: that trial's row says why
    (TaskSetupError, a task failure with reward 0, not retried; step one's turns kept); the
    good task's trace is there."""
    from otbuild.settings.stages import RolloutSettings
    from otbuild.stages.rollout import run_shard
    from otbuild.tasks.harbor_meta import harbor_record
    from otbuild.tasks.table import write_tasks
    from otbuild.traces import outcome as oc

    hostile = harbor_record(
        two_step_task(
            "hostile",
            second={"sub/data.txt": "x\n"},
            dockerfile="FROM ubuntu:24.04\nWORKDIR /app\n",
            first_solve="echo x > sub",
        )
    )
    good = next(iter(generate(1, seed=0, families=["files"])))
    tasks = tmp_path / "tasks.parquet"
    write_tasks(tasks, [hostile, good], source="mixed")
    run_shard(
        RolloutSettings(engine="oracle", sandbox="bwrap", concurrency=2, infra_retries=2), [tasks], tmp_path / "out", 0
    )
    rows = {r["task"]: r for r in pq.read_table(tmp_path / "out" / "shards" / "0-of-1.parquet").to_pylist()}
    assert rows[good.task.name]["reward"] == 1.0 and rows[good.task.name]["exception"] is None
    bad = rows["hostile"]
    assert bad["result"] == "TaskSetupError" and bad["exception"] is None and oc.outcome(bad) == oc.TASK_FAILURE
    meta = json.loads(bad["metadata"])
    assert "attempts" not in meta  # not retried
    one, two = meta["steps"]
    assert (one["name"], one["reward"], two["name"], two["reward"]) == ("one", 1.0, "two", 0.0)
    assert two["stop_reason"] == "task_setup_failed" and "app/sub" in two["stop_message"]
    assert bad["n_turns"] > 0  # step one's conversation is the trace's


@pytest.mark.skipif(backend_problem("bwrap") is not None, reason="bubblewrap unusable here")
def test_a_task_whose_own_files_collide_fails_its_trial_as_a_task_failure(tmp_path):
    """A layout that puts a file where it puts a folder: TaskSetupError, reward 0, no retry."""
    import asyncio

    from otbuild.harness.oracle import OracleEngine
    from otbuild.harness.config import TrialConfig
    from otbuild.harness.trial import run_trial
    from otbuild.settings.trials import Trials

    task = TaskDir("collide")
    task.add("instruction.md", "x")
    task.add("environment/Dockerfile", "FROM ubuntu:24.04\nWORKDIR /app\nCOPY a /app/x\nCOPY b /app/x/y\n")
    task.add("environment/a", "file")
    task.add("environment/b", "file below it")
    task.add("tests/test.sh", TEST_SH, executable=True)
    row = asyncio.run(run_trial(task, task.task_id(), OracleEngine(), TrialConfig(Trials(), "terminus2"), tmp_path))
    assert (row["result"], row["exception"], row["reward"]) == ("TaskSetupError", None, 0.0)
    assert "app/x" in json.loads(row["metadata"])["stop_message"]


# -- Harbor's environment -----------------------------------------------------------------------
HARBOR_PYTHON = Path(__file__).resolve().parents[2] / ".venv-harbor" / "bin" / "python"
HARBOR_SCRIPT = """
import asyncio, sys
from pathlib import Path
from harbor.models.task.config import EnvironmentConfig
from harbor.models.trial.paths import TrialPaths
from otbuild.harbor.environment import OtbuildEnvironment

task, host, out = map(Path, sys.argv[1:4])

async def main():
    env = OtbuildEnvironment(environment_dir=task / "environment", environment_name="t", session_id="t__1__env",
                             trial_paths=TrialPaths(trial_dir=out / "trial"), task_env_config=EnvironmentConfig(),
                             workdir=str(out / "work"))
    await env.start(force_build=False)
    try:
        await env.exec(f"echo mine > /logs/agent/real.txt; ln -s {host} /logs/agent/dir; "
                       f"ln -s {host}/file /logs/agent/file; ln -s {host} /app/up; ln -s {host}/file /app/f")
        await env.download_dir("/logs/agent", out / "agent")
        for target in ("/app/up/new.txt", "/app/f"):
            try:
                await env.upload_file(out / "upload.txt", target)
            except OSError as e:
                print("refused", target, type(e).__name__)
        print("app:", (await env.exec("cat /app/f")).stdout.strip())
        try:
            await env.download_file("/logs/agent/file", out / "file")
        except OSError as e:
            print("refused /logs/agent/file", type(e).__name__)
    finally:
        await env.stop(delete=True)

asyncio.run(main())
"""


@pytest.mark.skipif(not HARBOR_PYTHON.is_file(), reason="no .venv-harbor (make harbor-env)")
@pytest.mark.skipif(backend_problem("bwrap") is not None, reason="bubblewrap unusable here")
def test_harbors_environment_copies_in_and_out_through_no_link_the_agent_made(tmp_path, host):
    task = tmp_path / "task"
    (task / "environment").mkdir(parents=True)
    (task / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\n")
    (task / "instruction.md").write_text("x\n")
    (tmp_path / "upload.txt").write_text("uploaded\n")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    r = subprocess.run(
        [str(HARBOR_PYTHON), "-c", HARBOR_SCRIPT, str(task), str(host), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "refused /app/up/new.txt UnsafePathError" in r.stdout and "app: uploaded" in r.stdout, r.stdout
    assert "refused /logs/agent/file UnsafePathError" in r.stdout
    assert sorted(p.name for p in (tmp_path / "agent").iterdir()) == ["real.txt"]
    assert untouched(host)
