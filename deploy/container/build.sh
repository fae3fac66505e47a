#!/usr/bin/env bash
# Build the OrbitKV Manager image from this repository with one command:
#
#   deploy/container/build.sh [--tag orbitkv-manager:dev] [--base IMAGE] [--uid 1000]
#                             [--debian-base] [--check]
#
# The wheel is built first (scripts/dev-env.sh), unless ORBITKV_WHEEL names one.
#   --base IMAGE    any image with Python >= 3.11 and glibc >= 2.34 [python:3.11-slim-bookworm]
#   --debian-base   no registry at hand: build the base locally with debootstrap (Debian
#                   bookworm, minbase + python3; needs root), cached in $ORBITKV_IMAGE_CACHE
#                   when set, and use it
#   --check         check the inputs and print the build command; build nothing
# Uses docker, or podman when docker is absent ($CONTAINER_ENGINE overrides).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$ROOT/deploy/container"
TAG="orbitkv-manager:dev"
BASE="python:3.11-slim-bookworm"
IMAGE_UID=1000
DEBIAN_BASE=0
CHECK=0

fail() {
    echo "container build: $*" >&2
    exit 2
}

while (($#)); do
    case "$1" in
        --tag) TAG="${2:?--tag needs a value}"; shift 2 ;;
        --base) BASE="${2:?--base needs a value}"; shift 2 ;;
        --uid) IMAGE_UID="${2:?--uid needs a value}"; shift 2 ;;
        --debian-base) DEBIAN_BASE=1; shift ;;
        --check) CHECK=1; shift ;;
        -h | --help) sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) fail "unknown argument $1 (see --help)" ;;
    esac
done
[[ "$IMAGE_UID" =~ ^[1-9][0-9]*$ ]] || fail "--uid $IMAGE_UID must be a positive number (the image never runs as root)"

ENGINE="${CONTAINER_ENGINE:-}"
if [[ -z "$ENGINE" ]]; then
    if command -v docker >/dev/null 2>&1; then ENGINE=docker
    elif command -v podman >/dev/null 2>&1; then ENGINE=podman
    else fail "neither docker nor podman is installed (or set CONTAINER_ENGINE)"; fi
fi
command -v "$ENGINE" >/dev/null 2>&1 || fail "CONTAINER_ENGINE=$ENGINE is not on PATH"

# The wheel: given, or built the way the README's commands build it.
WHEEL="${ORBITKV_WHEEL:-}"
if [[ -z "$WHEEL" ]]; then
    if ((CHECK)); then
        WHEEL="$(ls "$ROOT"/target/wheels/orbitkv-*.whl 2>/dev/null | head -n 1 || true)"
        [[ -n "$WHEEL" ]] || fail "no wheel under target/wheels to check (build one, or set ORBITKV_WHEEL)"
    else
        # shellcheck source=../../scripts/dev-env.sh
        source "$ROOT/scripts/dev-env.sh"
        ensure_venv
        WHEEL="$(build_and_install_wheel | tail -n 1)"
    fi
fi
[[ -f "$WHEEL" ]] || fail "wheel $WHEEL does not exist"
case "$(basename "$WHEEL")" in
    orbitkv-*-abi3-*x86_64.whl | orbitkv-*-abi3-*aarch64.whl) ;;
    *) fail "$WHEEL is not an orbitkv abi3 Linux wheel" ;;
esac

if ((DEBIAN_BASE)); then
    BASE="orbitkv-base:bookworm"
    if ((!CHECK)) && ! "$ENGINE" image inspect "$BASE" >/dev/null 2>&1; then
        command -v debootstrap >/dev/null 2>&1 || fail "--debian-base needs debootstrap (apt-get install debootstrap)"
        [[ "$(id -u)" == 0 ]] || fail "--debian-base needs root (debootstrap)"
        tarball="${ORBITKV_IMAGE_CACHE:+$ORBITKV_IMAGE_CACHE/orbitkv-base-bookworm.tar}"
        if [[ -z "$tarball" || ! -s "$tarball" ]]; then
            rootfs="$(mktemp -d)"
            trap 'rm -rf "$rootfs"' EXIT
            echo "container build: debootstrap bookworm (minbase + python3) into $rootfs" >&2
            debootstrap --variant=minbase --include=python3 bookworm "$rootfs" >&2 \
                || fail "debootstrap failed (is the Debian archive reachable?)"
            rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
            out="${tarball:-$rootfs.tar}"
            mkdir -p "$(dirname "$out")"
            tar -C "$rootfs" -cf "$out" .
            tarball="$out"
        fi
        "$ENGINE" import "$tarball" "$BASE" >/dev/null || fail "$ENGINE import of $tarball failed"
        if [[ "$tarball" == "${rootfs:-}.tar" ]]; then rm -f "$tarball"; fi
    fi
fi

# The build context holds the Containerfile and the wheel only.
CTX="$(mktemp -d)"
trap 'rm -rf "$CTX" ${rootfs:+"$rootfs"}' EXIT
cp "$HERE/Containerfile" "$CTX/Containerfile"
cp "$WHEEL" "$CTX/$(basename "$WHEEL")"
CMD=("$ENGINE" build -f "$CTX/Containerfile" --build-arg "BASE=$BASE" --build-arg "WHEEL=$(basename "$WHEEL")"
    --build-arg "UID=$IMAGE_UID" -t "$TAG" "$CTX")
if ((CHECK)); then
    echo "container build: inputs ok; would run: ${CMD[*]}"
    exit 0
fi
echo "container build: ${CMD[*]}" >&2
"${CMD[@]}" >&2 || fail "$ENGINE build failed"
echo "$TAG"
