"""Issue 44 (6): on a shared host, otbuild run as root trusts no folder or lock file at a fixed
/tmp name that someone else made (otbuild/rundir.py): not the trial uids' locks, not the
image builds' locks, not the /etc every trial sees."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from otbuild.tasks.taskdir import TaskDir

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's folder needs root")
OTHER_UID = 4242


def planted(path: Path, *, mode: int = 0o777) -> Path:
    """A folder another user made, which anyone may write to."""
    path.mkdir(parents=True)
    os.chmod(path, mode)
    os.chown(path, OTHER_UID, OTHER_UID)
    return path


@pytest.fixture
def victim(tmp_path) -> Path:
    f = tmp_path / "victim"
    f.write_text("root's file\n")
    return f


@as_root
def test_trial_uid_locks_in_someone_elses_folder_are_refused(monkeypatch, tmp_path, victim):
    """A lock folder another user made, holding a link where the next uid's lock goes: the old
    code opened it through the link (and truncated root's file)."""
    from otbuild.sandbox import identity
    from otbuild.rundir import UntrustedPath

    uids = planted(tmp_path / "uids")
    (uids / str(identity.UID_BASE)).symlink_to(victim)
    monkeypatch.setattr(identity, "LOCK_DIR", uids)
    monkeypatch.setattr(identity, "UID_RANGE", 1)
    with pytest.raises(UntrustedPath, match=f"{uids}: belongs to uid {OTHER_UID}"):
        identity.acquire().release()
    assert victim.read_text() == "root's file\n"


@as_root
def test_a_link_among_our_own_trial_uid_locks_is_not_followed(monkeypatch, tmp_path, victim):
    from otbuild.sandbox import identity

    uids = tmp_path / "uids"
    uids.mkdir(mode=0o700)
    (uids / str(identity.UID_BASE)).symlink_to(victim)
    monkeypatch.setattr(identity, "LOCK_DIR", uids)
    monkeypatch.setattr(identity, "UID_RANGE", 1)
    with pytest.raises(OSError):
        identity.acquire().release()
    assert victim.read_text() == "root's file\n"


@as_root
def test_image_build_locks_in_someone_elses_folder_are_refused(monkeypatch, tmp_path, victim):
    from otbuild.rundir import UntrustedPath
    from otbuild.sandbox.podman import images

    task = TaskDir("t")
    task.add("environment/Dockerfile", "FROM ubuntu:24.04\nRUN true\n")
    locks = planted(tmp_path / "builds")
    (locks / f"{images.environment_hash(task)[:24]}.lock").symlink_to(victim)
    monkeypatch.setattr(images, "LOCK_DIR", locks)
    monkeypatch.setattr(images, "image_exists", lambda ref: False)
    monkeypatch.setattr(images, "_build", lambda *a: None)
    with pytest.raises(UntrustedPath, match=f"{locks}: belongs to uid {OTHER_UID}"):
        images.ensure_image(task)
    assert victim.read_text() == "root's file\n"


@pytest.fixture
def fresh_etc_view():
    from otbuild.sandbox import hostfs

    hostfs.etc_view.cache_clear()
    yield hostfs
    hostfs.etc_view.cache_clear()


@as_root
def test_the_etc_every_trial_sees_is_never_one_someone_else_made(monkeypatch, tmp_path, fresh_etc_view):
    """The old code reused $TMPDIR/otbuild-etc-UID/STATE whoever made it: a planted passwd (or
    resolv.conf, ld.so.cache, ssl certificates) in every trial."""
    hostfs = fresh_etc_view
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir(mode=0o1777)
    entries = [Path("/etc") / n for n in hostfs.ETC_ALLOW if (Path("/etc") / n).exists()]
    fake = planted(tmp_path / "tmp" / f"otbuild-etc-{os.geteuid()}") / hostfs._etc_state(entries)
    fake.mkdir()
    (fake / "passwd").write_text("root::0:0:planted:/root:/bin/bash\n")
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    view = hostfs.etc_view()
    assert view is not None and view != fake and view.is_relative_to(xdg / "otbuild")
    assert "planted" not in (view / "passwd").read_text()


def test_a_planted_runtime_dir_is_an_error_naming_it(monkeypatch, tmp_path):
    """No private XDG_RUNTIME_DIR: $TMPDIR/otbuild-UID, made 0700, or refused when someone made
    it first (a link, another owner, writable by others)."""
    from otbuild.rundir import UntrustedPath, runtime_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    mine = runtime_dir()
    assert mine == tmp_path / f"otbuild-{os.geteuid()}" and (mine.stat().st_mode & 0o777) == 0o700
    mine.rmdir()
    mine.symlink_to(tmp_path)
    with pytest.raises(UntrustedPath, match=f"{mine}: is a symbolic link"):
        runtime_dir()
    mine.unlink()
    mine.mkdir(mode=0o700)
    os.chmod(mine, 0o777)
    with pytest.raises(UntrustedPath, match="others may write to it"):
        runtime_dir()
    shared = tmp_path / "shared-xdg"
    shared.mkdir(mode=0o755)  # an XDG_RUNTIME_DIR others may read is not used
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(shared))
    with pytest.raises(UntrustedPath, match=str(mine)):
        runtime_dir()
    os.chmod(shared, 0o700)
    assert runtime_dir() == shared / "otbuild"
