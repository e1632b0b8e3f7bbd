#!/usr/bin/env bash
# Create .venv-llamafactory/: the LLaMA-Factory release otbuild's handoff is tested against (the
# `llamafactory` extra in pyproject.toml, the one pin) in an environment of its own, beside a
# CPU torch (LLaMA-Factory pins its own transformers, datasets and peft, kept out of otbuild's).
# tests/test_llamafactory_contract.py parses the exported YAML with LLaMA-Factory's argument
# parser and loads the exported dataset with its own template code; no GPU needed.
# Idempotent: does nothing when the pinned release is already there (a few minutes when not).
# The environment lives in the user's cache, one per pinned version
# (~/.cache/otbuild/venv-llamafactory-VERSION), and .venv-llamafactory links to it: every clone
# on a machine (CI's included) shares one install.
# Env: LLAMAFACTORY_PYTHON (a python3 >= 3.11), LLAMAFACTORY_VENV (default: that cache dir),
# TORCH (default torch==2.13.0, the CPU build make setup installs), TORCH_INDEX (see below).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${LLAMAFACTORY_PYTHON:-python3}"
PIN=$("$PY" - <<'PY'
import tomllib
extra = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["llamafactory"]
print(next(r for r in extra if r.replace(" ", "").startswith("llamafactory==")).replace(" ", ""))
PY
)
VERSION="${PIN#llamafactory==}"
VENV="${LLAMAFACTORY_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/otbuild/venv-llamafactory-$VERSION}"
link() { [ "$VENV" -ef .venv-llamafactory ] || ln -sfn "$VENV" .venv-llamafactory; }

installed() { "$VENV/bin/python" -c 'from importlib.metadata import version; print(version("llamafactory"))' 2>/dev/null; }
if [ "$(installed)" = "$VERSION" ]; then
    link
    echo "llamafactory-env: $VENV has llamafactory $VERSION"
    exit 0
fi

echo "llamafactory-env: installing $PIN into $VENV (with a CPU torch; a few minutes)"
mkdir -p "$(dirname "$VENV")"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 | grep -v "^WARNING: Location" || true; }
# torch first, so llamafactory's dependency on it does not pull another build; TORCH_INDEX
# (e.g. https://download.pytorch.org/whl/cpu) where no local wheel or mirror has the CPU one
"$VENV/bin/python" -c "import torch" 2>/dev/null || \
    pip "${TORCH:-torch==2.13.0}" ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"}
pip "$PIN"
[ "$(installed)" = "$VERSION" ] || { echo "llamafactory-env: $PIN did not install into $VENV" >&2; exit 1; }
link
echo "llamafactory-env: $VENV ready (llamafactory $VERSION, $("$VENV/bin/python" --version))"
