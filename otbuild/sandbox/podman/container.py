"""The podman trial: one container of the task's image (`--init`, the network its task.toml
allows, memory, pids, cpu and disk limits); commands run in it through `podman exec`.

When the phases' networks differ (a verifier that installs its test runner, an agent that must
stay offline) the container starts on the network and is disconnected from it for the offline
phase (`podman network disconnect`/`connect` before the verifier's first command). `/logs` is the
trial root's `logs/` (the reward is read from the host side, as for bwrap), `/solution` is
mounted read-only for the oracle only, and `/tests` is copied in when the verifier first runs.

Every command gets a marker in its environment; when it ends, the processes still carrying
that marker (what it left in the background) are killed, and `kill_all` kills everything in
the container's pid namespace except its init and the process that keeps the container up.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import resource
import secrets
import shutil
import subprocess
import tempfile
import time
import tomllib
from pathlib import Path
from typing import cast

from otbuild.sandbox import safefs
from otbuild.sandbox.disk import MB, storage_opt, tree_usage
from otbuild.sandbox.errors import TaskSetupError, task_setup
from otbuild.sandbox.layout import write_subtree
from otbuild.sandbox.podman.cli import ContainerError, _podman
from otbuild.sandbox.podman.images import BUILD_TIMEOUT_SEC, ensure_image
from otbuild.sandbox.podman.network import TrialNetworks, trial_networks
from otbuild.sandbox.procs import kill_until_gone, owner, owner_is_gone, pids_with_env, scan
from otbuild.sandbox.sandbox import Sandbox, reset_verifier
from otbuild.settings.limits import Limits
from otbuild.tasks.task_toml import task_config
from otbuild.tasks.taskdir import WORKDIR, TaskDir

log = logging.getLogger(__name__)

MARKER = "OTBUILD_EXEC"
OWNER_LABEL = "otbuild.owner"  # host:pid:start time of the process (the build's job) running the trial


# -- the trial ------------------------------------------------------------------------------
class PodmanSandbox(Sandbox):
    """A trial in its own container. Same interface and guarantees as the bwrap sandbox."""

    def __init__(
        self,
        task: TaskDir,
        root: Path,
        image: str,
        limits: Limits,
        *,
        cpus: float,
        networks: TrialNetworks,
        with_solution: bool,
        cleanup: bool,
    ):
        self.task, self.root, self.backend, self.limits = task, root, "podman", limits
        self._with_solution, self._cleanup = with_solution, cleanup
        self.uid = 0
        self.container = f"otbuild-{secrets.token_hex(6)}"
        self.networks = networks
        self.network = networks.started_on  # the container's network now
        for d in ("agent", "verifier"):
            with safefs.opened_dir(root, f"logs/{d}", create=True):
                pass
        mounts = ["-v", f"{root / 'logs'}:/logs"]
        if with_solution:
            write_subtree(task, "solution", root, "solution")
            mounts += ["-v", f"{root / 'solution'}:/solution:ro"]
        mb, fsize = limits.memory_mb, limits.file_size_mb * MB
        try:  # a failed `run` can leave the container created: removed as well
            _podman(
                "run",
                "-d",
                "--init",
                "--name",
                self.container,
                f"--network={self.network}",
                "--hostname",
                "sandbox",
                f"--memory={mb}m",
                f"--memory-swap={mb}m",
                f"--pids-limit={limits.max_processes}",
                f"--cpus={cpus:g}",
                "--ulimit",
                f"cpu={limits.cpu_seconds}:{limits.cpu_seconds}",
                "--ulimit",
                f"fsize={fsize}:{fsize}",
                "--ulimit",
                "core=0:0",
                *_base_ulimits(),
                "--label",
                f"otbuild.trial={root}",
                "--label",
                f"{OWNER_LABEL}={owner()}",
                *mounts,
                *storage_opt(image, limits.storage_mb),
                "--entrypoint",
                "sleep",
                image,
                "infinity",
                timeout=300,
                cwd=root,
            )  # conmon's cwd: it writes an `oom` file there on an OOM kill
            info = json.loads(_podman("inspect", self.container).stdout)[0]
            init = int(info["State"]["Pid"])
            self._pidns = os.readlink(f"/proc/{init}/ns/pid")
            self._keep = {init} | _keeper(init)  # catatonit and its `sleep infinity`
            self.workdir = info["Config"].get("WorkingDir") or "/"
            self._upper = Path(info["GraphDriver"]["Data"].get("UpperDir") or root / "no-upper-dir")
            self._switch_network(networks.agent, "agent")
        except BaseException:
            self._remove()
            raise
        self._start_clock()

    @property
    def owner(self) -> safefs.Owner:
        """The host's user: /logs and /solution are the container root's."""
        return None

    def _disk_used(self) -> int:
        """What the trial wrote: the container's writable layer and /logs."""
        return tree_usage(self._upper, self.root / "logs")

    # -- commands -------------------------------------------------------------------
    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """The image's own environment (its ENV lines) plus TERM and `extra`."""
        return {"TERM": "dumb", **(extra or {})}

    def _command_argv(
        self, command: list[str], *, with_tests: bool, cwd: str | None, env: dict[str, str] | None, tty: bool
    ) -> list[str]:
        env_args = [a for k, v in self.env(env).items() for a in ("--env", f"{k}={v}")]
        return [
            "podman",
            "exec",
            "-i",
            *(["-t"] if tty else []),
            "--env",
            f"{MARKER}={secrets.token_hex(8)}",
            *env_args,
            "--workdir",
            cwd or self.workdir,
            self.container,
            *command,
        ]

    def _command_ended(self, proc: subprocess.Popen) -> None:
        """What the command left running (the processes carrying its marker) is killed."""
        argv = cast(list[str], proc.args)  # _command_argv's list
        marker = next(a for a in argv if a.startswith(MARKER + "=")).encode()
        kill_until_gone(lambda: pids_with_env(marker, self._namespace_pids() - self._keep))

    def _kill_tree(self, proc: subprocess.Popen) -> None:
        self._command_ended(proc)
        super()._kill_tree(proc)

    def begin_step(self, step: TaskDir) -> None:
        """As `Sandbox.begin_step`, in the container: the last step's /tests and verifier logs go
        (its tests stay in a container, unlike a bwrap trial's), /solution (a bind mount) gets
        the step's, its workdir/ files are copied in; the agent's network back."""
        self._check_open()
        self.task, self._tests_ready = step, False
        with task_setup(step.name, "staging the next step"):
            if self._with_solution:
                safefs.clear(self.root, "solution")
                write_subtree(step, "solution", self.root, "solution")
            reset_verifier(self.root)
        self._exec_as_root("/bin/rm", "-rf", "/tests")
        self._switch_network(self.networks.agent, "agent")
        with tempfile.TemporaryDirectory(prefix="otbuild-workdir-") as d:
            write_subtree(step, WORKDIR, Path(d))
            if any(Path(d).iterdir()):
                try:  # podman resolves links in the container's own root, never the host's
                    _podman("cp", f"{d}/.", f"{self.container}:{self.workdir}")
                except ContainerError as e:  # what the last step left is in the way
                    raise TaskSetupError(f"task {step.name!r}: staging the next step: {e}") from e

    def _ensure_tests(self) -> None:
        """tests/ copied to /tests (a fresh copy: the agent may have made its own /tests) and
        an empty logs/verifier, once, for the verifier."""
        if self._tests_ready:
            return
        with task_setup(self.task.name, "putting its tests in place"):
            reset_verifier(self.root)
        self._switch_network(self.networks.verifier, "verifier")
        with tempfile.TemporaryDirectory(prefix="otbuild-tests-") as d:
            write_subtree(self.task, "tests", Path(d), "tests")
            self._exec_as_root("/bin/rm", "-rf", "/tests")
            _podman("cp", f"{d}/tests", f"{self.container}:/tests")
        self._tests_ready = True

    def _exec_as_root(self, *command: str) -> None:
        _podman("exec", "--user", "0", self.container, *command)

    def _switch_network(self, network: str, phase: str) -> None:
        """Connect the container to `network`, or disconnect it from its network (`none`),
        for the phase that starts; ContainerError when podman cannot (the phase never runs
        with more network than its policy allows)."""
        if network == self.network:
            return
        if network == "none":
            _podman("network", "disconnect", self.network, self.container)
        else:
            _podman("network", "connect", network, self.container)
        settings = json.loads(_podman("inspect", self.container).stdout)[0]["NetworkSettings"]
        attached = set(settings.get("Networks") or {})
        if attached != (set() if network == "none" else {network}):
            raise ContainerError(
                f"container {self.container}: the {phase} phase needs network {network!r}, "
                f"but it is attached to {sorted(attached)}"
            )
        self.network = network

    # -- the end ------------------------------------------------------------------------
    def kill_all(self, keep=None) -> None:
        """SIGKILL every process in the container but the two that keep it up, and the
        `podman exec` clients on the host; return when none is left (`keep`: podman parks
        nothing)."""

        def find() -> set[int]:
            with self._lock:
                clients = {p.pid for p in self._procs if p.poll() is None}
            return (self._namespace_pids() - self._keep) | clients

        left = kill_until_gone(find)
        if left:
            log.error("sandbox %s: processes survived kill_all: %s", self.container, sorted(left))
        self._handed_out = False

    def close(self) -> None:
        """Remove the container (every process in it dies); the root only if `cleanup`."""
        if self._closed:
            return
        self._watchdog.cancel()
        self._disk.stop()
        self._closed = True
        self.kill_all()
        self._remove()
        if self._cleanup:
            safefs.remove_path(self.root)

    def _namespace_pids(self) -> set[int]:
        found = set()
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    if os.readlink(f"{entry.path}/ns/pid") == self._pidns:
                        found.add(int(entry.name))
                except OSError:
                    pass
        return found

    def _remove(self) -> None:
        _podman("rm", "-f", "-t", "0", self.container, check=False, timeout=120)


@functools.cache
def _base_ulimits() -> tuple[str, ...]:
    """Any --ulimit replaces podman's default ulimits, and podman lowers its own nofile/nproc to
    those defaults, so they must be passed again: containers.conf's `default_ulimits` (which
    scripts/podman-setup.sh writes), else this process's hard limits."""
    for conf in (
        os.environ.get("CONTAINERS_CONF"),
        "/etc/containers/containers.conf",
        "/usr/share/containers/containers.conf",
    ):
        if conf is None:
            continue
        try:
            listed = tomllib.loads(Path(conf).read_text())["containers"]["default_ulimits"]
        except (TypeError, OSError, KeyError, tomllib.TOMLDecodeError):
            continue
        return tuple(a for u in listed for a in ("--ulimit", u))
    out: list[str] = []
    for name, res in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        hard = resource.getrlimit(res)[1]
        value = -1 if hard == resource.RLIM_INFINITY else hard
        out += ["--ulimit", f"{name}={value}:{value}"]
    return tuple(out)


def _keeper(init: int, timeout: float = 10.0) -> set[int]:
    """The child catatonit starts (`sleep infinity`): killing it would stop the container."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = {pid for pid, (ppid, _) in scan().items() if ppid == init}
        if found:
            return found
        time.sleep(0.01)
    raise ContainerError(f"the container's init (pid {init}) started no process in {timeout:g}s")


def open_podman(task: TaskDir, root: Path, limits: Limits, *, with_solution: bool, cleanup: bool) -> PodmanSandbox:
    """Build (or reuse) the task's image and start its trial container in `root`: the task's cpus
    up to the recipe's `limits.cpus`, its build time up to BUILD_TIMEOUT_SEC.
    NetworkPolicyError, before anything is built, for a network policy podman cannot enforce."""
    config = task_config(task)
    networks = trial_networks(task.name, config, limits.network)
    env = config.environment
    image = ensure_image(
        task, env.docker_image, limits.pull, min(env.build_timeout_sec, BUILD_TIMEOUT_SEC), limits.build_network
    )
    host = float(os.cpu_count() or 1)
    cpus = min(float(env.cpus or 1), host if limits.tasks_may_raise else min(limits.cpus or host, host))
    return PodmanSandbox(
        task, root, image, limits, cpus=cpus, networks=networks, with_solution=with_solution, cleanup=cleanup
    )


# -- containers of dead builds --------------------------------------------------------------
def leaked_containers() -> list[str]:
    """Trial containers on this host whose owner (the job that ran the trial: a build killed
    with kill -9, a lost job) is gone: nothing will ever close them."""
    if shutil.which("podman") is None:
        return []
    r = _podman(
        "ps",
        "-a",
        "--filter",
        f"label={OWNER_LABEL}",
        "--format",
        f'{{{{.ID}}}} {{{{index .Labels "{OWNER_LABEL}"}}}}',
        check=False,
    )
    return [cid for cid, _, label in (ln.partition(" ") for ln in r.stdout.splitlines()) if owner_is_gone(label)]


def remove_leaked_containers() -> int:
    """Remove the trial containers of dead builds (their processes, exec sessions and conmon
    go with them); the number removed."""
    leaked = leaked_containers()
    if leaked:
        _podman("rm", "-f", "-t", "0", *leaked, check=False, timeout=300)
    return len(leaked)
