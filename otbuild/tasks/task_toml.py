"""A task's `task.toml`, read once into one typed model (`TaskConfig`) that follows Harbor's own
(harbor 0.26, `harbor/models/task/config.py`): its fields, its defaults and its network policy;
its metadata; and whether a local sandbox can run the task without its image
(`runnable_locally`; the Dockerfile's part is `dockerfile.local_problems`).

Harbor's defaults: the agent has no time limit unless `[agent] timeout_sec` says one (the
harness still caps it: otbuild/harness/config.py), the verifier 600 s, the image build 600 s;
the network is `public` unless `[environment] network_mode` says `no-network` or `allowlist`
(with `allowed_hosts`), `allow_internet` being its deprecated form; `[agent]` and `[verifier]`
may override the environment's policy for their phase (`TaskConfig.agent_network`,
`TaskConfig.verifier_network`).

Standard library only: the sandbox, and Harbor's environment class in its own Python, import it.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from ipaddress import ip_address, ip_network
from typing import Any, NoReturn, cast

from otbuild.tasks.dockerfile import local_problems
from otbuild.tasks.taskdir import DOCKERFILE, TASK_TOML, TaskDir, TaskFormatError

SETUP_SCRIPT = "environment/setup.sh"

NO_NETWORK, PUBLIC, ALLOWLIST = "no-network", "public", "allowlist"
NETWORK_MODES = (NO_NETWORK, ALLOWLIST, PUBLIC)  # narrowest first
DEFAULT_VERIFIER_TIMEOUT_SEC = 600.0
DEFAULT_BUILD_TIMEOUT_SEC = 600.0
_HOST_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
_ENV_TEMPLATE = re.compile(r"\$\{([^}:]+)(?::-(.*))?\}")


@dataclass(frozen=True)
class NetworkPolicy:
    """What one phase may reach: `public` (the internet), `no-network`, or `allowlist` (only
    `allowed_hosts`: hostnames, `*.suffix` wildcards, IP addresses or CIDR ranges, normalised
    as Harbor does). An allowlist without hosts reaches nothing."""

    mode: str = PUBLIC
    allowed_hosts: tuple[str, ...] = ()

    @property
    def offline(self) -> bool:
        return self.mode == NO_NETWORK or (self.mode == ALLOWLIST and not self.allowed_hosts)

    def describe(self) -> str:
        return f"{self.mode} ({', '.join(self.allowed_hosts)})" if self.allowed_hosts else self.mode


@dataclass(frozen=True)
class AgentConfig:
    timeout_sec: float | None = None  # None: no limit of the task's own
    network: NetworkPolicy | None = None  # an override of the environment's policy for the agent


@dataclass(frozen=True)
class VerifierConfig:
    timeout_sec: float = DEFAULT_VERIFIER_TIMEOUT_SEC
    env: dict[str, str] = field(default_factory=dict)  # `${VAR}` / `${VAR:-default}`: `resolve_env`
    network: NetworkPolicy | None = None  # an override of the environment's policy for the verifier


@dataclass(frozen=True)
class EnvironmentConfig:
    build_timeout_sec: float = DEFAULT_BUILD_TIMEOUT_SEC
    docker_image: str | None = None
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    network: NetworkPolicy = NetworkPolicy()
    env: dict[str, str] = field(default_factory=dict)  # every phase's processes (as `[verifier].env`'s templates)


MEAN, FINAL = "mean", "final"  # multi_step_reward_strategy
_STEP_NAME_BAD = re.compile(r'[<>:"/\\|?*\x00-\x1f\x7f]')


@dataclass(frozen=True)
class StepConfig:
    """One `[[steps]]` entry: its agent's and its verifier's settings (as Harbor, a step's
    verifier has its own timeout, 600 s unless set; its agent the task's unless set) and
    `min_reward`, below which the remaining steps are not run."""

    name: str
    agent: AgentConfig = AgentConfig()
    verifier: VerifierConfig = VerifierConfig()
    min_reward: float | dict[str, float] | None = None


@dataclass(frozen=True)
class TaskConfig:
    """`task.toml` as Harbor reads it (the fields otbuild uses; the others are kept in `toml`)."""

    metadata: dict[str, Any] = field(default_factory=dict)
    agent: AgentConfig = AgentConfig()
    verifier: VerifierConfig = VerifierConfig()
    environment: EnvironmentConfig = EnvironmentConfig()
    solution_env: dict[str, str] = field(default_factory=dict)  # `[solution].env`: the reference solution's
    steps: tuple[StepConfig, ...] = ()  # a multi-step task's, in order (none: one step, the task itself)
    multi_step_reward_strategy: str = MEAN  # the trial's reward from its steps': MEAN or FINAL
    toml: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)  # as written

    @property
    def agent_network(self) -> NetworkPolicy:
        """The agent phase's policy: `[agent]`'s own, else the environment's."""
        return self.agent.network or self.environment.network

    @property
    def verifier_network(self) -> NetworkPolicy:
        """The verifier phase's policy (it shares the agent's environment): `[verifier]`'s own,
        else the environment's (never the agent's override)."""
        return self.verifier.network or self.environment.network

    @classmethod
    def from_toml(cls, data: dict, task: str = "?") -> TaskConfig:
        """The model of a parsed `task.toml`; TaskFormatError naming `task` and the key when a
        value has the wrong type or is not one Harbor accepts."""
        return _Reader(task).config(data)


def parse_task_toml(task: TaskDir) -> TaskConfig:
    """The task's `task.toml` as a TaskConfig; TaskFormatError when it is not TOML or has a
    value of the wrong type."""
    try:
        data = tomllib.loads(task.files[TASK_TOML].data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise TaskFormatError(f"task {task.name!r}: {e}") from e
    return TaskConfig.from_toml(data, task.name)


def task_config(task: TaskDir) -> TaskConfig:
    """The task's TaskConfig; Harbor's defaults for a task without `task.toml`."""
    return parse_task_toml(task) if TASK_TOML in task.files else TaskConfig()


def resolve_env(env: dict[str, str], environ: Mapping[str, str], table: str = "[verifier].env") -> dict[str, str]:
    """An env table of task.toml (`table`) as Harbor passes it: a value that is exactly `${VAR}`
    or `${VAR:-default}` takes the host's VAR (else the default); KeyError naming the table and
    VAR when the host has none and there is no default."""
    out = {}
    for key, value in env.items():
        m = _ENV_TEMPLATE.fullmatch(value)
        if m is None:
            out[key] = value
        elif m[1] in environ:
            out[key] = environ[m[1]]
        elif m[2] is not None:
            out[key] = m[2]
        else:
            raise KeyError(f"{table} {key}: the host has no {m[1]} and no default is given")
    return out


def refused_host_env(config: TaskConfig, allowed: Collection[str]) -> list[str]:
    """`TABLE KEY: VAR` for each `${VAR}` of the task's env tables (`[environment]`, `[solution]`,
    `[verifier]`, each step's `[verifier]`) whose VAR is not in `allowed` (the recipe's
    `host_env`): a task names a host variable only the recipe may hand it, defaults or not."""
    tables = [
        ("[environment].env", config.environment.env),
        ("[solution].env", config.solution_env),
        ("[verifier].env", config.verifier.env),
    ]
    tables += [(f"[steps.{s.name}.verifier].env", s.verifier.env) for s in config.steps]
    return [
        f"{table} {key}: {m[1]}"
        for table, env in tables
        for key, value in env.items()
        if (m := _ENV_TEMPLATE.fullmatch(value)) and m[1] not in allowed
    ]


def host_env_refusal(task_name: str, config: TaskConfig, allowed: Collection[str]) -> str | None:
    """Why the task is not run (`HostEnvNotAllowed`'s message), where its task.toml asks for a host
    variable `allowed` (the recipe's `host_env`) does not name; None when it asks for none other."""
    if refused := refused_host_env(config, allowed):
        return (
            f"task {task_name!r}: task.toml asks for host variables the recipe does not allow "
            f"({'; '.join(refused)}); name them in the recipe's host_env to hand them to tasks"
        )
    return None


def task_metadata(config: TaskConfig) -> dict:
    """The `[metadata]` table plus agent/verifier timeouts and docker_image where task.toml
    sets them (as written)."""
    meta = dict(config.metadata)
    for key, (table, name) in (
        ("agent_timeout_sec", ("agent", "timeout_sec")),
        ("verifier_timeout_sec", ("verifier", "timeout_sec")),
        ("docker_image", ("environment", "docker_image")),
    ):
        value = config.toml.get(table, {}).get(name)
        if value is not None:
            meta[key] = value
    return meta


# task.toml keys Harbor runs and otbuild's harness does not (yet): a task that sets one is
# refused by the harness, naming the key (sandbox: harbor runs it)
HARNESS_UNSUPPORTED = {
    "artifacts": "artifacts to collect after the trial",
    "verifier.collect": "commands that collect files for the verifier ([[verifier.collect]])",
    "verifier.environment": "a separate verifier environment",
    "verifier.environment_mode": 'a separate verifier environment (environment_mode = "separate")',
}
# and, in a `[[steps]]` entry, these (refused as `steps.NAME.KEY`)
STEP_UNSUPPORTED = {
    "artifacts": "artifacts to collect after the step",
    "healthcheck": "a healthcheck before the step's agent",
    "agent.user": "a user of the step's own for its agent",
    "verifier.user": "a user of the step's own for its verifier",
    "verifier.environment": "a separate verifier environment for the step",
    "verifier.environment_mode": "a separate verifier environment for the step",
}


def harness_unsupported(config: TaskConfig) -> list[str]:
    """The keys of HARNESS_UNSUPPORTED that `config`'s task.toml sets (empty tables and
    `environment_mode = "shared"`, Harbor's default, are nothing to refuse)."""
    found = [key for key in HARNESS_UNSUPPORTED if _set(config.toml, key)]
    for step in config.toml.get("steps") or []:
        found += [f"steps.{step['name']}.{key}" for key in STEP_UNSUPPORTED if _set(step, key)]
    return found


def unsupported_reason(key: str) -> str:
    """What a key of `harness_unsupported` is, in words."""
    top, _, rest = key.partition(".")
    return STEP_UNSUPPORTED[rest.partition(".")[2]] if top == "steps" else HARNESS_UNSUPPORTED[key]


def _set(data: dict, key: str) -> bool:
    """Whether dotted `key` holds something in `data` (empty tables and `"shared"`, Harbor's
    default environment mode, hold nothing)."""
    table, _, name = key.rpartition(".")
    value = (data.get(table) if table else data) or {}
    value = value.get(name) if isinstance(value, dict) else None
    return value not in (None, {}, [], "shared")


def runnable_locally(task: TaskDir, config: TaskConfig | None = None) -> bool:
    """True only when the task needs no container image we cannot reproduce locally:

    - `task.toml` has no `[environment] docker_image` (a prebuilt image), and
    - `environment/Dockerfile` is absent or has no `dockerfile.local_problems` (only
      FROM/ARG/LABEL/USER/WORKDIR/ENV/COPY lines a sandbox can lay out; no RUN, ADD, ...), and
    - there is no `environment/setup.sh` (a Terminal-Bench-1 provisioning script).
    """
    config = task_config(task) if config is None else config
    if config.environment.docker_image or SETUP_SCRIPT in task.files:
        return False
    dockerfile = task.text(DOCKERFILE)
    return dockerfile is None or not local_problems(dockerfile)


# -- reading ------------------------------------------------------------------------------
class _Reader:
    """Checks one task.toml's values as Harbor's pydantic models would (numbers are numbers,
    not strings), naming the task and the key of the first bad one."""

    def __init__(self, task: str):
        self.task = task

    def fail(self, key: str, why: str) -> NoReturn:
        raise TaskFormatError(f"task {self.task!r}: {key} {why}")

    def table(self, data: dict, key: str) -> dict:
        value = data.get(key, {})
        if not isinstance(value, dict):
            self.fail(f"[{key}]", "is not a table")
        return value

    def env(self, t: dict, table: str) -> dict[str, str]:
        value = t.get("env", {})
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            self.fail(f"[{table}] env", f"is not a table of strings: {value!r}")
        return dict(value)

    def number(self, t: dict, table: str, key: str, default, *, integer: bool = False, positive: bool = True):
        value = t.get(key)
        if value is None:
            return default
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or (integer and not float(value).is_integer())
        ):
            self.fail(f"[{table}] {key}", f"is not {'an integer' if integer else 'a number'}: {value!r}")
        if positive and not value > 0:
            self.fail(f"[{table}] {key}", f"must be positive: {value!r}")
        return int(value) if integer else value

    def string(self, t: dict, table: str, key: str) -> str | None:
        value = t.get(key)
        if value is not None and not isinstance(value, str):
            self.fail(f"[{table}] {key}", f"is not a string: {value!r}")
        return value

    def size_mb(self, t: dict, table: str, key: str, legacy: str) -> int | None:
        """`memory_mb` / `storage_mb`, or Harbor's deprecated `memory` / `storage` ("2G", "512M")."""
        mb = self.number(t, table, key, None, integer=True)
        old = t.get(legacy)
        if old is None:
            return mb
        m = re.fullmatch(r"\s*([0-9.]+)\s*([GMK])\s*", str(old).upper()) if isinstance(old, str) else None
        if m is None:
            self.fail(f"[{table}] {legacy}", f"is not a size like '2G' or '512M': {old!r}")
        try:
            size = int(float(m[1]) * {"G": 1024, "M": 1, "K": 1 / 1024}[m[2]])
        except ValueError:
            self.fail(f"[{table}] {legacy}", f"is not a size like '2G' or '512M': {old!r}")
        if mb is not None and mb != size:
            self.fail(f"[{table}] {legacy}", f"({old!r}) conflicts with {key} = {mb}")
        return size

    def policy(self, t: dict, table: str, *, baseline: bool) -> NetworkPolicy | None:
        """The table's network policy: explicit `network_mode` (with `allowed_hosts`), else the
        deprecated `allow_internet` (environment only, as Harbor), else public for the
        environment and no override for a phase."""
        mode = self.string(t, table, "network_mode")
        hosts = t.get("allowed_hosts")
        if mode is not None and mode not in NETWORK_MODES:
            self.fail(f"[{table}] network_mode", f"must be one of {', '.join(NETWORK_MODES)}: {mode!r}")
        if hosts is not None:
            if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
                self.fail(f"[{table}] allowed_hosts", f"is not a list of strings: {hosts!r}")
            if mode != ALLOWLIST:
                self.fail(f"[{table}] allowed_hosts", 'is only valid with network_mode = "allowlist"')
            hosts = tuple(self.host(h, table) for h in hosts)
        if mode is not None:
            return NetworkPolicy(mode, hosts or ())
        allow = t.get("allow_internet")
        if allow is not None and not isinstance(allow, bool):
            self.fail(f"[{table}] allow_internet", f"is not true or false: {allow!r}")
        if not baseline:
            return None
        return NetworkPolicy(NO_NETWORK if allow is False else PUBLIC)

    def host(self, host: str, table: str) -> str:
        """An `allowed_hosts` entry normalised as Harbor's `normalize_allowed_hosts`."""
        h = host.strip().lower().rstrip(".")

        def bad():
            self.fail(
                f"[{table}] allowed_hosts",
                f"entry {host!r} is not a hostname, a leading '*.' "
                "wildcard, an IP address or a CIDR range (no URLs, ports or paths)",
            )

        if "/" in h or ":" in h:
            try:
                return (ip_network(h, strict=True) if "/" in h else ip_address(h)).compressed
            except ValueError:
                bad()
        name = h.removeprefix("*.")
        try:
            ip_address(name)
            return h if name == h else bad()
        except ValueError:
            pass
        if not name or not all(_HOST_LABEL.match(label) for label in name.split(".")):
            bad()
        return h

    def agent(self, t: dict, table: str) -> AgentConfig:
        return AgentConfig(self.number(t, table, "timeout_sec", None), self.policy(t, table, baseline=False))

    def verifier(self, t: dict, table: str) -> VerifierConfig:
        return VerifierConfig(
            self.number(t, table, "timeout_sec", DEFAULT_VERIFIER_TIMEOUT_SEC),
            self.env(t, table),
            self.policy(t, table, baseline=False),
        )

    def steps(self, data: dict) -> tuple[StepConfig, ...]:
        """`[[steps]]`: each a table with a portable, unique `name` (as Harbor checks it)."""
        steps = data.get("steps")
        if steps is None:
            return ()
        if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
            self.fail("[[steps]]", "is not an array of tables")
        out, seen = [], set()
        for i, step in enumerate(steps):
            name = step.get("name")
            if (
                not isinstance(name, str)
                or not name.strip()
                or name in (".", "..")
                or name.endswith((".", " "))
                or _STEP_NAME_BAD.search(name)
            ):
                self.fail(f"[[steps]] {i + 1} name", f"is not a portable directory name: {name!r}")
            if name.casefold() in seen:
                self.fail(f"[[steps]] {i + 1} name", f"repeats an earlier step's: {name!r}")
            seen.add(name.casefold())
            where = f"steps.{name}"
            min_reward = step.get("min_reward")
            if min_reward is not None and not (
                isinstance(min_reward, (int, float))
                and not isinstance(min_reward, bool)
                or isinstance(min_reward, dict)
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in min_reward.values())
            ):
                self.fail(f"[{where}] min_reward", f"is not a number or a table of numbers: {min_reward!r}")
            out.append(
                StepConfig(
                    name,
                    self.agent(self.table(step, "agent"), f"{where}.agent"),
                    self.verifier(self.table(step, "verifier"), f"{where}.verifier"),
                    dict(min_reward) if isinstance(min_reward, dict) else min_reward,
                )
            )
        return tuple(out)

    def strategy(self, data: dict) -> str:
        value = data.get("multi_step_reward_strategy", MEAN)
        if value not in (MEAN, FINAL):
            self.fail("multi_step_reward_strategy", f'must be "{MEAN}" or "{FINAL}": {value!r}')
        return value

    def config(self, data: dict) -> TaskConfig:
        tables = {k: self.table(data, k) for k in ("metadata", "agent", "verifier", "environment", "solution")}
        env = tables["environment"]
        return TaskConfig(
            metadata=tables["metadata"],
            agent=self.agent(tables["agent"], "agent"),
            verifier=self.verifier(tables["verifier"], "verifier"),
            environment=EnvironmentConfig(
                build_timeout_sec=self.number(env, "environment", "build_timeout_sec", DEFAULT_BUILD_TIMEOUT_SEC),
                docker_image=self.string(env, "environment", "docker_image"),
                cpus=self.number(env, "environment", "cpus", None),
                memory_mb=self.size_mb(env, "environment", "memory_mb", "memory"),
                storage_mb=self.size_mb(env, "environment", "storage_mb", "storage"),
                network=cast(NetworkPolicy, self.policy(env, "environment", baseline=True)),  # baseline: never None
                env=self.env(env, "environment"),
            ),
            solution_env=self.env(tables["solution"], "solution"),
            steps=self.steps(data),
            multi_step_reward_strategy=self.strategy(data),
            toml=data,
        )
