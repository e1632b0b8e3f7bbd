"""The local sandbox: layout, the oracle round trip, and hostile commands an agent might type."""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from otbuild.sandbox import (
    LayoutError,
    Limits,
    SandboxError,
    backend_problem,
    head_tail,
    open_sandbox,
    read_reward,
)
from otbuild.sandbox.layout import plan
from otbuild.sandbox.procs import descendants, scan
from otbuild.sources.synthetic import generate
from otbuild.tasks.taskdir import TaskDir
from tests.conftest import in_ot_agent_image

REPO = Path(__file__).resolve().parents[2]
FAST = Limits(cpu_seconds=30, memory_mb=1024, max_processes=64, wall_seconds=60, output_bytes=200_000)


def _backend(name: str):
    return pytest.param(
        name,
        marks=pytest.mark.skipif(
            backend_problem(name) is not None, reason=f"{name} unusable here: {backend_problem(name)}"
        ),
    )


LOCAL = [_backend("bwrap"), _backend("unshare")]  # a private root on the host per trial
ISOLATING = [*LOCAL, _backend("podman")]  # podman: the task's own image, in a container


@pytest.fixture(scope="module")
def generated() -> TaskDir:
    return next(iter(generate(1, seed=0, families=["files"]))).task


@pytest.fixture(params=ISOLATING)
def backend(request) -> str:
    return request.param


@pytest.fixture
def task(generated, backend) -> TaskDir:
    """The generated task; for podman in an OT-Agent-style image (apt-get installs in RUN)."""
    return in_ot_agent_image(generated) if backend == "podman" else generated


@pytest.fixture
def box(task, tmp_path, backend):
    with open_sandbox(task, tmp_path / "trials", backend=backend, limits=FAST) as b:
        yield b


@pytest.fixture(params=LOCAL)
def local_box(generated, tmp_path, request):
    with open_sandbox(generated, tmp_path / "trials", backend=request.param, limits=FAST) as b:
        yield b


def gone(marker: str, within: float = 2.0) -> bool:
    """No host process mentions `marker` (within a moment: the kernel tears a pid
    namespace down asynchronously once its first process has exited)."""
    deadline = time.monotonic() + within
    while marker_pids(marker):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def marker_pids(marker: str) -> list[int]:
    """Host processes whose command line mentions `marker`."""
    return [pid for pid, (_, args) in scan().items() if pid != os.getpid() and any(marker in a for a in args)]


# -- layout -------------------------------------------------------------------------------
def _task(dockerfile: str | None, files: dict[str, str] | None = None) -> TaskDir:
    t = TaskDir("t")
    t.add("instruction.md", "x")
    if dockerfile is not None:
        t.add("environment/Dockerfile", dockerfile)
    for rel, text in (files or {}).items():
        t.add(f"environment/{rel}", text)
    return t


def test_layout_follows_dockerfile():
    lay = plan(
        _task(
            "FROM python:3.12-slim\nWORKDIR /srv/app\nCOPY app/ ./\n"
            'COPY cfg.ini /opt/cfg/\nCOPY run.sh /usr2/bin/run\nENV A=1 B="two words"\n'
            'ENV LEGACY some value\nCOPY ["app/a", "/data"]\nCOPY *.ini /glob/\n',
            {"app/a/b": "1", "app/c": "2", "cfg.ini": "x", "run.sh": "y"},
        )
    )
    assert lay.workdir == "/srv/app"
    assert set(lay.files) == {
        "/srv/app/a/b",
        "/srv/app/c",
        "/opt/cfg/cfg.ini",
        "/usr2/bin/run",
        "/data/b",
        "/glob/cfg.ini",
    }
    assert lay.files["/usr2/bin/run"] == (b"y", False)
    assert lay.env == {"A": "1", "B": "two words", "LEGACY": "some value"}
    assert lay.tops() >= {"srv", "opt", "usr2", "data", "glob", "tmp", "root", "logs"}


def test_layout_defaults_and_refusals():
    lay = plan(_task(None, {"data/x": "1"}))
    assert lay.workdir == "/app" and set(lay.files) == {"/app/data/x"}
    whole = plan(_task("WORKDIR /app\nCOPY . .\n", {"f": "1"}))
    assert "/app/f" in whole.files
    with pytest.raises(LayoutError, match="/etc"):
        plan(_task("COPY f /etc/f\n", {"f": "1"}))
    with pytest.raises(LayoutError, match="not in the task"):
        plan(_task("COPY missing /app/\n"))
    with pytest.raises(LayoutError, match="--from"):
        plan(_task("COPY --from=build /x /app/\n"))


def test_generated_task_layout(generated, tmp_path):
    task = generated
    with open_sandbox(task, tmp_path, backend="bwrap" if not backend_problem("bwrap") else "none") as b:
        host_files = {p.relative_to(b.root / "app").as_posix() for p in (b.root / "app").rglob("*") if p.is_file()}
        want = {rel.removeprefix("environment/app/") for rel in task.files if rel.startswith("environment/app/")}
        assert host_files == want and want
        assert not (b.root / "tests").exists() and not (b.root / "solution").exists()


# -- the oracle round trip ------------------------------------------------------------------
def test_solution_passes_its_tests(task, tmp_path, backend):
    with open_sandbox(task, tmp_path, backend=backend, limits=FAST, with_solution=True) as b:
        r = b.run("bash /solution/solve.sh", timeout=30)
        assert r.exit_code == 0, r.output
        r = b.run("bash /tests/test.sh", timeout=30, with_tests=True)
        assert r.exit_code == 0, r.output
        assert read_reward(b.root) == {"reward": 1.0, "partial_credit": 1.0}


def test_without_solution_reward_is_0(box):
    r = box.run("bash /tests/test.sh", timeout=30, with_tests=True)
    assert read_reward(box.root)["reward"] == 0.0, r.output


def test_agent_cannot_forge_the_reward(box):
    box.run("echo 1 > /logs/verifier/reward.txt; echo '{\"reward\": 1}' > /logs/verifier/reward.json", timeout=10)
    assert read_reward(box.root) == {"reward": 1.0}  # planted ...
    box.run("bash /tests/test.sh", timeout=30, with_tests=True)
    assert read_reward(box.root)["reward"] == 0.0  # ... and cleared before the verifier ran


def test_tests_and_solution_visibility(task, tmp_path, backend):
    with open_sandbox(task, tmp_path, backend=backend, limits=FAST) as b:
        assert b.run("ls /tests", timeout=10).exit_code != 0
        assert b.run("ls /tests/test.sh", timeout=10, with_tests=True).exit_code == 0
        if backend != "podman":  # a container keeps them (the verifier runs last)
            assert b.run("ls /tests", timeout=10).exit_code != 0  # only for the verifier's commands
        assert b.run("ls /solution", timeout=10).exit_code != 0
    with open_sandbox(task, tmp_path, backend=backend, limits=FAST, with_solution=True) as b:
        assert b.run("test -x /solution/solve.sh", timeout=10).exit_code == 0
        assert b.run("touch /solution/x", timeout=10).exit_code != 0  # read-only


def test_tools_work_inside(box):
    script = (
        "set -e; cd /tmp; printf 'b\\na\\n' > f; sort f | grep a | sed s/a/c/ | awk '{print $1}';"
        " tar czf f.tgz f; gzip -t f.tgz; sha256sum f | cut -c1-8; python3 -c 'print(6*7)';"
        " bash -c 'echo $((1+1))'; whoami; ls ~; touch ~/h; echo $HOME; mkdir -p /var/tmp/q"
    )
    r = box.run(script, timeout=30)
    assert r.exit_code == 0, r.output
    assert "c\n" in r.output and "42\n" in r.output and "/root\n" in r.output


def test_python_multiprocessing_works_inside(box):
    """Semaphores live in /dev/shm: each sandbox has a private one its unprivileged uid can
    write (bwrap's own is root's 0755, and multiprocessing failed with PermissionError)."""
    canary = f"otbuild-{box.root.name}"
    r = box.run(
        "python3 -c 'import multiprocessing as mp; print(sum(mp.Pool(2).map(abs, [-20, -22])))';"
        f" stat -c %a /dev/shm; touch /dev/shm/{canary}",
        timeout=60,
    )
    assert r.exit_code == 0 and r.output.split() == ["42", "1777"], r.output
    assert not (Path("/dev/shm") / canary).exists()  # not the host's /dev/shm


# -- hostile commands -----------------------------------------------------------------------
def _repo_fingerprint() -> tuple[str, set[Path]]:
    """Content of the sandbox's own files (nobody else edits them during the test) and which
    of the repo's top files exist (others may be editing theirs, not deleting them all)."""
    h = hashlib.sha256()
    for p in sorted(REPO.glob("otbuild/sandbox/*.py")) + [Path(__file__)]:
        h.update(p.read_bytes())
    top = {
        REPO / n
        for n in ("README.md", "pyproject.toml", "Snakefile", "Makefile", "otbuild", "tests", "recipes", ".git")
    }
    return h.hexdigest(), {p for p in top if p.exists()}


def test_rm_rf_root_touches_only_its_own_trial(task, tmp_path, backend):
    canary = tmp_path / "host" / "canary.txt"
    canary.parent.mkdir()
    canary.write_text("alive")
    before = _repo_fingerprint()
    with (
        open_sandbox(task, tmp_path / "trials", backend=backend, limits=FAST) as other,
        open_sandbox(task, tmp_path / "trials", backend=backend, limits=FAST) as b,
    ):
        other_files = other.run("find /app | sort", timeout=10).output
        r = b.run(
            "rm -rf / --no-preserve-root 2>/dev/null; rm -rf /* 2>/dev/null;"
            " shopt -s dotglob nullglob; left=(/app/*); echo ${#left[@]}",
            timeout=60,
        )
        assert r.output.strip().endswith("0"), r.output  # it did run: its own /app is gone
        assert other.run("find /app | sort", timeout=10).output == other_files
        assert other_files.count("\n") > 1
        if backend != "podman":  # the host's system dirs are read-only; a container's own are not
            assert b.run("echo still here", timeout=10).output == "still here\n"
    assert canary.read_text() == "alive"
    assert _repo_fingerprint() == before
    assert Path("/usr/bin/env").exists() and Path("/etc/passwd").exists()


def test_writes_to_host_paths_fail(box):
    name = f"otbuild-sbx-{os.getpid()}-{time.monotonic_ns()}"
    targets = [
        f"/etc/{name}",
        f"/usr/{name}",
        f"/work/{name}",
        f"/{name}",
        f"/proc/{name}",
        f"/tmp/{name}",
        f"/var/tmp/{name}",
    ]
    r = box.run("; ".join(f"mkdir -p $(dirname {t}) 2>/dev/null; echo x > {t}" for t in targets), timeout=20)
    for t in targets:
        assert not Path(t).exists(), f"{t} was written on the host: {r.output}"
    assert box.run(f"test -f /tmp/{name}", timeout=10).exit_code == 0  # /tmp is the trial's own


def test_host_secrets_are_hidden(local_box, monkeypatch):
    box = local_box
    monkeypatch.setenv("SECRET_TOKEN", "hunter2-secret")
    assert Path("/etc/shadow").exists() or os.geteuid() != 0  # something to hide here
    r = box.run("cat /etc/shadow", timeout=10)
    assert r.exit_code != 0 and "No such file" in r.output
    r = box.run("ls -A /root; ls /home /work /old_root /mnt 2>&1 | grep -c 'No such file'", timeout=10)
    assert r.output == "4\n"  # $HOME is the trial's own (empty); the rest is absent
    r = box.run("env; cat /proc/*/environ", timeout=10)
    assert "hunter2-secret" not in r.output and "SECRET_TOKEN" not in r.output
    assert "HOME=/root" in r.output
    r = box.run("cat /proc/*/cmdline | tr '\\0' ' '; ls /proc | grep -c '^[0-9]'", timeout=10)
    # the host's processes (this one) are not visible; pid 1 is the sandbox's own init
    assert sys.executable not in r.output and "test_sandbox.py" not in r.output
    assert int(r.output.split()[-1]) < 10


def test_network_is_loopback_only(box):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    code = (
        "import socket, sys\n"
        "bad = []\n"
        f"for host, port in [('127.0.0.1', {port}), ('1.1.1.1', 53), ('8.8.8.8', 443)]:\n"
        "    s = socket.socket(); s.settimeout(3)\n"
        "    try:\n"
        "        s.connect((host, port)); bad.append(host)\n"
        "    except OSError as e:\n"
        "        print(host, 'blocked', e)\n"
        "srv = socket.socket(); srv.bind(('127.0.0.1', 0)); srv.listen()\n"
        "c = socket.create_connection(srv.getsockname(), timeout=3); print('loopback ok')\n"
        "sys.exit(1 if bad else 0)\n"
    )
    try:
        r = box.run(["python3", "-c", code], timeout=30)
    finally:
        server.close()
    assert r.exit_code == 0, r.output
    assert "loopback ok" in r.output and r.output.count("blocked") == 3


def _trial_processes(box) -> int:
    """How many host processes belong to the trial (below its launchers; for podman: in
    its container's pid namespace)."""
    if box.backend == "podman":
        return len(box._namespace_pids())
    table = scan()
    tops = [
        pid
        for pid, (_, args) in table.items()
        if args and os.path.basename(args[0]) in ("bwrap", "unshare") and any(str(box.root) in a for a in args)
    ]
    return len(descendants(tops, table))


@pytest.mark.slow
def test_fork_bomb_is_contained(box):
    peak, done = [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _trial_processes(box))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    start = time.monotonic()
    try:
        r = box.run(":(){ :|:& };:; sleep 4", timeout=6)  # the shell stays, as in a terminal
    finally:
        done.set()
        sampler.join()
    assert time.monotonic() - start < 20
    assert 10 < peak[0] <= FAST.max_processes + 4  # bombed, but only up to the limit
    box.kill_all()
    assert not marker_pids(str(box.root))
    t = time.monotonic()
    subprocess.run(["true"], check=True)
    assert time.monotonic() - t < 2  # the host still forks
    assert r.duration_s < 15


def test_endless_output_is_capped(box):
    r = box.run("yes", timeout=30)
    assert r.truncated and not r.timed_out and r.duration_s < 10
    assert FAST.output_bytes <= len(r.output.encode()) < FAST.output_bytes + 200
    assert r.output.startswith("y\ny\n")


def test_sleep_hits_the_timeout(box):
    r = box.run("sleep 100043", timeout=1)
    assert r.timed_out and r.duration_s < 5 and r.exit_code != 0
    assert not marker_pids("100043")


def test_background_processes_do_not_outlive_the_command(box):
    tag = str(900000 + os.getpid() % 10000)
    daemon = f"import os, time\nif os.fork(): os._exit(0)\nos.setsid()\nif os.fork(): os._exit(0)\ntime.sleep({tag}5)\n"
    r = box.run(
        f"sleep {tag}1 & nohup sleep {tag}2 >/dev/null 2>&1 & setsid sleep {tag}3 &"
        f" (sleep {tag}4 &); python3 -c '{daemon}'; sleep 0.3;"
        " ps -e -o comm= | grep -cE '^(sleep|python3)$'",
        timeout=20,
    )
    assert int(r.output.split()[-1]) >= 5, r.output  # they were running inside
    assert gone(tag)


def test_kill_all_ends_processes_started_from_argv(box):
    tag = str(800000 + os.getpid() % 10000)
    procs = [
        subprocess.Popen(
            box.argv(["bash", "-c", f"sleep {tag}1 & setsid sleep {tag}2 & wait"]),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for _ in range(2)
    ]

    def sleepers() -> list[list[str]]:
        return [args for _, args in scan().values() if args[:1] == ["sleep"] and tag in args[1]]

    deadline = time.monotonic() + 10
    while len(sleepers()) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(sleepers()) == 4
    box.kill_all()
    assert gone(tag)
    for p in procs:  # the launchers end too (podman exec may report 0 for a killed session: seen
        p.wait(timeout=5)  # under load in CI, so only their ending is checked)


def test_a_parked_command_survives_kill_all_keep_and_runs_with_its_tests(local_box):
    box = local_box
    tag = str(700000 + os.getpid() % 10000)
    held = box.park(["bash", "-c", f"ls /tests; cat /logs/verifier/x 2>&1; sleep 0.{tag} &"], with_tests=True)
    other = box.park(["sleep", f"{tag}9"])
    box.run(f"mkdir -p /logs/verifier && echo planted > /logs/verifier/x; sleep {tag}1 &", timeout=10)
    box.kill_all(keep=held)  # ends `other`, not `held`
    assert other.proc.poll() is not None and held.proc.poll() is None
    r = held.run(timeout=20)
    assert r.exit_code == 0 and "test.sh" in r.output, r.output  # the tests were copied in at run
    assert "planted" not in r.output  # logs/verifier reset at run, after what the agent left
    assert gone(tag)
    third = box.park(["true"])
    box.close()  # a parked command that never ran ends with the sandbox
    assert third.proc.poll() is not None


@pytest.mark.skipif(os.geteuid() != 0, reason="trial uids are allocated as root only")
def test_a_uid_released_clean_is_taken_again_without_a_proc_scan(monkeypatch, tmp_path):
    from otbuild.sandbox import identity

    monkeypatch.setattr(identity, "LOCK_DIR", tmp_path / "uids")
    monkeypatch.setattr(identity, "UID_RANGE", 1)  # one uid: every acquire takes it again
    scans, live = [], []
    monkeypatch.setattr(identity, "pids_of_uid", lambda uid: scans.append(uid) or live)
    first = identity.acquire()
    first.release(clean=True)
    again = identity.acquire()
    assert again.uid == first.uid and scans == []  # released clean: no scan
    again.release()  # not clean (a crashed run's): the next one looks for leftovers
    live.append(12345)
    with pytest.raises(SandboxError, match="no free sandbox uid"):
        identity.acquire()  # a process of it is left: not handed out
    assert scans == [first.uid]


def test_wall_clock_ends_the_trial(task, tmp_path, backend):
    limits = Limits(wall_seconds=1.5, memory_mb=1024)
    with open_sandbox(task, tmp_path, backend=backend, limits=limits) as b:
        p = subprocess.Popen(b.argv(["sleep", "100007"]), stdout=subprocess.DEVNULL)
        r = b.run("sleep 100008", timeout=60)
        assert r.timed_out and r.duration_s < 4
        assert p.wait(timeout=5) != 0
        assert not marker_pids("100007") and not marker_pids("100008")
        assert b.run("true", timeout=10).timed_out  # nothing runs after the trial's time
        with pytest.raises(TimeoutError):
            b.argv(["true"])


@pytest.mark.parametrize("backend", LOCAL)
def test_a_paused_wall_clock_goes_on_where_it_was(generated, tmp_path, backend):
    """A trial waiting for its turn with the model (otbuild/harness/slots.py) has its wall clock
    stopped: its shell outlives a wait longer than the clock, and the clock's rest still ends it."""
    with open_sandbox(generated, tmp_path, backend=backend, limits=Limits(wall_seconds=1.0, memory_mb=1024)) as b:
        p = subprocess.Popen(b.argv(["sleep", "100009"]), stdout=subprocess.DEVNULL)
        with b.clock_paused():
            time.sleep(1.5)
        assert p.poll() is None and b.run("true", timeout=10).exit_code == 0  # past 1 s, not yet killed
        start = time.monotonic()
        assert p.wait(timeout=5) != 0 and time.monotonic() - start < 1.5  # the clock's rest ran out
        assert b.run("true", timeout=10).timed_out


def test_memory_hog_fails(task, tmp_path, backend, monkeypatch):
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    with open_sandbox(task, tmp_path / "trials", backend=backend, limits=FAST) as box:
        r = box.run(["python3", "-c", "x = bytearray(10 * 1024**3); print('allocated')"], timeout=30)
    assert r.exit_code != 0 and "allocated" not in r.output
    # an address-space rlimit (local) or the container's memory cgroup (podman: OOM-killed)
    assert "MemoryError" in r.output if backend != "podman" else r.exit_code == 137, r
    assert not list((tmp_path / "cwd").iterdir())  # nothing left in the caller's directory (conmon's `oom`)


def test_cpu_burn_is_killed(task, tmp_path, backend):
    with open_sandbox(task, tmp_path, backend=backend, limits=Limits(cpu_seconds=1, memory_mb=1024)) as b:
        r = b.run(["python3", "-c", "while True: pass"], timeout=30)
        assert r.exit_code != 0 and not r.timed_out and r.duration_s < 10


def test_file_size_limit(task, tmp_path, backend):
    with open_sandbox(task, tmp_path, backend=backend, limits=Limits(file_size_mb=1, memory_mb=1024)) as b:
        r = b.run("head -c 3000000 /dev/zero > /app/big; echo rc=$?", timeout=30)
        assert "rc=0" not in r.output
        assert int(b.run("stat -c %s /app/big", timeout=10).output) <= 1024 * 1024


@pytest.mark.parametrize("local", LOCAL)
def test_host_can_read_and_remove_what_the_trial_wrote(generated, tmp_path, local):
    with open_sandbox(generated, tmp_path, backend=local, limits=FAST, cleanup=True) as b:
        b.run(
            "mkdir -p /app/locked/deep && echo s > /app/locked/deep/f && chmod 000 /app/locked"
            " /app/locked/deep && ln -s /etc/passwd /app/link",
            timeout=10,
        )
        root = b.root
        if os.geteuid() == 0:
            assert (root / "app" / "locked" / "deep" / "f").read_text() == "s\n"
    assert not root.exists()


# -- reward, output and the none backend ---------------------------------------------------
def test_read_reward(tmp_path):
    v = tmp_path / "logs" / "verifier"
    assert read_reward(tmp_path) is None
    v.mkdir(parents=True)
    (v / "reward.json").write_text('{"reward": 0.5, "extra": 2}')
    assert read_reward(tmp_path) == {"reward": 0.5, "extra": 2.0}
    (v / "reward.txt").write_text(" 1\n")
    assert read_reward(tmp_path) == {"reward": 1.0, "extra": 2.0}  # reward.txt's reward, json's metrics
    (v / "reward.json").unlink()
    assert read_reward(tmp_path) == 1.0
    (v / "reward.txt").write_text("yes")
    with pytest.raises(ValueError, match="not a number"):
        read_reward(tmp_path)
    (v / "reward.txt").unlink()
    (v / "reward.txt").symlink_to("/etc/hostname")
    with pytest.raises(ValueError):
        read_reward(tmp_path)


def test_head_tail():
    assert head_tail(b"abc", 10) == b"abc"
    out = head_tail(b"a" * 50 + b"b" * 50, 20)
    assert out.startswith(b"a" * 10) and out.endswith(b"b" * 10) and b"80 bytes omitted" in out


def test_none_backend_warns_and_runs_in_the_app_dir(task, tmp_path, caplog):
    with caplog.at_level(logging.WARNING), open_sandbox(task, tmp_path, backend="none", limits=FAST) as b:
        r = b.run("pwd; ls", timeout=10)
        assert r.output.splitlines()[0] == str(b.root / "app")
    assert "WITHOUT isolation" in caplog.text


def test_unknown_backend():
    with pytest.raises(ValueError, match="unknown sandbox backend"):
        open_sandbox(TaskDir("t"), Path("/nonexistent"), backend="docker")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_the_sandbox_needs_only_the_standard_library():
    """Harbor's environment class imports otbuild.sandbox in Harbor's own Python, where otbuild
    is installed without its dependencies (scripts/harbor-env.sh)."""
    code = (
        "import sys, importlib.abc\n"
        "class NoThirdParty(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        top = name.partition('.')[0]\n"
        "        if top not in sys.stdlib_module_names and top != 'otbuild':\n"
        "            raise ImportError(f'third-party module {name} imported')\n"
        "sys.meta_path.insert(0, NoThirdParty())\n"
        "import otbuild.sandbox, otbuild.sandbox.podman.container, otbuild.sandbox.podman.images, "
        "otbuild.tasks.task_toml\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_a_trial_cannot_write_past_its_disk_cap(generated, tmp_path):
    with open_sandbox(generated, tmp_path, limits=replace(FAST, storage_mb=16)) as b:
        r = b.run("head -c 40000000 /dev/zero > /tmp/big", timeout=30)
        deadline = time.monotonic() + 5
        while not b.disk_exceeded and time.monotonic() < deadline:
            time.sleep(0.05)
        assert b.disk_exceeded  # the trial is marked (and was killed): the harness ends it
        if os.geteuid() == 0:  # a tmpfs root: the write itself stops at the cap
            assert r.exit_code != 0 and "No space left on device" in r.output
            assert (b.root / "tmp" / "big").stat().st_size <= 16 * 1024 * 1024


def test_a_kept_root_keeps_the_trials_files_after_close(generated, tmp_path):
    with open_sandbox(generated, tmp_path, limits=replace(FAST, storage_mb=16)) as b:
        b.run("echo kept > /app/note; mkdir -p /root/d && echo x > /root/d/y", timeout=10)
    assert (b.root / "app" / "note").read_text() == "kept\n" and (b.root / "root" / "d" / "y").exists()
    assert str(b.root) not in Path("/proc/self/mounts").read_text()  # and no mount is left


@pytest.mark.parametrize("local", LOCAL)
def test_a_host_dir_bound_read_only_is_seen_where_asked_and_cannot_be_written(generated, tmp_path, local):
    """`bind_ro`: an agent's installed code for Harbor's environment. Its parents are 0755 (bwrap
    would make them 0700, out of the trial user's reach); never over the trial's own dirs."""
    code = tmp_path / "venv"
    (code / "bin").mkdir(parents=True)
    (code / "bin" / "tool").write_text("#!/bin/sh\necho from the host\n")
    (code / "bin" / "tool").chmod(0o755)
    with open_sandbox(generated, tmp_path / "trials", backend=local, limits=FAST) as b:
        b.bind_ro(code, "/opt/agent")
        r = b.run("stat -c %a /opt; /opt/agent/bin/tool; touch /opt/agent/x || echo read-only", timeout=30)
        assert r.output.splitlines()[:2] == ["755", "from the host"] and "read-only" in r.output, r.output
        for taken in ("/app/x", "/usr/x", "/tests", "etc/x"):
            with pytest.raises(SandboxError, match="cannot bind"):
                b.bind_ro(code, taken)
    assert not (code / "x").exists()
