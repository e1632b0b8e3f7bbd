#!/usr/bin/env bash
# Create .venv-agents/mini-swe-agent/: a third-party agent that Harbor runs INSIDE otbuild's
# sandbox (docs/harbor.md#third-party-agents), installed here once so that no trial needs the
# network. Its Python is the host's /usr/bin/python3 (the sandbox sees the host's /usr, nothing
# of /root or pyenv); the sandbox binds the venv read-only at /opt/otbuild-agent and puts its
# `sandbox-bin/` on PATH: `mini-swe-agent` and `mini` there start the venv's Python at that
# path (a venv's own scripts name the host path in their #! line).
# Idempotent: does nothing when the pinned version is there.
# Env: MINI_SWE_AGENT_VERSION (pin), AGENTS_PYTHON (default /usr/bin/python3), AGENTS_VENVS.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="${MINI_SWE_AGENT_VERSION:-2.4.6}"
PY="${AGENTS_PYTHON:-/usr/bin/python3}"
VENV="${AGENTS_VENVS:-.venv-agents}/mini-swe-agent"
INSIDE=/opt/otbuild-agent  # where otbuild.harbor.environment binds it (AGENT_MOUNT)

if [ -x "$VENV/sandbox-bin/mini-swe-agent" ] && "$VENV/bin/python" - "$VERSION" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
import minisweagent.run.mini  # noqa: F401
sys.exit(0 if version("mini-swe-agent") == sys.argv[1] else 1)
PY
then
    echo "agents-env: $VENV has mini-swe-agent $VERSION"
    exit 0
fi
case "$PY" in
    /usr/*) ;;
    *) echo "agents-env: the agent's Python must be under /usr (the sandbox sees the host's /usr only): $PY" >&2; exit 2 ;;
esac
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "mini-swe-agent==$VERSION" 2>&1 \
    | grep -v "^WARNING: Location" || true
mkdir -p "$VENV/sandbox-bin"
for name in mini-swe-agent mini; do
    cat >"$VENV/sandbox-bin/$name" <<SH
#!/bin/sh
exec $INSIDE/bin/python -c 'import sys; from minisweagent.run.mini import app; sys.argv[0] = "$name"; sys.exit(app())' "\$@"
SH
    chmod 0755 "$VENV/sandbox-bin/$name"
done
"$VENV/bin/python" -c "import minisweagent.run.mini" \
    && echo "agents-env: $VENV ready (mini-swe-agent $VERSION, $("$VENV/bin/python" --version))"
