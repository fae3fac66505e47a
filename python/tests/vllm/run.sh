#!/usr/bin/env bash
# Run the OrbitKV vLLM adapter suite against every qualified vLLM pin (0.31.0, 0.33.0, 0.34.0),
# one after the other, or only ORBITKV_VLLM_PIN when it is set.
#
#   python/tests/vllm/run.sh [pytest args...]
#   ORBITKV_VLLM_PIN=0.33.0 python/tests/vllm/run.sh -k engine_flow
#
# Each pin's venv comes from scripts/vllm-venv.sh PIN; what happens per pin (wheel
# installed, skips with the reason when a pin cannot be installed) is described in
# python/tests/support/engine_suite.sh. Exit status: non-zero when any pin's run failed.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
source "$ROOT/python/tests/support/engine_suite.sh"
run_engine_suite vLLM ORBITKV_VLLM_PIN "$ROOT/scripts/vllm-venv.sh" "$ROOT/python/tests/vllm" \
    0.31.0 0.33.0 0.34.0 -- "$@"
