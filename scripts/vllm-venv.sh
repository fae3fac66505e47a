#!/usr/bin/env bash
# Create (or reuse) the cached virtual environment holding the pinned vLLM release
# used by OrbitKV's vLLM adapter tests and benchmark.
#
#   scripts/vllm-venv.sh [PIN]      # PIN: a qualified pin (0.31.0 default, 0.33.0, 0.34.0);
#                                   # prints the venv path on the last line of stdout
#   ORBITKV_VLLM_VENV_0_33_0=/path  # override the location of one pin's venv (dots -> _)
#   ORBITKV_VLLM_VENV=/path ...     # the same, for the default pin 0.31.0 only
#   ORBITKV_VENV_REUSE_ONLY=1 ...   # print the venv only if it is built already; exit 3 if not
#
# The venv is cached per pin in the repository's git-ignored .cache/venvs/vllm-<pin>
# (ORBITKV_VENV_CACHE=/dir moves the cache), so repeated runs reuse it.
# A stamp file records a completed install; an interrupted install is rebuilt.
# When the disk is short, other cached engine venvs are removed, least recently used
# first, to make room (scripts/venv-lib.sh; ORBITKV_KEEP_VENVS=1 keeps them).
# Exit status: 0 ready, 2 the platform cannot install the pin (reason on stderr),
# 3 not built and ORBITKV_VENV_REUSE_ONLY=1.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/venv-lib.sh"
# The venv is the cache: a second copy of every wheel in pip's own cache (several GB per
# torch stack) is what filled the CI disk before the last pin could be built.
export PIP_NO_CACHE_DIR="${PIP_NO_CACHE_DIR:-1}"

# The qualified pins; python/orbitkv/vllm/compat/ has one module per pin.
QUALIFIED_PINS=(0.31.0 0.33.0 0.34.0)
# Pins that declare a dependency PyPI does not publish, with what replaces it
# ("declared->installed", space-separated): vLLM 0.34.0 pins flashinfer-python==0.7.3,
# absent from PyPI (0.7.2.post1 and 0.7.4 are there), so `pip install vllm==0.34.0`
# cannot resolve; the nearest later release stands in (the CPU suites never load it).
declare -A DEP_OVERRIDES=(
    [0.34.0]="flashinfer-python==0.7.3->flashinfer-python==0.7.4"
)
VLLM_PIN="${1:-0.31.0}"
if [[ " ${QUALIFIED_PINS[*]} " != *" $VLLM_PIN "* ]]; then
    echo "vllm-venv: vllm==$VLLM_PIN is not a qualified pin (qualified: ${QUALIFIED_PINS[*]})" >&2
    exit 2
fi
# Under the repository's git-ignored .cache/ (a CI that keeps ignored folders reuses it), or
# ORBITKV_VENV_CACHE.
CACHE_ROOT="${ORBITKV_VENV_CACHE:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.cache/venvs}"
PIN_VAR="ORBITKV_VLLM_VENV_${VLLM_PIN//./_}"
if [[ -n "${!PIN_VAR:-}" ]]; then
    VENV="${!PIN_VAR}"
elif [[ "$VLLM_PIN" == "0.31.0" && -n "${ORBITKV_VLLM_VENV:-}" ]]; then
    VENV="$ORBITKV_VLLM_VENV"
else
    VENV="$CACHE_ROOT/vllm-$VLLM_PIN"
fi
STAMP="$VENV/.orbitkv-vllm-stamp"
PYTHON="${PYTHON:-python3}"
# Extra tools the suite needs inside the venv (not pulled by vLLM itself).
EXTRA_PKGS=(pytest ruff)
STAMP_CONTENT="vllm==$VLLM_PIN ${EXTRA_PKGS[*]}${DEP_OVERRIDES[$VLLM_PIN]:+ ${DEP_OVERRIDES[$VLLM_PIN]}}"

fail() {
    echo "vllm-venv: cannot provide vllm==$VLLM_PIN: $*" >&2
    exit 2
}

if [[ -f "$STAMP" ]] && [[ "$(cat "$STAMP")" == "$STAMP_CONTENT" ]] \
    && "$VENV/bin/python" -c "import vllm, sys; sys.exit(vllm.__version__ != '$VLLM_PIN')" 2>/dev/null; then
    echo "vllm-venv: reusing $VENV" >&2
    mark_venv_used "$VENV"
    echo "$VENV"
    exit 0
fi
if [[ "${ORBITKV_VENV_REUSE_ONLY:-0}" == 1 ]]; then
    echo "vllm-venv: vllm==$VLLM_PIN is not built under $VENV (ORBITKV_VENV_REUSE_ONLY=1)" >&2
    exit 3
fi

check_venv_platform "vllm==$VLLM_PIN"

# The venv takes 8.5-9.5 GB; pip holds the downloaded wheels beside it while installing
# (peak 11.5 GB measured building 0.33.0 with pip keeping no cache).
start_venv_build "$VENV" 14 "vllm-venv: building $VENV (vllm==$VLLM_PIN, ~4 min, 8.5-9.5 GB)"
"$VENV/bin/python" -m pip install --quiet --upgrade pip >&2 || fail "pip upgrade failed (is PyPI reachable?)"
if [[ -n "${DEP_OVERRIDES[$VLLM_PIN]:-}" ]]; then
    # vLLM itself without its declared dependencies, then those dependencies as declared
    # in its METADATA (extras left out) with the overridden ones replaced.
    declared="$VENV/.orbitkv-vllm-requirements.txt"
    if ! "$VENV/bin/python" -m pip install --quiet --no-deps "vllm==$VLLM_PIN" >&2 \
        || ! "$VENV/bin/python" - "$VLLM_PIN" "${DEP_OVERRIDES[$VLLM_PIN]}" >"$declared" <<'PY'
import sys
from importlib.metadata import requires

pin, overrides = sys.argv[1], dict(o.split("->") for o in sys.argv[2].split())
reqs = [r for r in requires("vllm") or [] if "extra ==" not in r]
missing = [o for o in overrides if o not in reqs]
if missing:
    sys.exit(f"vllm=={pin} no longer declares {missing}: update DEP_OVERRIDES")
print("\n".join(overrides.get(r, r) for r in reqs))
PY
    then
        rm -rf "$VENV"
        fail "installing vllm==$VLLM_PIN without its dependencies failed (see above)"
    fi
    echo "vllm-venv: vllm==$VLLM_PIN declares a dependency PyPI does not publish; installing its other" \
        "dependencies as declared, with: ${DEP_OVERRIDES[$VLLM_PIN]}" >&2
    if ! "$VENV/bin/python" -m pip install --quiet -r "$declared" "${EXTRA_PKGS[@]}" >&2; then
        rm -rf "$VENV"
        fail "pip install of vllm==$VLLM_PIN's dependencies failed (network, disk or platform; see pip output above)"
    fi
elif ! "$VENV/bin/python" -m pip install --quiet "vllm==$VLLM_PIN" "${EXTRA_PKGS[@]}" >&2; then
    rm -rf "$VENV"
    fail "pip install vllm==$VLLM_PIN failed (network, disk or platform; see pip output above)"
fi
"$VENV/bin/python" -c "import vllm, sys; sys.exit(vllm.__version__ != '$VLLM_PIN')" \
    || { rm -rf "$VENV"; fail "installed vllm does not import or is not $VLLM_PIN"; }
echo "$STAMP_CONTENT" > "$STAMP"
mark_venv_used "$VENV"
echo "vllm-venv: ready $VENV" >&2
echo "$VENV"
