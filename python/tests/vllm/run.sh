#!/usr/bin/env bash
# Run the OrbitKV vLLM adapter suite against every qualified vLLM pin (0.31.0, 0.33.0),
# one after the other, or only ORBITKV_VLLM_PIN when it is set.
#
#   python/tests/vllm/run.sh [pytest args...]
#   ORBITKV_VLLM_PIN=0.33.0 python/tests/vllm/run.sh -k engine_flow
#
# For each pin:
# 1. creates or reuses the pin's cached venv (scripts/vllm-venv.sh PIN);
# 2. installs the newest native wheel (target/wheels/orbitkv-*.whl, or $ORBITKV_WHEEL)
#    into it, so `python -m orbitkv serve` and `orbitkv._native` are the built ones;
# 3. runs pytest with -rs so every skip reason is printed in the summary.
# When the platform cannot install a pin, that pin's suite is still collected and every
# test is skipped with the reason from vllm-venv.sh (never silently).
# Exit status: non-zero when any pin's run failed.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
SUITE="$ROOT/python/tests/vllm"
PINS=(0.31.0 0.33.0)
if [[ -n "${ORBITKV_VLLM_PIN:-}" ]]; then
    PINS=("$ORBITKV_VLLM_PIN")
fi
ERR="$(mktemp)"
trap 'rm -f "$ERR"' EXIT

run_pin() {
    local pin="$1"
    shift
    export ORBITKV_VLLM_PIN="$pin"
    unset ORBITKV_VLLM_UNAVAILABLE
    echo "run.sh: == vLLM $pin" >&2
    local venv
    : >"$ERR"
    if venv="$("$ROOT/scripts/vllm-venv.sh" "$pin" 2> >(tee "$ERR" >&2) | tail -n 1)" && [[ -x "$venv/bin/python" ]]; then
        local py="$venv/bin/python" wheel
        wheel="${ORBITKV_WHEEL:-$(ls -t "$ROOT"/target/wheels/orbitkv-*.whl 2>/dev/null | head -n 1)}"
        if [[ -n "$wheel" ]]; then
            echo "run.sh: installing $wheel into $venv" >&2
            "$py" -m pip install --quiet --force-reinstall --no-deps "$wheel" || return 1
        else
            echo "run.sh: no native wheel under target/wheels (build it with maturin); Manager tests will fail" >&2
        fi
        (cd "$SUITE" && "$py" -m pytest -rs -p no:cacheprovider "$SUITE" "$@")
        return
    fi
    sleep 0.1  # let tee flush
    local reason
    reason="$(grep -h 'cannot provide\|not a qualified pin' "$ERR" | tail -n 1)"
    export ORBITKV_VLLM_UNAVAILABLE="${reason:-scripts/vllm-venv.sh $pin failed}"
    echo "run.sh: SKIPPING the vLLM $pin adapter suite: $ORBITKV_VLLM_UNAVAILABLE" >&2
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
