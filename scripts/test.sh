#!/usr/bin/env bash
# README command 2: every test. Used verbatim by .ci/run.
#   1. Rust: fmt, clippy -D warnings, unit + property + real-process tests
#   2. the wheel, built and installed into .venv
#   3. Python: ruff, source-only tests, real-process tests through the wheel
#      (as root, 8 huge pages are reserved for the run when fewer are free)
#   4. the vLLM adapter suite on each qualified pin (0.31.0, 0.33.0, 0.34.0), each in its
#      own cached venv under .cache/venvs, git-ignored (8.5 / 9.5 / 9.5 GB; a cold build
#      takes ~4 min a pin on this 2-core box; pip keeps no second copy of the wheels; on a
#      short disk the least recently used venvs are removed to make room for the next
#      one, scripts/venv-lib.sh) — see docs/adapters.md; then the torch-only tests (copy
#      engine on CPU pages, Triton interpreter) in one of those venvs, the wheel installed
#   5. the SGLang adapter suite on each qualified pin (0.5.21, 0.5.23), each in its own
#      cached venv (~2-4 min / 5.3 and 6.0 GB the first time) — see docs/adapters.md
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/dev-env.sh"
cd "$ROOT"
export CARGO_TERM_COLOR=never

# The huge-page tests need 8 free 2 MiB pages. Where fewer are free and this user may
# raise vm.nr_hugepages (root), reserve them for this run and give them back at exit;
# otherwise those tests skip, with the reason in the pytest summary.
HP_SYSCTL=/proc/sys/vm/nr_hugepages
HP_FREE=/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages
if [[ -r "$HP_FREE" && -w "$HP_SYSCTL" ]] && (($(cat "$HP_FREE") < 8)); then
    hp_before="$(cat "$HP_SYSCTL")"
    hp_want=$((hp_before + 8 - $(cat "$HP_FREE")))
    if echo "$hp_want" >"$HP_SYSCTL" 2>/dev/null; then
        trap 'echo "$hp_before" >"$HP_SYSCTL" 2>/dev/null || true' EXIT
        echo "== vm.nr_hugepages $hp_before -> $(cat "$HP_SYSCTL") for the huge-page tests (restored at exit)"
    else
        echo "== could not reserve huge pages (vm.nr_hugepages is read-only here); the huge-page tests will skip"
    fi
fi

# Real dependencies of some tests (etcd for peer membership, a Redis Cluster for the remote
# tier, systemd-analyze for the unit file, a Docker daemon and debootstrap for the
# container image), installed where this user may (root with
# apt-get); otherwise those tests skip or fail with the reason printed.
apt_provide() { # COMMAND WHAT PACKAGE...
    local cmd=$1 what=$2
    shift 2
    command -v "$cmd" >/dev/null 2>&1 && return 0
    [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1 || return 0
    echo "== installing $* for $what"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null 2>&1 ||
        { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null 2>&1; } ||
        echo "== could not install $*; $what will not run"
}
apt_provide etcd "the etcd membership test" etcd-server
apt_provide redis-server "the remote tier's cluster tests" redis-server redis-tools
apt_provide systemd-analyze "the systemd unit's check" systemd
apt_provide dockerd "the container image's build-and-run test" docker.io
apt_provide debootstrap "the container image's local base" debootstrap
# With a Redis server here, its tests must run: a missing server then fails them.
if command -v redis-server >/dev/null 2>&1; then export ORBITKV_REQUIRE_REDIS=1; fi
if command -v systemd-analyze >/dev/null 2>&1; then export ORBITKV_REQUIRE_SYSTEMD=1; fi
if [[ "$(id -u)" == 0 ]] && command -v dockerd >/dev/null 2>&1 && command -v debootstrap >/dev/null 2>&1; then
    export ORBITKV_REQUIRE_CONTAINER=1
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "== cargo test"
log="$(mktemp)"
if ! cargo test --workspace --quiet >"$log" 2>&1; then
    cat "$log"
    echo "cargo test failed" >&2
    exit 1
fi
awk '/^test result:/ { p += $4; f += $6 } END { printf "cargo test: %d passed, %d failed\n", p, f }' "$log"
rm -f "$log"

ensure_venv
whl="$(build_and_install_wheel)"
echo "== installed $(basename "$whl")"

echo "== ruff"
"$VENV/bin/ruff" check python benches
"$VENV/bin/ruff" format --check python benches
echo "== the .pyi stub matches the native module (mypy stubtest)"
"$PY" -m mypy.stubtest orbitkv._native
echo "== mypy (the orbitkv package)"
"$PY" -m mypy python/orbitkv
echo "== pytest (source-only + real Manager processes)"
ORBITKV_REQUIRE_NATIVE=1 "$PY" -m pytest python/tests/unit python/tests/native -q -rs -p no:cacheprovider

echo "== vLLM adapter suite on 0.31.0, 0.33.0 and 0.34.0 (cached venvs; skipped with a printed reason only if the platform cannot install a pin)"
ORBITKV_WHEEL="$whl" python/tests/vllm/run.sh -q -p no:warnings
# The torch-only tests need a torch stack, not a particular vLLM. They run right after the
# vLLM suite, while its venvs are still cached (on a short disk the SGLang venvs built next
# evict them, least recently used first): any pin's venv, else 0.31.0's, built. The wheel is
# installed into it here, since a venv built just now has never seen it.
VLLM_VENV=""
for pin in 0.34.0 0.33.0 0.31.0; do
    VLLM_VENV="$(ORBITKV_VENV_REUSE_ONLY=1 scripts/vllm-venv.sh "$pin" 2>/dev/null | tail -n 1 || true)"
    [[ -x "$VLLM_VENV/bin/python" ]] && break
done
[[ -x "$VLLM_VENV/bin/python" ]] || VLLM_VENV="$(scripts/vllm-venv.sh 2>/dev/null | tail -n 1 || true)"
if [[ -x "$VLLM_VENV/bin/python" ]]; then
    echo "== installing $(basename "$whl") into $VLLM_VENV"
    "$VLLM_VENV/bin/python" -m pip install --quiet --force-reinstall --no-deps "$whl"
    echo "== native tests that need torch (inside the vLLM venv)"
    "$VLLM_VENV/bin/python" -m pytest -q -p no:cacheprovider -p no:warnings python/tests/native/test_torch_buffers.py
    echo "== the copy engine on CPU pages (orbitkv.kvcopy; inside the vLLM venv, without importing vLLM)"
    "$VLLM_VENV/bin/python" -m pytest -q -rs -p no:cacheprovider -p no:warnings python/tests/with_torch python/tests/gpu
    echo "== the one-pass Triton copy kernel on CPU pages, under Triton's interpreter (the same cases, kernel=triton)"
    TRITON_INTERPRET=1 "$VLLM_VENV/bin/python" -m pytest -q -rs -p no:cacheprovider -p no:warnings \
        python/tests/with_torch/test_kvcopy_cpu.py -k triton
else
    echo "== SKIPPING the torch tests (test_torch_buffers, with_torch, gpu): no vLLM venv could be provided (see the vLLM suite's reason above)"
fi
echo "== SGLang adapter suite on 0.5.21 and 0.5.23 (cached venvs; skipped with a printed reason only if the platform cannot install a pin)"
ORBITKV_WHEEL="$whl" python/tests/sglang/run.sh -q -p no:warnings
