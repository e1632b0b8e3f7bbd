"""A task's base images (its Dockerfile's `FROM`s) and whether the host can stand in for one.

`sandbox: auto` runs a task without RUN lines in bwrap on the host's own /usr, so the host must
be what the `FROM` image would have been: the same distribution release, or a `python:X.Y`
image of the host's Python version on the host's release. The declared list (`host_images`) is
built from the host's /etc/os-release and python3, plus `OTBUILD_HOST_IMAGES` (space-separated
patterns, `*` matching anything). A task may also say so itself: `[metadata] host_compatible =
true`; otbuild's own synthetic, stackexchange and nl2bash tasks (only bash and Python's standard
library) are by their metadata.
Standard library only (Harbor's environment class imports the tasks package in its own Python).
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
import subprocess
from pathlib import Path

from otbuild.tasks.dockerfile import parse
from otbuild.tasks.task_toml import task_config
from otbuild.tasks.taskdir import DOCKERFILE, TaskDir

# otbuild's own tasks, which need only bash and Python's standard library whatever their FROM:
# synthetic ([metadata] generator), stackexchange and nl2bash adapters' ([metadata] source)
HOST_GENERATORS = ("otbuild.synthetic",)
HOST_SOURCES = ("stackexchange", "nl2bash")


def base_images(dockerfile: str) -> list[str]:
    """The external images the Dockerfile starts FROM, normalised (`docker.io/library/`
    dropped, `:latest` added), in order; stages that start FROM an earlier stage are skipped.
    `${ARG}` in a FROM takes the default of an ARG given before the first FROM."""
    args: dict[str, str] = {}
    stages: set[str] = set()
    found: list[str] = []
    in_a_stage = False
    for ins in parse(dockerfile):
        words = ins.args
        if ins.keyword == "ARG" and words and not in_a_stage:
            name, _, default = words[0].partition("=")
            args[name] = default
        elif ins.keyword == "FROM" and words:
            in_a_stage = True
            ref = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), ""), words[0])
            if ref.lower() not in stages and ref.lower() != "scratch":
                found.append(normalise(ref))
            if len(words) >= 3 and words[1].upper() == "AS":
                stages.add(words[2].lower())
    return found


def normalise(ref: str) -> str:
    """`docker.io/library/ubuntu` -> `ubuntu:latest`; digests and other registries kept."""
    for prefix in ("docker.io/library/", "docker.io/", "index.docker.io/library/"):
        if ref.startswith(prefix):
            ref = ref[len(prefix) :]
            break
    last = ref.rsplit("/", 1)[-1]
    return ref if ":" in last or "@" in ref else f"{ref}:latest"


def task_base_images(task: TaskDir) -> list[str]:
    """The task's base images: its Dockerfile's FROMs, else its prebuilt `docker_image`."""
    text = task.text(DOCKERFILE)
    if text is not None:
        return base_images(text)
    image = task_config(task).environment.docker_image
    return [normalise(image)] if image else []


@functools.cache
def host_images() -> tuple[str, ...]:
    """Patterns of images the host can stand in for (see the module's docstring)."""
    release = _os_release()
    distro, version, codename = (
        release.get("ID", ""),
        release.get("VERSION_ID", ""),
        release.get("VERSION_CODENAME", ""),
    )
    out = []
    for tag in filter(None, {version, codename}):
        out += [f"{distro}:{tag}", f"{distro}:{tag}-slim"]
    python = _host_python()
    if python and codename:
        out += [
            f"python:{python}-{codename}",
            f"python:{python}-slim-{codename}",
            f"python:{python}.*-{codename}",
            f"python:{python}.*-slim-{codename}",
        ]
    out += os.environ.get("OTBUILD_HOST_IMAGES", "").split()
    return tuple(normalise(p) for p in out if p)


def host_compatible(task: TaskDir) -> bool:
    """True when a sandbox on the host's root filesystem gives the task what its image would:
    no Dockerfile, the task says so, or its final FROM matches `host_images()`."""
    meta = task_config(task).metadata
    if (
        meta.get("host_compatible") is True
        or meta.get("generator") in HOST_GENERATORS
        or meta.get("source") in HOST_SOURCES
    ):
        return True
    text = task.text(DOCKERFILE)
    if text is None:
        return True
    images = base_images(text)
    return bool(images) and any(fnmatch.fnmatchcase(images[-1], p) for p in host_images())


def _os_release() -> dict[str, str]:
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return {}
    return {k: v.strip().strip('"') for k, _, v in (ln.partition("=") for ln in text.splitlines()) if v}


def _host_python() -> str | None:
    """X.Y of /usr/bin/python3 (what the sandbox binds in), or None."""
    try:
        out = subprocess.run(
            ["/usr/bin/python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout.strip()
    except OSError:
        return None
    return out or None
