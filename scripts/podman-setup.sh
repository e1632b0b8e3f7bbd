#!/usr/bin/env bash
# podman for `sandbox: podman` (docs/sandbox.md): installs it, configures it to run rootful
# without systemd on cgroup v1 or v2, and builds the base images task Dockerfiles start FROM
# when no registry is reachable. Idempotent: each step is skipped when already done.
#
#   scripts/podman-setup.sh            # what `make setup` runs
#   OTBUILD_BASE_IMAGES="ubuntu:24.04 debian:bookworm python:3.12-slim" scripts/podman-setup.sh
#
# python:3.12-slim is what otbuild's own task sources name (synthetic, stackexchange, nl2bash,
# table): built here as Ubuntu 24.04's Python 3.12 (python, python3 in /usr/local/bin, as Docker
# Hub's image has them), or Debian bookworm's Python 3.11 when the Ubuntu archive is not reached
# (those tasks need only bash and Python's standard library).
set -euo pipefail

SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
APT=(apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends)
PACKAGES=(podman runc catatonit uidmap slirp4netns fuse-overlayfs containernetworking-plugins
          mmdebstrap debian-archive-keyring curl)
BASE_IMAGES=${OTBUILD_BASE_IMAGES:-"ubuntu:24.04 debian:bookworm python:3.12-slim"}
UBUNTU_MIRROR=${OTBUILD_UBUNTU_MIRROR:-http://archive.ubuntu.com/ubuntu}
DEBIAN_MIRROR=${OTBUILD_DEBIAN_MIRROR:-http://deb.debian.org/debian}

missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "podman-setup: installing ${missing[*]}"
    $SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO "${APT[@]}" "${missing[@]}" >/dev/null
fi

# runc, not crun (crun 1.8 refuses a cgroup v1 hybrid layout); cgroupfs and a file event
# log (no systemd); ulimits podman may set without CAP_SYS_RESOURCE
CONF=/etc/containers/containers.conf
WANT='# written by otbuild scripts/podman-setup.sh
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"'
if [ "$(cat "$CONF" 2>/dev/null)" != "$WANT" ]; then
    if [ -s "$CONF" ] && ! head -1 "$CONF" | grep -q otbuild; then
        $SUDO cp "$CONF" "$CONF.before-otbuild"
        echo "podman-setup: saved the previous $CONF as $CONF.before-otbuild"
    fi
    $SUDO mkdir -p /etc/containers
    printf '%s\n' "$WANT" | $SUDO tee "$CONF" >/dev/null
fi

# Ubuntu's archive key: not packaged in Debian 12; the keyring .deb from the Ubuntu archive,
# checked against a pinned sha256
UBUNTU_KEYRING=/var/lib/otbuild/ubuntu-archive-keyring.gpg
UBUNTU_KEYRING_DEB=pool/main/u/ubuntu-keyring/ubuntu-keyring_2023.11.28.1_all.deb
UBUNTU_KEYRING_SHA256=36de43b15853ccae0028e9a767613770c704833f82586f28eb262f0311adb8a8
ubuntu_keyring() {
    [ -s "$UBUNTU_KEYRING" ] && return 0
    local d; d=$(mktemp -d)
    curl -fsS --retry 3 -o "$d/k.deb" "$UBUNTU_MIRROR/$UBUNTU_KEYRING_DEB" \
        && echo "$UBUNTU_KEYRING_SHA256  $d/k.deb" | sha256sum -c --quiet - \
        && dpkg-deb -x "$d/k.deb" "$d/x" \
        && $SUDO install -D -m 644 "$d/x/usr/share/keyrings/ubuntu-archive-keyring.gpg" "$UBUNTU_KEYRING"
    local rc=$?; rm -rf "$d"; return $rc
}

# base images: no registry is reachable, so the common bases are bootstrapped from the
# distributions' archives and tagged as Docker Hub would name them (builds use --pull=never)
tmp=$([ -w /dev/shm ] && echo /dev/shm || echo "${TMPDIR:-/tmp}")  # ~3x faster in memory
# python as Docker Hub's python images have it: /usr/local/bin/python and python3, UTF-8
PYTHON_HOOK='ln -sf /usr/bin/python3 "$1/usr/local/bin/python3" && ln -sf /usr/bin/python3 "$1/usr/local/bin/python"'
bootstrap() {  # tag suite mirror components keyring [extra packages] [customize hook]
    local tag=$1 suite=$2 mirror=$3 components=$4 keyring=$5 extra=${6:-} hook=${7:-true} sources=()
    local cmd=/bin/bash env=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    [ -z "$extra" ] || cmd=python3 env="$env LANG=C.UTF-8"  # as Docker Hub's python images
    for s in $suite $suite-updates; do sources+=("deb $mirror $s $components"); done
    # minbase: Essential + apt, like Docker Hub's images; apt lists are cleaned, as there
    echo "podman-setup: building $tag ($suite from $mirror)"
    local tar; tar=$(mktemp -p "$tmp" otbuild-rootfs.XXXXXX.tar)
    # a failed bootstrap leaves no image behind: the tar is imported only when complete
    TMPDIR=$tmp $SUDO mmdebstrap --quiet --variant=minbase --keyring="$keyring" \
        --include="apt,ca-certificates${extra:+,$extra}" --aptopt='APT::Install-Recommends "false"' \
        --customize-hook="$hook" "$suite" "$tar" "${sources[@]}" \
    && $SUDO podman import --quiet --change "CMD [\"$cmd\"]" \
        --change "ENV $env" "$tar" "docker.io/library/$tag" >/dev/null
    local rc=$?; rm -f "$tar"; return $rc
}
build_image() {
    case $1 in
        ubuntu:24.04|ubuntu:noble)
            { ubuntu_keyring && bootstrap "$1" noble "$UBUNTU_MIRROR" "main universe" "$UBUNTU_KEYRING"; } \
                || { echo "podman-setup: the Ubuntu archive failed; $1 is Debian bookworm instead" >&2
                     bootstrap "$1" bookworm "$DEBIAN_MIRROR" main /usr/share/keyrings/debian-archive-keyring.gpg; } ;;
        ubuntu:22.04|ubuntu:jammy)
            ubuntu_keyring && bootstrap "$1" jammy "$UBUNTU_MIRROR" "main universe" "$UBUNTU_KEYRING" ;;
        debian:bookworm|debian:12)
            bootstrap "$1" bookworm "$DEBIAN_MIRROR" main /usr/share/keyrings/debian-archive-keyring.gpg ;;
        python:3.12-slim|python:3.12)
            { ubuntu_keyring && bootstrap "$1" noble "$UBUNTU_MIRROR" main "$UBUNTU_KEYRING" python3 "$PYTHON_HOOK"; } \
                || { echo "podman-setup: the Ubuntu archive failed; $1 is Debian bookworm's Python 3.11 instead" >&2
                     bootstrap "$1" bookworm "$DEBIAN_MIRROR" main /usr/share/keyrings/debian-archive-keyring.gpg \
                         python3 "$PYTHON_HOOK"; } ;;
        *) echo "podman-setup: no recipe for base image $1 (known: ubuntu:24.04 ubuntu:22.04 debian:bookworm" \
                "python:3.12-slim)" >&2
           return 2 ;;
    esac
}
for image in $BASE_IMAGES; do
    $SUDO podman image exists "docker.io/library/$image" || build_image "$image"
done
$SUDO podman info --format '{{.Host.OCIRuntime.Name}} {{.Host.CgroupManager}}' >/dev/null
echo "podman-setup: ok ($(podman --version), images: $BASE_IMAGES)"
