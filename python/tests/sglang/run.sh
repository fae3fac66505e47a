#!/usr/bin/env bash
# Run the OrbitKV SGLang adapter suite against every qualified SGLang pin (0.5.21, 0.5.23),
# one after the other, or only ORBITKV_SGLANG_PIN when it is set.
#
#   python/tests/sglang/run.sh [pytest args...]
#   ORBITKV_SGLANG_PIN=0.5.23 python/tests/sglang/run.sh -k extra_key
#
# Each pin's venv comes from ORBITKV_SGLANG_PIN=PIN scripts/sglang-venv.sh; what happens
# per pin (wheel installed, the venv's bin/ first on PATH for SGLang's JIT build, skips
# with the reason when a pin cannot be installed) is described in
# python/tests/support/engine_suite.sh. Exit status: non-zero when any pin's run failed.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
source "$ROOT/python/tests/support/engine_suite.sh"
run_engine_suite SGLang ORBITKV_SGLANG_PIN "$ROOT/scripts/sglang-venv.sh" "$ROOT/python/tests/sglang" \
    0.5.21 0.5.23 -- "$@"
