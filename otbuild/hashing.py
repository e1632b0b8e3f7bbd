"""Stable hashes: of settings (canonical JSON) and of file/dir contents (sha256, cached by stat)."""

from __future__ import annotations

import atexit
import hashlib
import json
from pathlib import Path

from otbuild.fsio import write_json

CACHE_FILE = Path(".otbuild") / "digests.json"
_cache: dict[str, str] | None = None
_dirty: set[str] = set()


def canonical_json(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def settings_hash(obj, length: int = 16) -> str:
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()[:length]


def file_sha256(path: Path | str, cached: bool = True) -> str:
    """sha256 of a file's bytes, remembered per (path, size, mtime, ctime, inode) in .otbuild/
    (any write changes ctime, which no user can set back); `cached=False` rehashes."""
    path = Path(path)
    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}|{st.st_ino}"
    cache = _load_cache()
    if key not in cache or not cached:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        cache[key] = h.hexdigest()
        _dirty.add(key)
    return cache[key]


def content_digest(path: Path | str) -> str:
    """sha256 over a file, or over a dir's (relative path, file sha256) pairs, sorted."""
    path = Path(path)
    if path.is_file():
        return file_sha256(path)
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file():
            h.update(f"{p.relative_to(path).as_posix()}\0{file_sha256(p)}\n".encode())
    return h.hexdigest()


def _load_cache() -> dict[str, str]:
    global _cache
    if _cache is None:
        try:
            _cache = json.loads(CACHE_FILE.read_text())
        except (OSError, ValueError):
            _cache = {}
        atexit.register(_save_cache)
    return _cache


def _save_cache() -> None:
    if not _dirty:
        return
    try:
        write_json(CACHE_FILE, _cache)
    except OSError:
        pass  # a read-only checkout still works, just without the cache
