"""Rollouts through Harbor: write a job config, run `harbor run -c CONFIG`, ingest the job dir.

    job_dir = run_harbor_job("tasks.parquet", "work/", agent="terminus-2",
                             model="openai/glm", base_url="http://host:8000/v1",
                             environment="otbuild", n_attempts=3)
    rows = list(read_job(job_dir))          # otbuild.harbor.ingest

Harbor runs from its own Python 3.12 environment (`.venv-harbor/`, made by
scripts/harbor-env.sh); `harbor_bin` or $OTBUILD_HARBOR points elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Collection
from pathlib import Path

from otbuild.capture.control import SANDBOX_MODEL_PORT
from otbuild.settings.trials import HARBOR_AGENTS
from otbuild.traces.outcome import KNOWN_ERRORS

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_HARBOR = ROOT / ".venv-harbor" / "bin" / "harbor"
OTBUILD_ENV = "otbuild"
OTBUILD_IMPORT_PATH = "otbuild.harbor.environment:OtbuildEnvironment"
AGENTS = HARBOR_AGENTS  # the Harbor agents otbuild runs and reads
# Harbor's installed agents (their CLI runs inside the environment): in otbuild's environment each
# comes from otbuild's set-up (scripts/agents-env.sh), never installed at trial time
INSTALLED_AGENTS = ("mini-swe-agent",)
AGENTS_DIR = ROOT / ".venv-agents"
# inside otbuild's environment, an installed agent finds its model here (the environment's relay
# to the trial's capture proxy socket): the base URL Harbor hands it
SANDBOX_MODEL_URL = f"http://127.0.0.1:{SANDBOX_MODEL_PORT}"


def agent_venv(agent: str, root: Path | None = None) -> Path:
    """The venv scripts/agents-env.sh made for an installed agent; AgentNotInstalled naming it."""
    venv = Path(root or os.environ.get("OTBUILD_AGENTS") or AGENTS_DIR) / agent
    if not (venv / "sandbox-bin" / agent).is_file():
        raise AgentNotInstalled(
            f"Harbor's {agent} runs from {venv} in otbuild's environment, which is not there: run "
            "scripts/agents-env.sh (or `make agents-env`; `make setup` runs it), or set OTBUILD_AGENTS"
        )
    return venv


def installed_version(venv: Path, package: str) -> str | None:
    """The version of `package` in the venv (Harbor cannot ask an agent it did not install)."""
    from importlib.metadata import distributions

    for site in sorted(Path(venv).glob("lib/python*/site-packages")):
        for dist in distributions(path=[str(site)]):
            if dist.metadata["Name"] == package:
                return dist.version
    return None


class HarborNotInstalled(RuntimeError):
    """Harbor's CLI is not where we look for it."""


class AgentNotInstalled(HarborNotInstalled):
    """An installed agent's venv (scripts/agents-env.sh) is not where we look for it."""


def harbor_bin(path: str | Path | None = None) -> Path:
    """The harbor executable: `path`, else $OTBUILD_HARBOR, else .venv-harbor/bin/harbor.
    Raises HarborNotInstalled naming scripts/harbor-env.sh."""
    p = Path(path or os.environ.get("OTBUILD_HARBOR") or DEFAULT_HARBOR)
    if not (p.is_file() and os.access(p, os.X_OK)):
        raise HarborNotInstalled(
            f"Harbor is not installed at {p}: run scripts/harbor-env.sh (or `make harbor-env`) "
            "to create .venv-harbor/ with Python 3.12 and harbor, or set OTBUILD_HARBOR"
        )
    return p


def job_config(
    tasks_dir: Path,
    jobs_dir: Path,
    job_name: str,
    *,
    agent: str = "oracle",
    model: str | None = None,
    base_url: str | None = None,
    environment: str = OTBUILD_ENV,
    n_attempts: int = 1,
    n_concurrent: int = 4,
    agent_kwargs: dict | None = None,
    environment_kwargs: dict | None = None,
    timeout_multiplier: float = 1.0,
    agent_timeout_sec: float | None = None,
    max_timeout_sec: float | None = None,
    task_names: list[str] | None = None,
    max_retries: int = 0,
    api_key_env: str | None = None,
    verify: bool = True,
) -> dict:
    """A Harbor JobConfig (schema: `harbor job schema`) as a dict.

    `environment`: a Harbor environment type (docker, daytona, modal, ...), `otbuild` (ours,
    no container), or an import path `module:Class`. `agent`: one of AGENTS (another is a
    ValueError; mini-swe-agent in otbuild's environment skips Harbor's install: the environment's
    `agent_dir` provides it); `model` in litellm form (`openai/NAME` for an OpenAI-compatible
    server at `base_url`, e.g. `otbuild serve`). Harbor's agent timeout is
    min(task's or `agent_timeout_sec`, `max_timeout_sec`) x `timeout_multiplier`, its verifier's
    min(task's, `max_timeout_sec`) x `timeout_multiplier` (as otbuild's harness caps both).

    The terminus agents record what the model said (`trajectory_config.raw_content`, which
    a caller cannot turn off) and one linear history per context window (`linear_history`).
    `api_key_env` names the environment variable that holds the key (Harbor's
    `model_api_key_name`): the config holds the name, never the key. `max_retries`: Harbor
    reruns a trial that ended in an error up to that many times, with backoff; its error
    policy leaves out the agent's own ends and the verifier's, and so do the errors otbuild
    does not count as infrastructure (otbuild/traces/outcome.py: KNOWN_ERRORS). `verify`
    false: no trial runs the verifier (`verifier.disable`), so none has a reward."""
    if agent not in AGENTS:
        raise ValueError(f"Harbor agent {agent!r} is not one otbuild runs: {', '.join(AGENTS)}")
    if agent not in ("oracle", "nop") and not model:
        raise ValueError(f"agent {agent!r} needs a model (litellm form, e.g. openai/NAME)")
    agent_cfg: dict = {"name": agent, "kwargs": dict(agent_kwargs or {})}
    if agent.startswith("terminus"):
        agent_cfg["kwargs"]["trajectory_config"] = trajectory_config(agent_cfg["kwargs"].get("trajectory_config"))
    if model:
        agent_cfg["model_name"] = model
    if base_url:
        agent_cfg["base_url"] = base_url
    if api_key_env:
        agent_cfg["model_api_key_name"] = api_key_env
    if agent_timeout_sec is not None:
        agent_cfg["override_timeout_sec"] = float(agent_timeout_sec)
    if max_timeout_sec is not None:
        agent_cfg["max_timeout_sec"] = float(max_timeout_sec)
    env_cfg: dict = {"kwargs": dict(environment_kwargs or {}), "delete": True}
    if environment == OTBUILD_ENV:
        env_cfg["import_path"] = OTBUILD_IMPORT_PATH
        if agent.startswith("terminus"):  # no asciinema in a sandbox without network
            agent_cfg["kwargs"].setdefault("record_terminal_session", False)
        if agent in INSTALLED_AGENTS:  # the environment binds otbuild's install (agent_dir): none at trial time
            agent_cfg["kwargs"]["skip_install"] = True
    elif ":" in environment:
        env_cfg["import_path"] = environment
    else:
        env_cfg["type"] = environment
    dataset: dict = {"path": str(Path(tasks_dir).resolve())}
    if task_names:
        dataset["task_names"] = list(task_names)
    verifier_cfg = {} if max_timeout_sec is None else {"max_timeout_sec": float(max_timeout_sec)}
    if not verify:
        verifier_cfg["disable"] = True
    return {
        "job_name": job_name,
        "jobs_dir": str(Path(jobs_dir).resolve()),
        "n_attempts": int(n_attempts),
        "n_concurrent_trials": int(n_concurrent),
        "timeout_multiplier": float(timeout_multiplier),
        "quiet": True,
        "retry": {"max_retries": int(max_retries)},
        "override_error_policy": {name: {"should_retry": False} for name in KNOWN_ERRORS},
        "environment": env_cfg,
        "agents": [agent_cfg],
        **({"verifier": verifier_cfg} if verifier_cfg else {}),
        "datasets": [dataset],
    }


def trajectory_config(given: dict | None = None) -> dict:
    """terminus-2's trajectory options: raw content always (an assistant turn is the model's
    answer byte for byte, not Harbor's "Analysis: ... Plan: ..." rewrite with tool calls),
    linear history unless `given` turns it off (each file one context window the model saw,
    continued by `continued_trajectory_ref`; OpenThoughts-Agent's trace configs set both)."""
    given = dict(given or {})
    if given.get("raw_content") is False:
        raise ValueError(
            "trajectory_config.raw_content: false would store Harbor's rewrite of the model's "
            "answers instead of what it said; otbuild's traces need raw_content"
        )
    return {"linear_history": True, **given, "raw_content": True}


def write_job_config(path: Path, config: dict) -> Path:
    """JSON (a YAML subset Harbor reads with -c)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path


def harbor_command(config_path: Path, *, harbor: str | Path | None = None, check_installed: bool = True) -> list[str]:
    """`harbor run -c CONFIG -y` (-y: no interactive prompts)."""
    exe = harbor_bin(harbor) if check_installed else Path(harbor or DEFAULT_HARBOR)
    return [str(exe), "run", "-c", str(config_path), "-y"]


# what Harbor's process gets of otbuild's environment without the recipe naming it: how to find
# programs, files, the locale and the container engine; never a credential. Harbor fills a task's
# `${VAR}` from its own environment, so whatever else it got, any task could ask for.
HARBOR_BASE_ENV = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "TERM",
    "TZ",
    "TMPDIR",
    "XDG_RUNTIME_DIR",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "DOCKER_HOST",
    "CONTAINER_HOST",
    "CONTAINERS_CONF",
    "SOURCE_DATE_EPOCH",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
)
HARBOR_BASE_PREFIXES = ("LC_", "OTBUILD_")


def harbor_env(base: dict | None = None, api_key_env: str | None = None, host_env: Collection[str] = ()) -> dict:
    """The environment harbor runs with: of `base` (this process's environment), HARBOR_BASE_ENV,
    the recipe's `host_env` names and `api_key_env`, nothing else (a task's `${HF_TOKEN}` finds no
    HF_TOKEN there); litellm offline-friendly; the key Harbor's agent reads from `api_key_env`
    (the job config names it), else a placeholder key for OpenAI-compatible servers that need
    none. A named key variable that is unset is an error."""
    base = dict(os.environ if base is None else base)
    named = {*HARBOR_BASE_ENV, *host_env, *([api_key_env] if api_key_env else [])}
    env = {k: v for k, v in base.items() if k in named or k.startswith(HARBOR_BASE_PREFIXES)}
    env.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    if api_key_env is None:
        env.setdefault("OPENAI_API_KEY", "otbuild-local")
    elif not env.get(api_key_env):
        raise ValueError(f"api_key_env {api_key_env!r} is not set: Harbor's agent would get no key")
    return env


def prepare_tasks(tasks: str | Path, dest: Path) -> Path:
    """A dir of Harbor task dirs: `tasks` itself, or a task parquet exported to `dest`."""
    tasks = Path(tasks)
    if tasks.is_dir() and not any(tasks.glob("*.parquet")):
        return tasks
    from otbuild.tasks.export import export_tasks

    if dest.exists():
        shutil.rmtree(dest)
    export_tasks(tasks, dest)
    return dest


def run_harbor_job(
    tasks: str | Path,
    workdir: str | Path,
    *,
    agent: str = "oracle",
    model: str | None = None,
    base_url: str | None = None,
    environment: str = OTBUILD_ENV,
    n_attempts: int = 1,
    n_concurrent: int = 4,
    job_name: str = "job",
    agent_kwargs: dict | None = None,
    environment_kwargs: dict | None = None,
    timeout_multiplier: float = 1.0,
    agent_timeout_sec: float | None = None,
    max_timeout_sec: float | None = None,
    harbor: str | Path | None = None,
    max_retries: int = 0,
    api_key_env: str | None = None,
    timeout_sec: float | None = None,
    log: Path | None = None,
    verify: bool = True,
    host_env: Collection[str] = (),
) -> Path:
    """Run one Harbor job over `tasks` (a task parquet, or a dir of Harbor task dirs) and
    return its job dir (`workdir/jobs/<job_name>/`); ingest it with `read_job`. An existing
    job dir of that name is replaced. Raises HarborNotInstalled, or RuntimeError when
    harbor exits non-zero (with the tail of its log)."""
    exe = harbor_bin(harbor)
    workdir = Path(workdir).resolve()
    tasks_dir = prepare_tasks(tasks, workdir / "tasks")
    jobs_dir = workdir / "jobs"
    job_dir = jobs_dir / job_name
    if job_dir.exists():
        shutil.rmtree(job_dir)
    cfg = job_config(
        tasks_dir,
        jobs_dir,
        job_name,
        agent=agent,
        model=model,
        base_url=base_url,
        environment=environment,
        n_attempts=n_attempts,
        n_concurrent=n_concurrent,
        agent_kwargs=agent_kwargs,
        environment_kwargs=environment_kwargs,
        timeout_multiplier=timeout_multiplier,
        agent_timeout_sec=agent_timeout_sec,
        max_timeout_sec=max_timeout_sec,
        max_retries=max_retries,
        api_key_env=api_key_env,
        verify=verify,
    )
    env = harbor_env(api_key_env=api_key_env, host_env=host_env)
    path = write_job_config(workdir / f"{job_name}.harbor.json", cfg)
    log = Path(log or workdir / f"{job_name}.harbor.log")
    command = harbor_command(path, harbor=exe)
    # the tools installed beside harbor come first (podman-compose, for `-e podman`)
    env["PATH"] = os.pathsep.join([str(Path(command[0]).parent), env.get("PATH", "/usr/bin:/bin")])
    with open(log, "wb") as out:
        proc = subprocess.run(
            command, stdout=out, stderr=subprocess.STDOUT, cwd=workdir, timeout=timeout_sec, env=env, check=False
        )
    if proc.returncode != 0 or not (job_dir / "result.json").is_file():
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"harbor run exited with {proc.returncode} (config {path}, log {log}):\n{tail}")
    return job_dir
