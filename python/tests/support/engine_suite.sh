# Sourced by python/tests/{vllm,sglang}/run.sh: run one engine adapter suite against
# each qualified pin of that engine, one after the other.
#
#   run_engine_suite ENGINE PIN_VAR VENV_SCRIPT SUITE PINS... -- [pytest args...]
#
# ENGINE is the name printed ("vLLM"); PIN_VAR the variable naming one pin (e.g.
# ORBITKV_VLLM_PIN; when set, only that pin runs, and it is exported for the venv script
# and the suite); VENV_SCRIPT prints the pin's venv (given the pin as its argument and in
# PIN_VAR) or fails with "cannot provide ..." on stderr. For each pin:
# 1. creates or reuses the pin's cached venv;
# 2. installs the newest native wheel (target/wheels/orbitkv-*.whl, or $ORBITKV_WHEEL)
#    into it, so `python -m orbitkv serve`, `orbitkv._native` and the entry points are
#    the built ones;
# 3. runs pytest with -rs (every skip reason in the summary), the venv's bin/ first on
#    PATH (SGLang JIT-builds its page-hash extension with the venv's ninja).
# When the platform cannot install a pin, that pin's suite is still collected and every
# test is skipped with the venv script's reason, exported as <PIN_VAR minus _PIN>_UNAVAILABLE
# (never silently). Returns non-zero when any pin's run failed.

run_engine_suite() {
    local engine="$1" pin_var="$2" venv_script="$3" suite="$4"
    shift 4
    local pins=()
    while [[ $# -gt 0 && "$1" != "--" ]]; do
        pins+=("$1")
        shift
    done
    [[ $# -gt 0 ]] && shift
    if [[ -n "${!pin_var:-}" ]]; then
        pins=("${!pin_var}")
    fi
    local root err status=0 pin
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
    err="$(mktemp)"
    for pin in "${pins[@]}"; do
        _run_engine_pin "$root" "$err" "$engine" "$pin_var" "$venv_script" "$suite" "$pin" "$@" || status=1
    done
    rm -f "$err"
    return "$status"
}

_run_engine_pin() {
    local root="$1" err="$2" engine="$3" pin_var="$4" venv_script="$5" suite="$6" pin="$7"
    shift 7
    local unavailable="${pin_var%_PIN}_UNAVAILABLE"
    export "$pin_var=$pin"
    unset "$unavailable"
    echo "run.sh: == $engine $pin" >&2
    local venv
    : >"$err"
    if venv="$("$venv_script" "$pin" 2> >(tee "$err" >&2) | tail -n 1)" && [[ -x "$venv/bin/python" ]]; then
        local py="$venv/bin/python" wheel
        wheel="${ORBITKV_WHEEL:-$(ls -t "$root"/target/wheels/orbitkv-*.whl 2>/dev/null | head -n 1)}"
        if [[ -n "$wheel" ]]; then
            echo "run.sh: installing $wheel into $venv" >&2
            "$py" -m pip install --quiet --force-reinstall --no-deps "$wheel" || return 1
        else
            echo "run.sh: no native wheel under target/wheels (build it with maturin); Manager tests will fail" >&2
        fi
        (export PATH="$venv/bin:$PATH" && cd "$suite" && "$py" -m pytest -rs -p no:cacheprovider "$suite" "$@")
        return
    fi
    sleep 0.1  # let tee flush
    local reason
    reason="$(grep -h 'cannot provide\|not a qualified pin' "$err" | tail -n 1)"
    export "$unavailable=${reason:-$venv_script $pin failed}"
    echo "run.sh: SKIPPING the $engine $pin adapter suite: ${!unavailable}" >&2
    # The skipped suite still runs, so its summary prints the reason for every test;
    # it needs an interpreter with pytest and the orbitkv package (the shared conftest
    # imports it): the project's .venv, which scripts/test.sh builds first.
    local skip_py="${ORBITKV_VENV:-$root/.venv}/bin/python"
    if [[ -x "$skip_py" ]] && "$skip_py" -c 'import pytest, orbitkv' 2>/dev/null; then
        (cd "$suite" && "$skip_py" -m pytest -rs -p no:cacheprovider "$suite" "$@")
        return
    fi
    echo "run.sh: (no interpreter with pytest and orbitkv to print the per-test skips: run scripts/test.sh first)" >&2
    return 0
}
