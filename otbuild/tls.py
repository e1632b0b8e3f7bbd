"""Whether an HTTP client to a model's endpoint makes TLS connections (it then loads the CA store)."""

from __future__ import annotations

import os

PROXY_VARIABLES = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy")


def makes_tls(url: str, *, uds: str | None = None, trust_env: bool = False) -> bool:
    """Whether a client of `url` can open a TLS connection: to an https URL, or through a
    proxy the environment names (with `trust_env`). A plain-http endpoint (a local server, the
    capture proxy, a unix socket) never does, and its client skips loading the system's CA
    store (20-100 ms of its first request)."""
    if uds:
        return False
    return not url.startswith("http://") or (trust_env and any(os.environ.get(k) for k in PROXY_VARIABLES))
