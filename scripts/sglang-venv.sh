#!/usr/bin/env bash
# Create (or reuse) the cached virtual environment holding the pinned SGLang release
# used by OrbitKV's SGLang adapter tests and oracle bench.
#
#   scripts/sglang-venv.sh            # prints the venv path on the last line of stdout
#   ORBITKV_SGLANG_VENV=/path ...     # override the location
#   ORBITKV_SGLANG_PIN=0.5.23 ...     # another pin (its own venv; see docs/adapters.md)
#
# The venv lives outside the repository, keyed by the pin:
#   <repo>/.cache/venvs/sglang-<pin> (git-ignored; ORBITKV_VENV_CACHE=/dir moves it)
# A stamp file records a completed install; an interrupted install is rebuilt.
# When the disk is short, other cached engine venvs are removed, least recently used
# first, to make room (scripts/venv-lib.sh; ORBITKV_KEEP_VENVS=1 keeps them).
# Exit status: 0 ready, 2 the platform cannot install the pin (reason on stderr).
#
# Why not `pip install sglang==<pin>`: one of its GPU-only dependencies is a source
# stub whose build step downloads from a vendor index (not reachable from CPU CI
# machines). The recipe installs exactly what the tested modules import, CPU-only:
#   1. sglang itself with --no-deps;
#   2. torch at the release's own pin (read from its metadata: 2.13.0 for 0.5.21);
#   3. the import closure of sglang.srt.mem_cache (listed in CLOSURE below) under a
#      constraints file holding torch's pin and every `==` pin sglang declares, so
#      nothing pip resolves moves torch, transformers, openai, tokenizers, ...
#   4. ninja (SGLang JIT-builds its SHA-256 page-hash extension on first use; that
#      needs g++ and the OpenSSL headers from the system).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/venv-lib.sh"
# The venv is the cache: a second copy of every wheel in pip's own cache (several GB per
# torch stack) is what filled the CI disk before the last pin could be built.
export PIP_NO_CACHE_DIR="${PIP_NO_CACHE_DIR:-1}"

SGLANG_PIN="${ORBITKV_SGLANG_PIN:-0.5.21}"
PIN_CLOSURE=()
case "$SGLANG_PIN" in
    0.5.21) ;;
    0.5.23) PIN_CLOSURE=(apache-tvm-ffi) ;;  # 0.5.23's cache imports tvm_ffi
    *) echo "sglang-venv: cannot provide sglang==$SGLANG_PIN: no recipe for this pin (known: 0.5.21, 0.5.23)" >&2; exit 2 ;;
esac
# Under the repository's git-ignored .cache/ (a CI that keeps ignored folders reuses it), or
# ORBITKV_VENV_CACHE.
CACHE_ROOT="${ORBITKV_VENV_CACHE:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.cache/venvs}"
VENV="${ORBITKV_SGLANG_VENV:-$CACHE_ROOT/sglang-$SGLANG_PIN}"
STAMP="$VENV/.orbitkv-sglang-stamp"
PYTHON="${PYTHON:-python3}"
# The import closure of sglang.srt.mem_cache.{unified_radix_cache,registry} and the
# pools on CPU, plus the suite's own tools.
CLOSURE=(numpy orjson psutil pybase64 requests packaging pillow starlette msgspec pyzmq
    tqdm IPython pydantic aiohttp transformers torchvision dill sentencepiece
    compressed-tensors gguf openai partial-json-parser ninja ${PIN_CLOSURE[@]+"${PIN_CLOSURE[@]}"})
EXTRA_PKGS=(pytest ruff)
STAMP_CONTENT="sglang==$SGLANG_PIN ${CLOSURE[*]} ${EXTRA_PKGS[*]} v1"

fail() {
    echo "sglang-venv: cannot provide sglang==$SGLANG_PIN: $*" >&2
    exit 2
}

IMPORT_LOG="$(mktemp)"
trap 'rm -f "$IMPORT_LOG"' EXIT
check_import() {
    PATH="$VENV/bin:$PATH" "$VENV/bin/python" - "$SGLANG_PIN" <<'PY' 2>"$IMPORT_LOG"
import sys
from importlib.metadata import version
ok = version("sglang") == sys.argv[1]
import sglang.srt.mem_cache.unified_radix_cache  # noqa: F401
# SGLang's page keys come from a C++ extension it JIT-builds on first use (cached
# under ~/.cache/torch_extensions): build it now, so a missing compiler shows here.
from sglang.srt.mem_cache.cpp_utils.native_hash import _load_native_hash_module
_load_native_hash_module()
sys.exit(0 if ok else 1)
PY
}

if [[ -f "$STAMP" ]] && [[ "$(cat "$STAMP")" == "$STAMP_CONTENT" ]] && check_import; then
    echo "sglang-venv: reusing $VENV" >&2
    mark_venv_used "$VENV"
    echo "$VENV"
    exit 0
fi

check_venv_platform "sglang==$SGLANG_PIN"
command -v g++ >/dev/null 2>&1 \
    || fail "no g++ (SGLang JIT-builds its page-hash extension; install the g++ package)"
[[ -f /usr/include/openssl/sha.h ]] \
    || fail "no OpenSSL headers (SGLang's page-hash extension links -lcrypto; install libssl-dev)"

# The venv takes 5-6 GB; pip holds the downloaded wheels beside it while installing.
start_venv_build "$VENV" 10 "sglang-venv: building $VENV (sglang==$SGLANG_PIN without its GPU dependencies)"
PIP=("$VENV/bin/python" -m pip install --quiet)
"${PIP[@]}" --upgrade pip >&2 || fail "pip upgrade failed (is the package index reachable?)"
"${PIP[@]}" --no-deps "sglang==$SGLANG_PIN" >&2 || { rm -rf "$VENV"; fail "pip install --no-deps sglang==$SGLANG_PIN failed"; }
CONSTRAINTS="$VENV/orbitkv-constraints.txt"
# Every unconditional `name==version` requirement sglang declares, torch's included.
"$VENV/bin/python" - >"$CONSTRAINTS" <<'PY' || { rm -rf "$VENV"; fail "reading sglang's metadata failed"; }
import re
from importlib.metadata import requires
for req in requires("sglang") or []:
    if ";" in req:
        continue
    m = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*==\s*([^,\s]+)\s*", req)
    if m:
        print(f"{m.group(1)}=={m.group(3)}")
PY
TORCH_PIN="$(sed -n 's/^torch==//p' "$CONSTRAINTS")"
[[ -n "$TORCH_PIN" ]] || { rm -rf "$VENV"; fail "sglang==$SGLANG_PIN declares no torch== pin"; }
echo "sglang-venv: torch==$TORCH_PIN (the release's pin)" >&2
"${PIP[@]}" -c "$CONSTRAINTS" "torch==$TORCH_PIN" >&2 || { rm -rf "$VENV"; fail "pip install torch==$TORCH_PIN failed"; }
if ! "${PIP[@]}" -c "$CONSTRAINTS" "${CLOSURE[@]}" "${EXTRA_PKGS[@]}" >&2; then
    rm -rf "$VENV"
    fail "installing the import closure under $CONSTRAINTS failed (network or platform; see pip output above)"
fi
"$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_PIN')" \
    || { rm -rf "$VENV"; fail "torch moved away from $TORCH_PIN while installing the closure"; }
if ! check_import; then
    why="$(grep -v -i 'warn' "$IMPORT_LOG" | tail -n 1)"
    rm -rf "$VENV"
    fail "sglang.srt.mem_cache.unified_radix_cache (or its page-hash extension) does not import on CPU: ${why:-unknown error}"
fi
echo "$STAMP_CONTENT" > "$STAMP"
mark_venv_used "$VENV"
echo "sglang-venv: ready $VENV" >&2
echo "$VENV"
