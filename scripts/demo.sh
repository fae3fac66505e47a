#!/usr/bin/env bash
# README command 1: build + install OrbitKV into .venv, then run the demo on the
# embedded defaults (a Manager with a 1 GiB arena + 4 client processes).
# Extra arguments go to `orbitkv demo` (see `orbitkv demo --help`).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/dev-env.sh"
ensure_venv
build_and_install_wheel >/dev/null
echo "== orbitkv demo $*" >&2
exec "$VENV/bin/orbitkv" demo "$@"
