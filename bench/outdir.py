"""The benchmarks' `--out DIR`: made when it does not exist (parents too); a path that cannot be
a folder is refused by argparse (exit 2, naming it) before anything runs."""

from __future__ import annotations

import argparse
from pathlib import Path


def out_dir(text: str) -> Path:
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{path} exists and is not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot make the folder {path}: {e.strerror}") from None
    return path
