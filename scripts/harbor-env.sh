#!/usr/bin/env bash
# Create .venv-harbor/: Harbor's CLI in its own Python 3.12 environment (with its `huggingface`
# extra: `datasets`, for Harbor's trace export `export_traces`), with otbuild
# installed --no-deps (editable) so Harbor can import otbuild.harbor.environment:OtbuildEnvironment
# (it needs only the standard library, Harbor and otbuild.sandbox).
# Idempotent: does nothing when the pinned Harbor and otbuild are already there.
# Env: HARBOR_VERSION (pin), HARBOR_PYTHON (a python3.12+), HARBOR_VENV (default .venv-harbor).
set -euo pipefail
cd "$(dirname "$0")/.."
HARBOR_VERSION="${HARBOR_VERSION:-0.26.0}"
VENV="${HARBOR_VENV:-.venv-harbor}"

if [ -x "$VENV/bin/harbor" ] && "$VENV/bin/python" - "$HARBOR_VERSION" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
import otbuild.harbor, otbuild.sandbox  # noqa: F401  (the editable install points here)
import podman_compose  # noqa: F401  (Harbor's `-e podman` on a podman without `podman compose`)
import datasets  # noqa: F401  (the `huggingface` extra: Harbor's trace export)
sys.exit(0 if version("harbor") == sys.argv[1] else 1)
PY
then
    echo "harbor-env: $VENV has harbor $HARBOR_VERSION and otbuild"
    exit 0
fi

find_python() {
    for p in "${HARBOR_PYTHON:-}" python3.12 python3.13 "$HOME/.pyenv/versions/3.12.1/bin/python" \
             "$HOME"/.pyenv/versions/3.12*/bin/python "$HOME"/.pyenv/versions/3.13*/bin/python; do
        [ -n "$p" ] || continue
        command -v "$p" >/dev/null 2>&1 || [ -x "$p" ] || continue
        if "$p" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; then
            echo "$p"; return 0
        fi
    done
    return 1
}
PY=$(find_python) || { echo "harbor-env: Harbor needs Python >= 3.12; none found (set HARBOR_PYTHON)" >&2; exit 2; }

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "harbor[huggingface]==$HARBOR_VERSION" podman-compose 2>&1 \
    | grep -v "^WARNING: Location" || true
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -e . 2>&1 \
    | grep -v "^WARNING: Location" || true
"$VENV/bin/python" -c "import otbuild.harbor.environment" \
    && echo "harbor-env: $VENV ready (harbor $HARBOR_VERSION, $("$VENV/bin/python" --version))"
