"""otbuild's local sandbox as a Harbor environment: no container, no Docker daemon.

    harbor run -p tasks/ -a oracle -e otbuild.harbor.environment:OtbuildEnvironment
    # job config:  environment: {import_path: "otbuild.harbor.environment:OtbuildEnvironment"}

Each Harbor environment is one otbuild sandbox (`otbuild.sandbox.open_sandbox`): bubblewrap
(or the unshare fallback), no network, a private filesystem holding the task's environment/
files where its Dockerfile's COPY/WORKDIR lines put them, the host's /usr read-only as the
"image". One long-lived command server (`_execserver.py`) runs inside it, so processes a
command leaves behind (terminus-2's tmux server, a service the task starts) live on between
`exec` calls as they would in a container, until the verifier: when Harbor uploads a verifier's
tests, every process of the trial is killed with the server (its pid namespace, daemons that
left their session by `setsid` or `nohup` included), `/logs/verifier` and `/tests` are emptied
without following a link the agent put there, and a new server runs the verifier's commands.

What it cannot honour, it refuses before starting (an `EnvironmentDefinitionError` naming the
task and why): a Dockerfile a local sandbox cannot run without building its image (the one
policy, `otbuild.tasks.dockerfile.local_problems`: RUN lines, packages the host may lack; ADD;
COPY --from; paths under /usr, /etc, ...), a docker-compose file, a prebuilt `docker_image`
without a Dockerfile. Pass `--ek allow_run=true` to run such a task anyway on the host's tools:
the build and run steps (RUN, CMD, ...) are left out, what the layout cannot place still refuses.

Differences from Docker, by design: every command runs as the trial's one user (`user=` is
ignored; root is not available), the network is always off (a task asking for internet gets
none; a warning says so), files can be uploaded under the task's own top-level dirs, /tmp,
/root, /logs, /tests and /solution only. /tests and /solution are read-only inside and empty
until Harbor uploads them (the verifier, the oracle), so an agent never sees either. A service
the agent started is not running when the verifier runs (a task whose tests reach it fails here
and passes under Docker), as under otbuild's own harness.

Installed agents (Harbor's adapters that run their CLI inside the environment: mini-swe-agent)
get two things and nothing more: `agent_dir`, a venv otbuild's set-up made (scripts/agents-env.sh),
bound read-only at /opt/otbuild-agent with its `sandbox-bin/` on PATH; and with `model_proxy` (a
capture proxy's control socket) their model on 127.0.0.1:`model_port` inside, relayed by the
command server to a unix socket the proxy opens for this trial alone (its calls are the trial's:
the proxy's scope is the trial's name). The sandbox's network stays off: that socket is its one
way out, and the proxy, not the sandbox, holds the model's key. The verifier has neither.

Only the standard library, Harbor, `otbuild.sandbox` and `otbuild.capture.control` are imported: `pip install --no-deps
-e .` into Harbor's environment is enough (scripts/harbor-env.sh).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import secrets
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any, cast

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.models.task.config import NetworkMode

from otbuild.capture.control import SANDBOX_MODEL_PORT as MODEL_PORT
from otbuild.capture.control import control_request
from otbuild.rundir import private_dir, runtime_dir
from otbuild.sandbox import Limits, Sandbox, open_sandbox, safefs
from otbuild.sandbox.layout import Layout, LayoutError, plan
from otbuild.sandbox.sandbox import reset_verifier
from otbuild.tasks.dockerfile import local_problems
from otbuild.tasks.taskdir import TaskDir

ENV_TYPE = "otbuild"
IMPORT_PATH = "otbuild.harbor.environment:OtbuildEnvironment"
SERVER_SOURCE = (Path(__file__).with_name("_execserver.py")).read_text()
PYTHON = "/usr/bin/python3"
AGENT_MOUNT = "/opt/otbuild-agent"  # an installed agent's venv (agent_dir), read-only
MODEL_SOCKET = "/run/otbuild/model.sock"
LOOPBACK = {"127.0.0.1", "localhost", "::1"}  # the capture proxy's socket for this trial
_BOOL = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


class EnvironmentDefinitionError(RuntimeError):
    """The task's environment cannot be provided by a local sandbox (the message says why)."""


class OtbuildEnvironment(BaseEnvironment):
    """A Harbor environment on otbuild's local sandbox (see the module docstring).

    Kwargs (`--ek KEY=VALUE` or `environment.kwargs`): `backend` (bwrap | unshare | none),
    `allow_run` (run a Dockerfile with RUN lines anyway, without them), `workdir` (where trial roots go;
    default: a temp dir), `memory_mb`, `max_processes`, `wall_seconds` (whole-environment
    limit; default: long enough for Harbor's own timeouts to act first), `keep` (keep the
    trial root after stop), `agent_dir` (an installed agent's venv, bound at /opt/otbuild-agent),
    `model_proxy` (a capture proxy's control socket: the model on 127.0.0.1:`model_port`).
    """

    def __init__(
        self,
        *args,
        backend: str = "bwrap",
        allow_run: Any = False,
        workdir: str | None = None,
        memory_mb: Any = None,
        max_processes: Any = None,
        wall_seconds: Any = None,
        keep: Any = False,
        agent_dir: str | None = None,
        model_proxy: str | None = None,
        model_port: Any = MODEL_PORT,
        **kwargs,
    ):
        self._agent_dir = Path(agent_dir).resolve() if agent_dir else None
        self._model_proxy = model_proxy
        self._model_port = int(model_port)
        self._model_socket: Path | None = None  # this trial's socket on the host, while open
        self._backend = str(backend)
        self._allow_run = _as_bool(allow_run)
        self._workdir_opt = workdir
        self._memory_mb, self._max_processes = memory_mb, max_processes
        self._wall_seconds, self._keep = wall_seconds, _as_bool(keep)
        self._box: Sandbox | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._ids = itertools.count(1)
        self._reader: asyncio.Task | None = None
        self._stderr_tail = b""
        self._task: TaskDir | None = None
        self._layout: Layout | None = None
        self._problem: EnvironmentDefinitionError | None = None
        self._agent_ran = False  # a command ran since the last fresh server (_fresh_for_verifier)
        super().__init__(*args, **kwargs)

    # -- Harbor's interface -------------------------------------------------------------
    @staticmethod
    def type() -> str:
        return ENV_TYPE

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        # an allowlist is taken (Harbor lists the model's host for an installed agent: 127.0.0.1,
        # where the relay to its trial's proxy socket listens); no host beyond the sandbox's own
        # loopback is ever reached (_validate_network_policy_support refuses any other host)
        return EnvironmentCapabilities(
            disable_internet=True,
            network_allowlist=True,
            network_allowlist_hostnames=True,
            network_allowlist_ipv4_addresses=True,
            network_allowlist_ipv6_addresses=True,
        )

    def _validate_definition(self):
        """Harbor calls this while building the trial, where an error aborts the whole job;
        the problem is kept and raised by `start()`, so it is recorded on this trial alone."""
        self._problem = None
        try:
            self._check_definition()
        except EnvironmentDefinitionError as e:
            self._problem = e

    def _check_definition(self) -> None:
        task_dir = Path(self.environment_dir).parent
        name = task_dir.name
        env_dir = Path(self.environment_dir)
        for compose in ("docker-compose.yaml", "docker-compose.yml", "compose.yaml"):
            if (env_dir / compose).exists():
                raise EnvironmentDefinitionError(
                    f"task {name!r}: environment/{compose} needs Docker Compose; the otbuild "
                    "environment runs a single local sandbox (use -e docker)"
                )
        dockerfile = env_dir / "Dockerfile"
        if not dockerfile.exists() and self.task_env_config.docker_image and not self._allow_run:
            raise EnvironmentDefinitionError(
                f"task {name!r} runs in the prebuilt image {self.task_env_config.docker_image!r};"
                " the otbuild environment has no images (use -e docker, or --ek allow_run=true"
                " to run it on the host's tools)"
            )
        if dockerfile.exists():
            problems = local_problems(dockerfile.read_text(errors="replace"))
            skippable = all(p.skippable for p in problems)  # allow_run leaves them out
            if problems and not (self._allow_run and skippable):
                hint = ", or --ek allow_run=true to run it on the host's tools without them"
                raise EnvironmentDefinitionError(
                    f"task {name!r}: a local sandbox cannot run its Dockerfile without building "
                    f"the image: {'; '.join(map(str, problems[:3]))}"
                    f"{'; ...' if len(problems) > 3 else ''}. Use -e docker{hint if skippable else ''}"
                )
        try:
            self._task = TaskDir.from_dir(task_dir)
            self._layout = plan(self._task)
        except LayoutError as e:  # names the task
            raise EnvironmentDefinitionError(str(e)) from e
        except ValueError as e:
            raise EnvironmentDefinitionError(f"task {name!r}: {e}") from e

    def _validate_network_policy_support(self):
        super()._validate_network_policy_support()
        for each in [self.network_policy, *self._phase_network_policies]:
            far = set(each.allowed_hosts) - LOOPBACK
            if each.network_mode == NetworkMode.ALLOWLIST and far:  # refused, as before: never narrowed to none
                raise ValueError(
                    f"network_mode='allowlist' with {', '.join(sorted(far))} is not supported by the otbuild "
                    "environment: its sandbox reaches its own loopback (127.0.0.1) only"
                )
        policy = self.network_policy
        if policy.network_mode == NetworkMode.ALLOWLIST:
            return  # the sandbox's own loopback: what it has
        if policy.network_mode != NetworkMode.NO_NETWORK:
            self.logger.warning(
                "otbuild environment: task %s asks for network mode %r; the sandbox has no network",
                self.environment_name,
                self.network_policy.network_mode.value,
            )

    async def start(self, force_build: bool) -> None:
        if self._problem is not None:
            raise self._problem
        await asyncio.to_thread(self._open)
        box = self._box
        assert box is not None  # _open made it
        await self._start_server(forward=self._model_socket is not None)
        # Harbor's log dirs, as a container image with them mounted would have them.
        for d in ("logs/agent", "logs/verifier", "logs/artifacts"):
            with safefs.opened_dir(box.root, d, create=True, owner=box.owner) as fd:
                if box.owner is not None:
                    os.fchown(fd, *box.owner)

    async def stop(self, delete: bool):
        box = self._box
        self._box = None
        await self._stop_server(box)
        await asyncio.to_thread(self._close_model_socket)
        if box is not None:
            await asyncio.to_thread(box.close)
            if delete and not self._keep:
                with contextlib.suppress(OSError):
                    await asyncio.to_thread(safefs.remove_path, box.root)

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        if self._proc is None or self._proc.returncode is not None:
            raise RuntimeError(
                f"otbuild environment {self.environment_name} is not running"
                + (f": {self._stderr_tail.decode(errors='replace')[-500:]}" if self._stderr_tail else "")
            )
        assert self._box is not None and self._layout is not None  # running: start() opened the box
        self._agent_ran = True  # until the verifier's tests arrive, a command may be the agent's
        rid = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        request = {
            "id": rid,
            "cmd": command,
            "cwd": cwd or self._layout.workdir,
            "env": self._merge_env(env) or {},
            "timeout": timeout_sec,
            "cap": self._box.limits.output_bytes,
        }
        try:
            self._send(request)
            reply = await fut
        except asyncio.CancelledError:  # Harbor's own timeout: end the command too
            self._pending.pop(rid, None)
            self._send({"kill": rid}, quiet=True)
            raise
        if reply["timed_out"]:
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds")
        return ExecResult(stdout=reply["stdout"] or None, stderr=reply["stderr"] or None, return_code=reply["rc"])

    async def upload_file(self, source_path: Path | str, target_path: str):
        await self._upload(Path(source_path), target_path)

    async def upload_dir(self, source_dir: Path | str, target_dir: str):
        await self._upload(Path(source_dir), target_dir)

    async def download_file(self, source_path: str, target_path: Path | str):
        await asyncio.to_thread(safefs.copy_out, self._root(), self._rel(source_path), Path(target_path))

    async def download_dir(self, source_dir: str, target_dir: Path | str):
        await asyncio.to_thread(safefs.copy_out, self._root(), self._rel(source_dir), Path(target_dir))

    # -- internals ----------------------------------------------------------------------
    async def _start_server(self, forward: bool = False) -> None:
        """The command server, in a new sandbox process (its own pid namespace); `forward`: it
        relays 127.0.0.1:model_port to the trial's model socket."""
        box = self._box
        assert box is not None  # _open made it
        command = [PYTHON, "-I", "-u", "-c", SERVER_SOURCE]
        if forward:
            command += ["--forward", str(self._model_port), MODEL_SOCKET]
        env = None
        if self._agent_dir:  # its CLI on PATH; litellm's cost map from its own copy (no network to fetch it)
            env = {"PATH": f"{AGENT_MOUNT}/sandbox-bin:{box.env()['PATH']}", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        argv = box.argv(command, with_tests=True, env=env)
        # with_tests binds root/tests at /tests (read-only) and copies the task's tests in:
        # empty it again, so the agent sees nothing there until the verifier uploads them.
        safefs.clear(box.root, "tests")
        self._stderr_tail = b""
        self._proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            cwd=box.root,
            limit=1 << 30,
        )
        stdout, stderr = cast(asyncio.StreamReader, self._proc.stdout), cast(asyncio.StreamReader, self._proc.stderr)
        first = await asyncio.wait_for(stdout.readline(), 60)  # both pipes, as started
        if not first.startswith(b'{"ready"'):
            err = await stderr.read()
            await self.stop(delete=True)
            raise RuntimeError(
                f"otbuild sandbox did not start for {self.environment_name}: "
                f"{(first + err).decode(errors='replace')[-2000:]}"
            )
        self._reader = asyncio.create_task(self._read_replies())
        asyncio.create_task(self._drain_stderr())

    async def _stop_server(self, box: Sandbox | None) -> None:
        """End the command server and every process of the trial (`kill_all`: its pid
        namespace, what left it by `setsid` or `nohup` included)."""
        proc, reader = self._proc, self._reader
        self._proc = self._reader = None
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(Exception):
                cast(asyncio.StreamWriter, proc.stdin).close()  # the server ends when its stdin does (a pipe)
        if box is not None:
            await asyncio.to_thread(box.kill_all)
        if proc is not None:
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader  # its own end fails what it left pending, never the next server's
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(RuntimeError("otbuild environment stopped"))
        self._pending.clear()

    async def _fresh_for_verifier(self) -> None:
        """Harbor's verifier begins (its tests are uploaded after a command ran): every process
        the agent left (a `nohup ... &` daemon, a `setsid` child, a tmux server) is killed with
        the server, `logs/verifier/` and `tests/` are emptied without following a link the agent
        put there (`safefs`), and a new server runs the verifier's commands. As otbuild's own
        harness does: nothing of the agent's rewrites the reward after the verifier writes it."""
        box = self._box
        if box is None:
            raise RuntimeError(f"otbuild environment {self.environment_name} is not running")
        await self._stop_server(box)

        def reset() -> None:
            reset_verifier(box.root, box.owner)
            safefs.clear(box.root, "tests")
            self._close_model_socket()  # the verifier asks no model

        await asyncio.to_thread(reset)
        await self._start_server()
        self._agent_ran = False

    def _open(self) -> None:
        limits = _limits(self._memory_mb, self._max_processes, self._wall_seconds)
        workdir = (
            Path(self._workdir_opt)
            if self._workdir_opt
            else private_dir(Path(tempfile.gettempdir()) / f"otbuild-harbor-{os.geteuid()}")
        )
        assert self._task is not None  # _check_definition read it (else start raised its problem)
        box = self._box = open_sandbox(self._task, workdir, backend=self._backend, limits=limits, with_solution=True)
        safefs.clear(box.root, "solution")  # the oracle uploads it; other agents see nothing
        if self._agent_dir is not None:
            box.bind_ro(self._agent_dir, AGENT_MOUNT)
        if self._model_proxy:  # this trial's socket: in a private dir of the host, never in its root
            # a short path (a socket's has 107 bytes at most)
            sock = private_dir(runtime_dir() / "model") / f"{secrets.token_hex(8)}.sock"
            scope = self.trial_paths.trial_dir.name  # Harbor's trial dir: calls and trace rows meet there
            self._model_socket = Path(control_request(self._model_proxy, "open", scope, sock))
            box.bind_ro(self._model_socket, MODEL_SOCKET)

    def _close_model_socket(self) -> None:
        """The trial's model socket is gone, and so is its bind (a later server's start would
        find no socket to bind)."""
        sock, self._model_socket = self._model_socket, None
        if sock is None:
            return
        if self._box is not None:
            self._box.binds = [m for m in self._box.binds if m.dest != MODEL_SOCKET]
        with contextlib.suppress(OSError, RuntimeError):
            control_request(str(self._model_proxy), "close", "", sock)

    def _send(self, obj: dict, quiet: bool = False) -> None:
        try:
            self._proc.stdin.write((json.dumps(obj) + "\n").encode())  # type: ignore[union-attr]  # None: below
        except (AttributeError, ConnectionError, RuntimeError):
            if not quiet:
                raise RuntimeError(f"otbuild environment {self.environment_name}: the sandbox ended") from None

    async def _read_replies(self) -> None:
        try:
            while True:
                line = await self._proc.stdout.readline()  # type: ignore[union-attr]  # set before this task starts
                if not line:
                    break
                reply = json.loads(line)
                fut = self._pending.pop(reply.get("id"), None)
                if fut is not None and not fut.done():
                    fut.set_result(reply)
        finally:
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(
                        RuntimeError(
                            f"otbuild sandbox for {self.environment_name} ended: "
                            f"{self._stderr_tail.decode(errors='replace')[-500:]}"
                        )
                    )

    async def _drain_stderr(self) -> None:
        proc = self._proc
        while proc is not None:
            chunk = await cast(asyncio.StreamReader, proc.stderr).read(65536)  # a pipe, as started
            if not chunk:
                return
            self._stderr_tail = (self._stderr_tail + chunk)[-4096:]

    def _root(self) -> Path:
        if self._box is None:
            raise RuntimeError(f"otbuild environment {self.environment_name} is not running")
        return self._box.root

    def _rel(self, path: str) -> str:
        """Sandbox path `path` relative to the trial root (inside it, never outside)."""
        assert self._layout is not None  # planned before the box was opened
        p = PurePosixPath(path if str(path).startswith("/") else f"{self._layout.workdir}/{path}")
        return "/".join(safefs.parts(p))

    async def _upload(self, src: Path, target: str) -> None:
        """Harbor's file or folder copied in (through no link the trial made: `safefs`), as the
        trial's uid's, under the sandbox's own dirs only."""
        assert self._layout is not None  # _check_definition planned it
        tops = self._layout.tops() | {"tests", "solution"}
        rel = self._rel(target)
        if not rel or rel.split("/")[0] not in tops:
            raise RuntimeError(
                f"otbuild environment: cannot place files at {target}: the sandbox's own dirs are "
                f"/{', /'.join(sorted(tops))} (the rest of / is the host's, read-only)"
            )
        if rel.split("/")[0] == "tests" and self._agent_ran:  # the verifier's tests: its phase begins
            await self._fresh_for_verifier()
        root = self._root()
        owner = self._box.owner if self._box is not None else None
        await asyncio.to_thread(safefs.copy_in, src, root, rel, owner=owner)


def _as_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    try:
        return _BOOL[str(v).strip().lower()]
    except KeyError:
        raise ValueError(f"expected a boolean, got {v!r}") from None


def _limits(memory_mb, max_processes, wall_seconds) -> Limits:
    """Per-process memory (RLIMIT_AS) of `memory_mb` (the environment's kwarg), else otbuild's
    default: a ceiling the task's own memory_mb never raises (otbuild.sandbox.task_limits); and
    a wall clock Harbor's timeouts fit under."""
    mem = int(memory_mb) if memory_mb is not None else Limits().memory_mb
    return Limits(
        memory_mb=mem,
        max_processes=int(max_processes or 512),
        cpu_seconds=24 * 3600,
        wall_seconds=float(wall_seconds) if wall_seconds is not None else 24 * 3600.0,
    )
