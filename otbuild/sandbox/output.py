"""Bounded reading of a command's output."""

from __future__ import annotations

import os
import selectors
import time


def head_tail(data: bytes, limit: int) -> bytes:
    """`data` if it fits `limit`, else its first and last `limit // 2` bytes around a marker."""
    if len(data) <= limit:
        return data
    half = limit // 2
    omitted = len(data) - 2 * half
    return data[:half] + f"\n[... {omitted} bytes omitted ...]\n".encode() + data[-half:]


def read_bounded(fd: int, cap: int, deadline: float) -> tuple[bytes, bool, bool]:
    """Read `fd` until EOF, the monotonic `deadline`, or more than `cap` bytes.

    Returns (data, over_cap, timed_out); `data` is at most `cap` bytes.
    """
    buf = bytearray()
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return bytes(buf), False, True
            if not sel.select(min(left, 1.0)):
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                return bytes(buf), False, False
            room = cap - len(buf)
            buf += chunk[:room]
            if len(chunk) > room:
                return bytes(buf), True, False
    finally:
        sel.close()
