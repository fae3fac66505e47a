#!/usr/bin/env bash
# Run the OrbitKV SGLang adapter suite against every qualified SGLang pin (0.5.21, 0.5.23),
# one after the other, or only ORBITKV_SGLANG_PIN when it is set.
#
#   python/tests/sglang/run.sh [pytest args...]
#   ORBITKV_SGLANG_PIN=0.5.23 python/tests/sglang/run.sh -k extra_key
#
# For each pin:
# 1. creates or reuses the pin's cached venv (ORBITKV_SGLANG_PIN=PIN scripts/sglang-venv.sh);
# 2. installs the newest native wheel (target/wheels/orbitkv-*.whl, or $ORBITKV_WHEEL)
#    into it, so `python -m orbitkv serve`, `orbitkv._native` and the plugin entry point
#    are the built ones;
# 3. runs pytest with -rs so every skip reason is printed in the summary, with the venv's
#    bin/ first on PATH (SGLang JIT-builds its page-hash extension with the venv's ninja).
# When the platform cannot install a pin, that pin's suite is still collected and every
# test is skipped with the reason from sglang-venv.sh (never silently).
# Exit status: non-zero when any pin's run failed.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
SUITE="$ROOT/python/tests/sglang"
PINS=(0.5.21 0.5.23)
if [[ -n "${ORBITKV_SGLANG_PIN:-}" ]]; then
    PINS=("$ORBITKV_SGLANG_PIN")
fi
ERR="$(mktemp)"
trap 'rm -f "$ERR"' EXIT

run_pin() {
    local pin="$1"
    shift
    export ORBITKV_SGLANG_PIN="$pin"
    unset ORBITKV_SGLANG_UNAVAILABLE
    echo "run.sh: == SGLang $pin" >&2
    local venv
    : >"$ERR"
    if venv="$("$ROOT/scripts/sglang-venv.sh" 2> >(tee "$ERR" >&2) | tail -n 1)" && [[ -x "$venv/bin/python" ]]; then
        local py="$venv/bin/python" wheel
        wheel="${ORBITKV_WHEEL:-$(ls -t "$ROOT"/target/wheels/orbitkv-*.whl 2>/dev/null | head -n 1)}"
        if [[ -n "$wheel" ]]; then
            echo "run.sh: installing $wheel into $venv" >&2
            "$py" -m pip install --quiet --force-reinstall --no-deps "$wheel" || return 1
        else
            echo "run.sh: no native wheel under target/wheels (build it with maturin); Manager tests will fail" >&2
        fi
        (export PATH="$venv/bin:$PATH" && cd "$SUITE" && "$py" -m pytest -rs -p no:cacheprovider "$SUITE" "$@")
        return
    fi
    sleep 0.1  # let tee flush
    local reason
    reason="$(grep -h 'cannot provide' "$ERR" | tail -n 1)"
    export ORBITKV_SGLANG_UNAVAILABLE="${reason:-scripts/sglang-venv.sh failed for $pin}"
    echo "run.sh: SKIPPING the SGLang $pin adapter suite: $ORBITKV_SGLANG_UNAVAILABLE" >&2
    if python3 -c 'import pytest' 2>/dev/null; then
        (cd "$SUITE" && python3 -m pytest -rs -p no:cacheprovider "$SUITE" "$@")
        return
    fi
    return 0
}

status=0
for pin in "${PINS[@]}"; do
    run_pin "$pin" "$@" || status=1
done
exit "$status"
