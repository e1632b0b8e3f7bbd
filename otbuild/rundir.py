"""Folders otbuild keeps host state in (trial uid locks, image-build locks, the /etc view): on a
shared host, never one someone else made.

A folder is made with an exclusive `mkdir` (which never takes over what exists) or, when it
exists, used only if it is not a link, belongs to this user and nobody else may write to it;
otherwise `UntrustedPath` names it. Where they lie:

- `runtime_dir()`: this user's `$XDG_RUNTIME_DIR/otbuild` when XDG_RUNTIME_DIR is private to
  this user, else `$TMPDIR/otbuild-UID` (made 0700);
- `host_dir()`: as root `/run/otbuild`, the same for every root process on the host whatever its
  environment (what must be shared host-wide: the trial uids' locks); else `runtime_dir()`.

Standard library only (the sandbox is).
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

RUN = Path("/run")  # root's: only root may create in it


class UntrustedPath(RuntimeError):
    """A folder otbuild would keep state in exists and is not one otbuild made; names it and why.
    Not a trial's failure: every trial of the host would meet it, so the job stops, naming it."""


def private_dir(path: Path, mode: int = 0o700) -> Path:
    """`path` as a folder only this user controls: made now (exclusively), or one that exists, is
    no link, belongs to this user and is writable by nobody else (UntrustedPath otherwise)."""
    try:
        os.mkdir(path, mode)
        os.chmod(path, mode, follow_symlinks=False)  # whatever the umask took away
    except FileExistsError:
        pass
    problem = _not_private(path, group_other=0o022)
    if problem:
        raise UntrustedPath(
            f"{path}: {problem}; otbuild keeps its state only in folders it made. Remove it, "
            "or set XDG_RUNTIME_DIR (or TMPDIR) to a folder of your own"
        )
    return path


def runtime_dir() -> Path:
    """This user's folder for otbuild's host state (the module's docstring)."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg) and not _not_private(Path(xdg), group_other=0o077):
        return private_dir(Path(xdg) / "otbuild")
    return private_dir(Path(tempfile.gettempdir()) / f"otbuild-{os.geteuid()}")


def host_dir() -> Path:
    """As root, /run/otbuild (one place for every root process of the host); else runtime_dir()."""
    if os.geteuid() == 0 and not _not_private(RUN, group_other=0o022):
        return private_dir(RUN / "otbuild")
    return runtime_dir()


def open_lock(path: Path, *, exclusive: bool = False) -> int:
    """A lock file's descriptor, read-write, never through a link (O_NOFOLLOW); `exclusive`:
    only a file made now (FileExistsError otherwise)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_EXCL if exclusive else 0)
    return os.open(path, flags, 0o600)


def _not_private(path: Path, *, group_other: int) -> str | None:
    """Why `path` is not a folder this user controls (None when it is): `group_other` are the
    mode bits nobody else may hold."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder"
    if st.st_uid != os.geteuid():
        return f"belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})"
    if st.st_mode & group_other:
        return f"others may {'write to' if st.st_mode & 0o022 else 'read'} it (mode {stat.S_IMODE(st.st_mode):o})"
    return None
