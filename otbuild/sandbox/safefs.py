"""Host reads and writes inside a trial root that never follow what the trial made.

A trial's processes can leave a link, a file or a pipe anywhere in their writable dirs, and swap
them while the host works. So every host-side access below a trial root goes folder by folder,
each opened relative to the last with O_NOFOLLOW (openat-style), and acts on what it opened:
files are made anew (O_CREAT|O_EXCL, after removing whatever was there) and chmod/chown/utime act
on the open file or relative to the open folder, never on a path. The root itself is otbuild's.
A link, a file where a folder goes or a special file where a regular one is read is an
UnsafePathError (an OSError); `rel` paths are relative to the root, `..` refused.

Paths whose folders the trial cannot write (a fresh root, a temp dir of the host's) go through
here as well: one way to write a trial's files.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# a pipe left where a file is read must not block the host: opened non-blocking, then refused
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# what the trial left where otbuild expects its own: a link (ELOOP), a file where a folder goes
# (ENOTDIR, EEXIST), a folder where a file goes (EISDIR)
SHAPE_ERRORS = (errno.ELOOP, errno.ENOTDIR, errno.EEXIST, errno.EISDIR, errno.ENXIO)
COPY_CHUNK = 1 << 20

Owner = tuple[int, int] | None  # uid, gid given to what is written; None: the writer's


class UnsafePathError(OSError):
    """A path in a trial root is not what otbuild expects there (a link, a file where a folder
    goes, a special file): refused, never followed."""


def parts(rel: str | PurePosixPath) -> list[str]:
    """The components of a path relative to a trial root; ValueError for `..`."""
    out = [p for p in PurePosixPath(rel).parts if p not in ("/", ".", "")]
    if ".." in out:
        raise ValueError(f"{rel}: '..' is not allowed in a trial path")
    return out


def _unsafe(e: OSError, rel: str | PurePosixPath) -> OSError:
    """`e` as an UnsafePathError naming `rel` when the trial's files made it; else as it is."""
    if e.errno in SHAPE_ERRORS and not isinstance(e, UnsafePathError):
        return UnsafePathError(
            e.errno,
            f"{rel}: {os.strerror(e.errno or 0)} (not followed: a link, a file where a folder goes, or a special file)",
        )
    return e


@contextmanager
def opened_dir(
    root: Path, rel: str | PurePosixPath = "", *, create: bool = False, owner: Owner = None
) -> Iterator[int]:
    """A file descriptor of the folder `root/rel`, every part opened with O_NOFOLLOW relative to
    the last; with `create`, missing folders are made (mode 0755, given to `owner`)."""
    fd = os.open(root, DIR_FLAGS)
    try:
        for part in parts(rel):
            sub = _enter(fd, part, create, owner, rel)
            os.close(fd)
            fd = sub
        yield fd
    finally:
        os.close(fd)


def _enter(fd: int, name: str, create: bool, owner: Owner, rel) -> int:
    """The folder `name` in folder `fd` (made if `create`), opened."""
    try:
        made = False
        if create:
            try:
                os.mkdir(name, 0o755, dir_fd=fd)
                made = True
            except FileExistsError:
                pass
        sub = os.open(name, DIR_FLAGS, dir_fd=fd)
    except OSError as e:
        raise _unsafe(e, rel) from None
    if made:
        try:
            os.fchmod(sub, 0o755)  # not the umask's
            if owner is not None:
                os.fchown(sub, *owner)
        except OSError:
            os.close(sub)
            raise
    return sub


def _split(rel: str | PurePosixPath) -> tuple[list[str], str]:
    names = parts(rel)
    if not names:
        raise ValueError(f"{rel!r}: no file name")
    return names[:-1], names[-1]


def write_file(
    root: Path,
    rel: str | PurePosixPath,
    data: bytes,
    *,
    mode: int = 0o644,
    owner: Owner = None,
    mtime: int | None = None,
) -> None:
    """`root/rel` made anew with `data` (what was there, a link or a pipe included, is removed
    first; a folder there is refused); missing folders are made."""
    folders, name = _split(rel)
    with opened_dir(root, "/".join(folders), create=True, owner=owner) as d:
        try:
            _unlink(d, name)
            fd = os.open(name, WRITE_FLAGS, 0o600, dir_fd=d)
        except OSError as e:
            raise _unsafe(e, rel) from None
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
            if owner is not None:
                os.fchown(fd, *owner)
            if mtime is not None:
                os.utime(fd, (mtime, mtime))
        finally:
            os.close(fd)


def _unlink(d: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=d)
    except FileNotFoundError:
        pass


def write_tree(
    root: Path, rel: str, files: Iterable[tuple[str, bytes, bool]], *, owner: Owner = None, mtime: int | None = None
) -> None:
    """Files (path below `rel`, data, executable) written under `root/rel`, which is made even
    when there are none; with `mtime`, every file and folder of it is given that time."""
    with opened_dir(root, rel, create=True, owner=owner):
        pass
    for sub, data, executable in files:
        write_file(root, f"{rel}/{sub}", data, mode=0o755 if executable else 0o644, owner=owner)
    if mtime is not None:
        stamp(root, rel, mtime)


def stamp(root: Path, rel: str, mtime: int) -> None:
    """Give `root/rel` and everything below it (links not followed, nor entered) the time `mtime`."""
    with opened_dir(root, rel) as fd:
        _stamp_below(fd, mtime)
        os.utime(fd, (mtime, mtime))


def _stamp_below(fd: int, mtime: int) -> None:
    for entry in os.scandir(fd):
        if entry.is_dir(follow_symlinks=False):
            try:
                sub = os.open(entry.name, DIR_FLAGS, dir_fd=fd)
            except OSError:  # swapped meanwhile, or not ours to open (a scratch disk's lost+found)
                continue
            try:
                _stamp_below(sub, mtime)
                os.utime(sub, (mtime, mtime))
            finally:
                os.close(sub)
        else:
            try:
                os.utime(entry.name, (mtime, mtime), dir_fd=fd, follow_symlinks=False)
            except PermissionError:
                pass


def read_file(root: Path, rel: str | PurePosixPath, cap: int) -> bytes | None:
    """At most `cap` bytes of the regular file `root/rel`; None when it does not exist."""
    folders, name = _split(rel)
    try:
        with opened_dir(root, "/".join(folders)) as d, _opened_file(d, name, rel) as fd:
            return os.read(fd, cap)
    except FileNotFoundError:
        return None


@contextmanager
def _opened_file(d: int, name: str, rel) -> Iterator[int]:
    """The regular file `name` of folder `d`, opened for reading; UnsafePathError for anything else."""
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=d)
    except OSError as e:
        raise _unsafe(e, rel) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafePathError(errno.EINVAL, f"{rel}: not a regular file")
        os.set_blocking(fd, True)
        yield fd
    finally:
        os.close(fd)


def clear(root: Path, rel: str, *, owner: Owner = None) -> None:
    """`root/rel` an empty folder of `owner`: what the trial left there is removed (a link or a
    file in its place too); a folder already there stays the same folder (a bind of it holds)."""
    folders, name = _split(rel)
    with opened_dir(root, "/".join(folders), create=True, owner=owner) as d:
        st = _lstat(d, name)
        if st is not None and not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=d)
        with opened_dir(root, rel, create=True, owner=owner) as fd:
            for entry in os.scandir(fd):
                _remove_entry(fd, entry.name)
            if owner is not None:
                os.fchown(fd, *owner)


def remove(root: Path, rel: str) -> None:
    """Remove `root/rel` (a file, a link, or a folder and everything in it) without following
    anything; nothing when it does not exist."""
    folders, name = _split(rel)
    try:
        with opened_dir(root, "/".join(folders)) as d:
            _remove_entry(d, name)
    except FileNotFoundError:
        pass


def remove_path(path: Path) -> None:
    """`remove` of a whole trial root (or any folder of otbuild's)."""
    path = Path(path).absolute()
    remove(path.parent, path.name)


def _lstat(d: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=d, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _remove_entry(d: int, name: str) -> None:
    """Remove `name` of folder `d`; a folder depth-first with one descriptor per level (no
    recursion: a trial can nest folders deeper than Python's stack)."""
    st = _lstat(d, name)
    if st is None:
        return
    if not stat.S_ISDIR(st.st_mode):
        _unlink(d, name)
        return
    stack = [(d, name, _open_to_remove(d, name))]
    while stack:
        parent, dname, fd = stack[-1]
        sub = None
        for entry in os.scandir(fd):
            if entry.is_dir(follow_symlinks=False):
                sub = entry.name
                break
            _unlink(fd, entry.name)
        if sub is not None:
            stack.append((fd, sub, _open_to_remove(fd, sub)))
            continue
        os.close(fd)
        stack.pop()
        os.rmdir(dname, dir_fd=parent)


def _open_to_remove(d: int, name: str) -> int:
    """Folder `name` opened to empty it, made readable and writable first where the trial took
    that away (chmod 000: a non-root host cannot open it otherwise)."""
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=d)
    except PermissionError:
        pinned = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=d)
        try:
            os.chmod(f"/proc/self/fd/{pinned}", stat.S_IRWXU)  # that very folder, never a link
        finally:
            os.close(pinned)
        fd = os.open(name, DIR_FLAGS, dir_fd=d)
    try:
        os.fchmod(fd, stat.S_IRWXU)
    except PermissionError:
        pass
    return fd


def copy_out(root: Path, rel: str, dest: Path) -> None:
    """Copy the file or folder `root/rel` to the host path `dest` (otbuild's): regular files and
    folders only; links and special files below `rel` are left behind, a link at `rel` refused.
    Folder by folder from the root each time: no descriptor chain or recursion as deep as the
    trial nests its folders."""
    folders, name = _split(rel)
    with opened_dir(root, "/".join(folders)) as d:
        st = _lstat(d, name)
        if st is None:
            raise FileNotFoundError(errno.ENOENT, f"{rel}: no such file or folder in the trial")
        if not stat.S_ISDIR(st.st_mode):
            with _opened_file(d, name, rel) as fd:
                _copy_fd(fd, Path(dest))
            return
    todo = [PurePosixPath()]
    while todo:
        sub = todo.pop()
        try:
            with opened_dir(root, PurePosixPath(rel, sub)) as fd:
                Path(dest, sub).mkdir(parents=True, exist_ok=True)
                todo += [sub / name for name in _copy_files(fd, Path(dest, sub))]
        except UnsafePathError:
            if not sub.parts:
                raise
            # swapped for a link meanwhile: left behind


def _copy_files(fd: int, dest: Path) -> list[str]:
    """The regular files of folder `fd` copied into `dest`; the names of its folders."""
    folders = []
    for entry in os.scandir(fd):
        if entry.is_dir(follow_symlinks=False):
            folders.append(entry.name)
        elif entry.is_file(follow_symlinks=False):
            try:
                with _opened_file(fd, entry.name, entry.name) as f:
                    _copy_fd(f, dest / entry.name)
            except UnsafePathError:  # swapped for a link or a pipe meanwhile: left behind
                continue
    return folders


def _copy_fd(fd: int, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "wb") as out, os.fdopen(os.dup(fd), "rb") as src:
        shutil.copyfileobj(src, out, COPY_CHUNK)


def copy_in(src: Path, root: Path, rel: str, *, owner: Owner = None) -> None:
    """Copy the host file or folder `src` (otbuild's or Harbor's, links in it kept out) to
    `root/rel` in a trial, as `write_file` writes."""
    src = Path(src)
    if not src.is_dir():
        write_file(root, rel, src.read_bytes(), mode=stat.S_IMODE(src.stat().st_mode), owner=owner)
        return
    with opened_dir(root, rel, create=True, owner=owner):
        pass
    for dirpath, dirnames, filenames in os.walk(src):
        base = PurePosixPath(rel, Path(dirpath).relative_to(src).as_posix())
        for n in dirnames:
            if not os.path.islink(os.path.join(dirpath, n)):
                with opened_dir(root, base / n, create=True, owner=owner):
                    pass
        for n in filenames:
            path = Path(dirpath, n)
            if path.is_file() and not path.is_symlink():
                write_file(root, base / n, path.read_bytes(), mode=stat.S_IMODE(path.stat().st_mode), owner=owner)
