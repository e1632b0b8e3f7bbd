"""Credentials written into a recipe are refused when it loads: a recipe is published as is
(`recipe.resolved.yaml`) and its values reach provenance records and command lines, so it may
name the environment variable that holds a key (`api_key_env`), never the key.

Refused, naming the key: a value that looks like a secret (otbuild/tasks/redact.py's
PATTERNS), a URL with `user:password@`, a literal value of a secret-named variable in an `env`
mapping (`HF_TOKEN: ...`), and a secret-named flag in an argument list (`--api-key ...`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from otbuild.tasks.redact import secret_kind

_SECRET_WORD = r"(?:api[-_]?key|token|secret|password|passwd|credentials?)"
SECRET_NAME = re.compile(rf"(?:^|[-_]){_SECRET_WORD}(?:$|[-_])", re.IGNORECASE)  # HF_TOKEN, not TOKENIZERS_...
SECRET_FLAG = re.compile(rf"^--?(?:[\w-]*[-_])?{_SECRET_WORD}(?:$|[-_=])", re.IGNORECASE)  # --api-key, --hf-token=
URL_PASSWORD = re.compile(r"^[a-z][a-z0-9+.-]*://[^/@\s:]*:[^/@\s]+@", re.IGNORECASE)
REMEDY = (
    "a recipe is published as written (recipe.resolved.yaml, provenance): name an environment variable "
    "instead (api_key_env for an endpoint's key; a server otbuild starts inherits its environment, so "
    "export the variable there)"
)


def credentials(value: Any, loc: tuple = ()) -> Iterator[tuple[tuple, str]]:
    """(where, why) for each credential written in a recipe document."""
    if isinstance(value, str):
        if kind := secret_kind(value):
            yield loc, f"looks like a credential ({kind})"
        elif URL_PASSWORD.match(value):
            yield loc, "is a URL with a user:password"
        elif loc and loc[-2:-1] == ("env",) and value and SECRET_NAME.search(str(loc[-1])):
            yield loc, "sets a secret-named variable to a literal value"
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from credentials(item, (*loc, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if isinstance(item, str) and SECRET_FLAG.match(item):
                yield (*loc, i), f"passes {item.split('=')[0]} on a command line"
            else:
                yield from credentials(item, (*loc, i))
