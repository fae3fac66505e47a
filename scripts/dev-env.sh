#!/usr/bin/env bash
# Shared by scripts/demo.sh and scripts/test.sh: a project virtualenv with the
# build and test tools, and the freshly built abi3 wheel installed into it.
#   source scripts/dev-env.sh; ensure_venv; build_and_install_wheel
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${ORBITKV_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
# mypy and numpy pinned: the type check (scripts/test.sh) reads numpy's stubs, and a new release
# of either could fail it without a change here.
TOOLS=(maturin==1.16.0 pytest numpy==2.4.6 ruff==0.17.6 mypy==2.4.1 pyyaml)

ensure_venv() {
    if [[ ! -x "$PY" ]]; then
        echo "== creating $VENV" >&2
        python3 -m venv "$VENV"
    fi
    if ! "$PY" -c 'import maturin, pytest, numpy, mypy, yaml' >/dev/null 2>&1 || [[ ! -x "$VENV/bin/ruff" ]]; then
        echo "== installing build/test tools into $VENV: ${TOOLS[*]}" >&2
        "$PY" -m pip install --quiet --upgrade pip
        "$PY" -m pip install --quiet "${TOOLS[@]}"
    fi
}

# Builds target/wheels/orbitkv-*.whl (release, abi3) and installs that wheel,
# exactly what a user gets: the package, the native module and the `orbitkv` CLI.
build_and_install_wheel() {
    echo "== building the orbitkv wheel (cargo, release)" >&2
    rm -f "$ROOT"/target/wheels/orbitkv-*.whl
    (cd "$ROOT" && "$VENV/bin/maturin" build --release --quiet --out target/wheels >&2)
    local whl
    whl="$(ls "$ROOT"/target/wheels/orbitkv-*.whl | head -n 1)"
    "$PY" -m pip install --quiet --force-reinstall --no-deps "$whl"
    echo "$whl"
}
