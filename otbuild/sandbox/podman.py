"""The podman backend: a trial in a long-lived container of the task's own image.

The image is built from the task's `environment/Dockerfile` (build context `environment/`; its
RUN lines offline unless `Limits.build_network` is public, the recipe's `build_network`; `--pull`
as `Limits.pull` says; offline, base images come from `scripts/podman-setup.sh` or
`otbuild images load`) and cached under a tag made of the content hash of `environment/`, so
equal environments share one image and a rebuild is free; the build (or pull) is bounded by the
task's `[environment] build_timeout_sec` (Harbor's default: 600 s). A trial is one container
(`--init`, the network its task.toml allows, memory, pids, cpu and disk limits); commands run in
it through `podman exec`.

The network follows task.toml's policy per phase (`TaskConfig.agent_network`,
`.verifier_network`): `public` is podman's default network (or `OTBUILD_PODMAN_NETWORK`),
`no-network` none. When the phases differ (a verifier that installs its test runner, an agent
that must stay offline) the container starts on the network and is disconnected from it for the
offline phase (`podman network disconnect`/`connect` before the verifier's first command). An
`allowlist` is refused (`NetworkPolicyError`, naming the task and its hosts) rather than widened to
the whole internet: a podman network cannot limit what its DNS and routes reach. `/logs` is the
trial root's `logs/` (the reward is read from the host side, as for bwrap), `/solution` is
mounted read-only for the oracle only, and `/tests` is copied in when the verifier first runs.

Every command gets a marker in its environment; when it ends, the processes still carrying
that marker (what it left in the background) are killed, and `kill_all` kills everything in
the container's pid namespace except its init and the process that keeps the container up.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
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
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from otbuild.rundir import open_lock, private_dir, runtime_dir
from otbuild.sandbox import safefs
from otbuild.sandbox.disk import MB, storage_opt, tree_usage
from otbuild.sandbox.errors import SandboxError, TaskSetupError, task_setup
from otbuild.sandbox.layout import write_subtree
from otbuild.sandbox.procs import kill_until_gone, owner, owner_is_gone, pids_with_env, scan
from otbuild.sandbox.sandbox import Sandbox, reset_verifier
from otbuild.settings.limits import Limits
from otbuild.tasks.task_toml import PUBLIC, NetworkPolicy, TaskConfig, task_config
from otbuild.tasks.taskdir import DOCKERFILE, WORKDIR, TaskDir

log = logging.getLogger(__name__)

IMAGE_REPO = "localhost/otbuild-env"
BUILD_TIMEOUT_SEC = 3600
LOCK_DIR: Path | None = None  # None: runtime_dir()/podman-builds
MARKER = "OTBUILD_EXEC"
LOAD_HINT = (" (no registry reached: `otbuild images load DIR` imports `podman save` tarballs; "
             "scripts/podman-setup.sh builds ubuntu, debian and python:3.12-slim ones)")
OWNER_LABEL = "otbuild.owner"  # host:pid:start time of the process (the build's job) running the trial
# the same for an image build: a build arg (no Dockerfile declares it, so it changes no layer and
# no cache key) that buildah records in each working container's buildah.json
BUILD_OWNER_ARG = "OTBUILD_BUILD_OWNER"


class ImageBuildError(SandboxError):
    """`podman build` of a task's environment failed; the message has the build log's tail."""


class ContainerError(SandboxError):
    """The trial's container could not be started or copied into."""


class NetworkPolicyError(SandboxError):
    """The task asks for a network policy a podman trial cannot enforce (an allowlist): the
    trial is refused, never run with more network than the task allows."""


def available() -> str | None:
    """None when podman can run containers here, else why not."""
    if shutil.which("podman") is None:
        return "podman is not installed (scripts/podman-setup.sh installs and configures it)"
    try:
        r = subprocess.run(["podman", "info", "--format", "{{.Host.OCIRuntime.Name}}"],
                           capture_output=True, text=True, timeout=120, check=False)
    except subprocess.TimeoutExpired:
        return "`podman info` did not answer within 120 s"
    if r.returncode != 0:
        return f"`podman info` failed: {_tail(r.stderr, 500)}"
    if os.geteuid() != 0 and not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        log.warning("podman runs rootless on cgroup v1: --memory, --pids-limit and --cpus are "
                    "NOT enforced (run as root, or on cgroup v2)")
    return None


def _podman(*args: str, timeout: float = 120, check: bool = True, cwd: Path | None = None
            ) -> subprocess.CompletedProcess:
    r = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=False, cwd=cwd)
    if check and r.returncode != 0:
        raise ContainerError(f"podman {args[0]} failed (exit {r.returncode}): {_tail(r.stderr, 2000)}")
    return r


def _tail(text: str, n: int) -> str:
    text = text.strip()
    return text if len(text) <= n else "..." + text[-n:]


# -- images ---------------------------------------------------------------------------------
def environment_hash(task: TaskDir) -> str:
    """sha256 over the paths, modes and bytes of `environment/` (the build's whole input)."""
    h = hashlib.sha256(b"otbuild-env-1\0")
    for rel, f in sorted(task.files.items()):
        if rel.startswith("environment/"):
            h.update(f"{rel}\0{int(f.executable)}\0{len(f.data)}\0".encode())
            h.update(f.data)
    return h.hexdigest()


def image_exists(ref: str) -> bool:
    return _podman("image", "exists", ref, check=False).returncode == 0


def ensure_image(task: TaskDir, docker_image: str | None = None, pull: str = "missing",
                 timeout: float = BUILD_TIMEOUT_SEC, network: str = "none") -> str:
    """The image a trial of `task` runs in, built when missing (one build per environment
    hash at a time, across processes). `pull` (never | missing | always) is podman's policy for
    base images and a prebuilt `docker_image`; `timeout` bounds the build or the pull (the
    task's build_timeout_sec); `network` (none | public) is what the Dockerfile's RUN lines
    may reach (the recipe's `build_network`)."""
    if DOCKERFILE not in task.files:
        if docker_image and (image_exists(docker_image) if pull == "never" else _pull(docker_image, pull, timeout)):
            return docker_image
        raise ImageBuildError(f"task {task.name!r}: no environment/Dockerfile to build"
                              + (f", and its image {docker_image!r} is not present locally"
                                 f"{'' if pull == 'never' else ' nor could it be pulled'}{LOAD_HINT}"
                                 if docker_image else ""))
    tag = f"{IMAGE_REPO}:{environment_hash(task)[:24]}"
    if image_exists(tag):
        return tag
    lock = open_lock(private_dir(LOCK_DIR or runtime_dir() / "podman-builds") / f"{tag.rsplit(':', 1)[1]}.lock")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not image_exists(tag):
            _build(task, tag, pull, timeout, network)
    finally:
        os.close(lock)
    return tag


def _pull(ref: str, pull: str, timeout: float) -> bool:
    if pull == "missing" and image_exists(ref):
        return True
    try:
        return _podman("pull", "-q", ref, check=False, timeout=timeout).returncode == 0
    except subprocess.TimeoutExpired:
        raise ImageBuildError(f"podman pull {ref} ran past {timeout:g}s (the task's build_timeout_sec)") from None


def _build(task: TaskDir, tag: str, pull: str, timeout: float, network: str) -> None:
    with tempfile.TemporaryDirectory(prefix="otbuild-build-") as ctx:
        write_subtree(task, "environment", Path(ctx))
        try:
            r = subprocess.run(["podman", "build", f"--pull={pull}", "--layers", "--quiet", "-t", tag,
                                *(["--network=none"] if network == "none" else []),
                                "--build-arg", f"{BUILD_OWNER_ARG}={owner()}",
                                "-f", str(Path(ctx) / "Dockerfile"), ctx],
                               capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise ImageBuildError(f"task {task.name!r}: podman build ran past {timeout:g}s "
                                  "(its [environment] build_timeout_sec)") from None
    if r.returncode != 0:
        missing = ("image not known" in r.stderr or "pull policy" in r.stderr
                   or "initializing source" in r.stderr or "short-name" in r.stderr)
        hint = f"; a base image is missing{LOAD_HINT}" if missing else ""
        if network == "none":
            hint += "; its RUN lines had no network (a recipe lets them fetch with build_network: public)"
        raise ImageBuildError(f"task {task.name!r}: podman build failed (exit {r.returncode}){hint}:\n"
                              f"{_tail(r.stdout + r.stderr, 3000)}")
    log.info("built %s for task %s", tag, task.name)


def load_images(folder: Path) -> list[tuple[Path, str]]:
    """`podman load` every file in `folder` (docker-archive or OCI tarballs, as `podman save`
    or `docker save` write them, gzipped or not), for clusters no registry reaches: (file,
    the images it held) per file. ContainerError naming the file that is not an image archive."""
    loaded = []
    for path in sorted(p for p in Path(folder).iterdir() if p.is_file()):
        r = _podman("load", "-i", str(path), check=False, timeout=BUILD_TIMEOUT_SEC)
        if r.returncode != 0:
            raise ContainerError(f"{path}: not a docker-archive or OCI image tarball podman can load: "
                                 f"{_tail(r.stderr, 1000)}")
        names = [ln.split(":", 1)[1].strip() for ln in r.stdout.splitlines() if ln.startswith("Loaded image")]
        loaded.append((path, ", ".join(names)))
    return loaded


# -- containers of dead builds --------------------------------------------------------------
def leaked_containers() -> list[str]:
    """Trial containers on this host whose owner (the job that ran the trial: a build killed
    with kill -9, a lost job) is gone: nothing will ever close them."""
    if shutil.which("podman") is None:
        return []
    r = _podman("ps", "-a", "--filter", f"label={OWNER_LABEL}", "--format",
                f'{{{{.ID}}}} {{{{index .Labels "{OWNER_LABEL}"}}}}', check=False)
    return [cid for cid, _, label in (ln.partition(" ") for ln in r.stdout.splitlines()) if owner_is_gone(label)]


def remove_leaked_containers() -> int:
    """Remove the trial containers of dead builds (their processes, exec sessions and conmon
    go with them); the number removed."""
    leaked = leaked_containers()
    if leaked:
        _podman("rm", "-f", "-t", "0", *leaked, check=False, timeout=300)
    return len(leaked)


def leaked_build_containers() -> dict[str, str]:
    """The working containers that killed image builds left (`podman build` killed with its
    job: buildah's `NAME-working-container`s, seen only by `podman ps --external`), each with
    the image it was made from: those whose build arg BUILD_OWNER_ARG names a process of this
    host that is gone. Another tool's builds and containers are never among them."""
    if shutil.which("podman") is None:
        return {}
    r = _podman("ps", "-a", "--external", "--no-trunc", "--format", "{{.ID}} {{.State}}", check=False)
    ids = [cid for cid, _, state in (ln.partition(" ") for ln in r.stdout.splitlines()) if state.lower() == "storage"]
    if not ids:
        return {}
    store = _podman("info", "--format", "{{.Store.GraphRoot}} {{.Store.GraphDriverName}}", check=False).stdout.split()
    if len(store) != 2:
        return {}
    leaked = {}
    for cid in ids:
        try:
            builder = json.loads((Path(store[0]) / f"{store[1]}-containers" / cid / "userdata" / "buildah.json")
                                 .read_text())
        except (OSError, ValueError):
            continue  # not a buildah working container, or not one we may read
        label = (builder.get("Args") or {}).get(BUILD_OWNER_ARG)
        if label and owner_is_gone(label):
            leaked[cid] = builder.get("image-id") or ""
    return leaked


def remove_leaked_builds() -> int:
    """Remove what killed image builds left: their working containers, then the intermediate
    images those were made from (untagged ones no other container or image uses; podman keeps
    the others); the number of containers removed."""
    leaked = leaked_build_containers()
    if leaked:
        _podman("rm", "-f", *leaked, check=False, timeout=300)
        for image in {i for i in leaked.values() if i}:
            r = _podman("image", "inspect", "--format", "{{len .RepoTags}}", image, check=False)
            if r.returncode == 0 and r.stdout.strip() == "0":  # an intermediate image, never a base
                _podman("rmi", image, check=False, timeout=300)
    return len(leaked)


# -- the trial ------------------------------------------------------------------------------
class PodmanSandbox(Sandbox):
    """A trial in its own container. Same interface and guarantees as the bwrap sandbox."""

    def __init__(self, task: TaskDir, root: Path, image: str, limits: Limits, *, cpus: float,
                 networks: TrialNetworks, with_solution: bool, cleanup: bool):
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
            _podman("run", "-d", "--init", "--name", self.container, f"--network={self.network}",
                    "--hostname", "sandbox",
                    f"--memory={mb}m", f"--memory-swap={mb}m", f"--pids-limit={limits.max_processes}",
                    f"--cpus={cpus:g}", "--ulimit", f"cpu={limits.cpu_seconds}:{limits.cpu_seconds}",
                    "--ulimit", f"fsize={fsize}:{fsize}", "--ulimit", "core=0:0", *_base_ulimits(),
                    "--label", f"otbuild.trial={root}", "--label", f"{OWNER_LABEL}={owner()}", *mounts,
                    *storage_opt(image, limits.storage_mb), "--entrypoint", "sleep", image, "infinity",
                    timeout=300, cwd=root)  # conmon's cwd: it writes an `oom` file there on an OOM kill
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

    def _command_argv(self, command: list[str], *, with_tests: bool, cwd: str | None,
                      env: dict[str, str] | None, tty: bool) -> list[str]:
        env_args = [a for k, v in self.env(env).items() for a in ("--env", f"{k}={v}")]
        return ["podman", "exec", "-i", *(["-t"] if tty else []),
                "--env", f"{MARKER}={secrets.token_hex(8)}", *env_args,
                "--workdir", cwd or self.workdir, self.container, *command]

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
            raise ContainerError(f"container {self.container}: the {phase} phase needs network {network!r}, "
                                 f"but it is attached to {sorted(attached)}")
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
    for conf in (os.environ.get("CONTAINERS_CONF"), "/etc/containers/containers.conf",
                 "/usr/share/containers/containers.conf"):
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


def open_podman(task: TaskDir, root: Path, limits: Limits, *, with_solution: bool,
                cleanup: bool) -> PodmanSandbox:
    """Build (or reuse) the task's image and start its trial container in `root`: the task's cpus
    up to the recipe's `limits.cpus`, its build time up to BUILD_TIMEOUT_SEC.
    NetworkPolicyError, before anything is built, for a network policy podman cannot enforce."""
    config = task_config(task)
    networks = trial_networks(task.name, config, limits.network)
    env = config.environment
    image = ensure_image(task, env.docker_image, limits.pull, min(env.build_timeout_sec, BUILD_TIMEOUT_SEC),
                         limits.build_network)
    host = float(os.cpu_count() or 1)
    cpus = min(float(env.cpus or 1), host if limits.tasks_may_raise else min(limits.cpus or host, host))
    return PodmanSandbox(task, root, image, limits, cpus=cpus, networks=networks, with_solution=with_solution,
                         cleanup=cleanup)


@dataclass(frozen=True)
class TrialNetworks:
    """The podman network of each phase of a trial: a network's name, or `none`."""

    agent: str
    verifier: str

    @property
    def started_on(self) -> str:
        """The container starts on the network a phase needs (a phase without one is then
        disconnected), or none when no phase needs one."""
        return self.agent if self.agent != "none" else self.verifier


def trial_networks(task: str, config: TaskConfig, network: str = "task") -> TrialNetworks:
    """The networks of a trial of `task` with this TaskConfig, under the recipe's
    `limits.network` (`none`: every phase offline). `public`: `OTBUILD_PODMAN_NETWORK` or
    podman's default network; `no-network` (or an allowlist of no hosts): none; an allowlist
    of hosts: NetworkPolicyError naming the task, the phase and the hosts."""
    if network == "none":
        return TrialNetworks("none", "none")
    public = os.environ.get("OTBUILD_PODMAN_NETWORK", "podman")

    def one(policy: NetworkPolicy, phase: str) -> str:
        if policy.offline:
            return "none"
        if policy.mode == PUBLIC:
            return public
        raise NetworkPolicyError(
            f"task {task!r}: its {phase} may reach only {', '.join(policy.allowed_hosts)} (network_mode = "
            "\"allowlist\"); a podman trial cannot enforce an allowlist and never widens it to the whole "
            "internet. Run it through Harbor on an environment that enforces allowlists (sandbox: harbor), "
            "or offline (limits.network: none)")

    return TrialNetworks(one(config.agent_network, "agent"), one(config.verifier_network, "verifier"))
