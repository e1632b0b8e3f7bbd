"""A task's `task.toml`: its settings, its metadata, and whether a local sandbox can run the
task without its image (`runnable_locally`; the Dockerfile's part is `dockerfile.local_problems`).
Standard library only: the sandbox, and Harbor's environment class in its own Python, import it."""

from __future__ import annotations

import tomllib

from otbuild.tasks.dockerfile import local_problems
from otbuild.tasks.taskdir import DOCKERFILE, TASK_TOML, TaskDir, TaskFormatError

SETUP_SCRIPT = "environment/setup.sh"


def parse_task_toml(task: TaskDir) -> dict:
    """`task.toml` as a dict; TaskFormatError when it is not TOML or has wrong types."""
    try:
        config = tomllib.loads(task.files[TASK_TOML].data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise TaskFormatError(f"task {task.name!r}: {e}") from e
    for table in ("metadata", "agent", "verifier", "environment"):
        if not isinstance(config.get(table, {}), dict):
            raise TaskFormatError(f"task {task.name!r}: [{table}] is not a table")
    for table in ("agent", "verifier"):
        t = config.get(table, {}).get("timeout_sec")
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float))):
            raise TaskFormatError(f"task {task.name!r}: [{table}] timeout_sec is not a number")
    return config


def task_config(task: TaskDir) -> dict:
    """`task.toml` as a dict, {} for a task without one."""
    return parse_task_toml(task) if TASK_TOML in task.files else {}


def task_metadata(config: dict) -> dict:
    """The `[metadata]` table plus agent/verifier timeouts and docker_image where present."""
    meta = dict(config.get("metadata", {}))
    for key, value in (
        ("agent_timeout_sec", config.get("agent", {}).get("timeout_sec")),
        ("verifier_timeout_sec", config.get("verifier", {}).get("timeout_sec")),
        ("docker_image", config.get("environment", {}).get("docker_image")),
    ):
        if value is not None:
            meta[key] = value
    return meta


def runnable_locally(task: TaskDir, config: dict | None = None) -> bool:
    """True only when the task needs no container image we cannot reproduce locally:

    - `task.toml` has no `[environment] docker_image` (a prebuilt image), and
    - `environment/Dockerfile` is absent or has no `dockerfile.local_problems` (only
      FROM/ARG/LABEL/USER/WORKDIR/ENV/COPY lines a sandbox can lay out; no RUN, ADD, ...), and
    - there is no `environment/setup.sh` (a Terminal-Bench-1 provisioning script).
    """
    config = task_config(task) if config is None else config
    if config.get("environment", {}).get("docker_image") or SETUP_SCRIPT in task.files:
        return False
    dockerfile = task.text(DOCKERFILE)
    return dockerfile is None or not local_problems(dockerfile)
