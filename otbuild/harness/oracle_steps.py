"""Split a solution script into top-level commands, one per oracle turn.

Lines are gathered until `bash -n` accepts the chunk, so heredocs, loops, functions, quoted
multi-line strings and backslash continuations stay whole. Comments, blank lines and the
shebang are dropped; a chunk that never parses becomes the rest of the script at once. So are
`set -e` (in an interactive shell it would end the session at the first failing command) and
a final bare `exit`, which would close the terminal before the verifier's turn.
"""

from __future__ import annotations

import re
import subprocess

SCRIPT_ONLY = re.compile(r"^\s*(set\s+-[a-zA-Z]*e[a-zA-Z]*(\s+-?o?\s*\w+)*|exit(\s+\d+)?)\s*;?\s*$")


def split_commands(script: str) -> list[str]:
    steps: list[str] = []
    chunk: list[str] = []
    for line in script.splitlines():
        if not chunk and (not line.strip() or line.lstrip().startswith("#")):
            continue
        chunk.append(line)
        text = "\n".join(chunk)
        if not text.rstrip().endswith("\\") and _complete(text):
            steps.append(text)
            chunk = []
    if chunk:
        steps.append("\n".join(chunk))
    return [s for s in steps if not SCRIPT_ONLY.match(s)]


def _complete(text: str) -> bool:
    """bash -n accepts an unterminated heredoc with a warning; that is not complete either."""
    r = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True, check=False)
    return r.returncode == 0 and "here-document" not in r.stderr
