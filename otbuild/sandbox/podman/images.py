"""The task's image: built from its `environment/Dockerfile` (build context `environment/`; its
RUN lines offline unless `Limits.build_network` is public, the recipe's `build_network`; `--pull`
as `Limits.pull` says; offline, base images come from `scripts/podman-setup.sh` or
`otbuild images load`) and cached under a tag made of the content hash of `environment/`, so
equal environments share one image and a rebuild is free; the build (or pull) is bounded by the
task's `[environment] build_timeout_sec` (Harbor's default: 600 s). And what killed builds left.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from otbuild.rundir import open_lock, private_dir, runtime_dir
from otbuild.sandbox.errors import SandboxError
from otbuild.sandbox.layout import write_subtree
from otbuild.sandbox.podman.cli import ContainerError, _podman, _tail
from otbuild.sandbox.procs import owner, owner_is_gone
from otbuild.tasks.taskdir import DOCKERFILE, TaskDir

log = logging.getLogger(__name__)

IMAGE_REPO = "localhost/otbuild-env"
BUILD_TIMEOUT_SEC = 3600
LOCK_DIR: Path | None = None  # None: runtime_dir()/podman-builds
LOAD_HINT = (
    " (no registry reached: `otbuild images load DIR` imports `podman save` tarballs; "
    "scripts/podman-setup.sh builds ubuntu, debian and python:3.12-slim ones)"
)
# host:pid:start time of the process (the build's job) running an image build: a build arg (no
# Dockerfile declares it, so it changes no layer and no cache key) that buildah records in each
# working container's buildah.json
BUILD_OWNER_ARG = "OTBUILD_BUILD_OWNER"


class ImageBuildError(SandboxError):
    """`podman build` of a task's environment failed; the message has the build log's tail."""


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


def ensure_image(
    task: TaskDir,
    docker_image: str | None = None,
    pull: str = "missing",
    timeout: float = BUILD_TIMEOUT_SEC,
    network: str = "none",
) -> str:
    """The image a trial of `task` runs in, built when missing (one build per environment
    hash at a time, across processes). `pull` (never | missing | always) is podman's policy for
    base images and a prebuilt `docker_image`; `timeout` bounds the build or the pull (the
    task's build_timeout_sec); `network` (none | public) is what the Dockerfile's RUN lines
    may reach (the recipe's `build_network`)."""
    if DOCKERFILE not in task.files:
        if docker_image and (image_exists(docker_image) if pull == "never" else _pull(docker_image, pull, timeout)):
            return docker_image
        raise ImageBuildError(
            f"task {task.name!r}: no environment/Dockerfile to build"
            + (
                f", and its image {docker_image!r} is not present locally"
                f"{'' if pull == 'never' else ' nor could it be pulled'}{LOAD_HINT}"
                if docker_image
                else ""
            )
        )
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
            r = subprocess.run(
                [
                    "podman",
                    "build",
                    f"--pull={pull}",
                    "--layers",
                    "--quiet",
                    "-t",
                    tag,
                    *(["--network=none"] if network == "none" else []),
                    "--build-arg",
                    f"{BUILD_OWNER_ARG}={owner()}",
                    "-f",
                    str(Path(ctx) / "Dockerfile"),
                    ctx,
                ],
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise ImageBuildError(
                f"task {task.name!r}: podman build ran past {timeout:g}s (its [environment] build_timeout_sec)"
            ) from None
    if r.returncode != 0:
        missing = (
            "image not known" in r.stderr
            or "pull policy" in r.stderr
            or "initializing source" in r.stderr
            or "short-name" in r.stderr
        )
        hint = f"; a base image is missing{LOAD_HINT}" if missing else ""
        if network == "none":
            hint += "; its RUN lines had no network (a recipe lets them fetch with build_network: public)"
        raise ImageBuildError(
            f"task {task.name!r}: podman build failed (exit {r.returncode}){hint}:\n{_tail(r.stdout + r.stderr, 3000)}"
        )
    log.info("built %s for task %s", tag, task.name)


def load_images(folder: Path) -> list[tuple[Path, str]]:
    """`podman load` every file in `folder` (docker-archive or OCI tarballs, as `podman save`
    or `docker save` write them, gzipped or not), for clusters no registry reaches: (file,
    the images it held) per file. ContainerError naming the file that is not an image archive."""
    loaded = []
    for path in sorted(p for p in Path(folder).iterdir() if p.is_file()):
        r = _podman("load", "-i", str(path), check=False, timeout=BUILD_TIMEOUT_SEC)
        if r.returncode != 0:
            raise ContainerError(
                f"{path}: not a docker-archive or OCI image tarball podman can load: {_tail(r.stderr, 1000)}"
            )
        names = [ln.split(":", 1)[1].strip() for ln in r.stdout.splitlines() if ln.startswith("Loaded image")]
        loaded.append((path, ", ".join(names)))
    return loaded


# -- what killed builds left ----------------------------------------------------------------
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
            builder = json.loads(
                (Path(store[0]) / f"{store[1]}-containers" / cid / "userdata" / "buildah.json").read_text()
            )
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
