# Sourced by scripts/vllm-venv.sh and scripts/sglang-venv.sh: what building one cached
# engine venv needs from this machine.
#
#   check_venv_platform PACKAGE==PIN   # Python 3.10-3.14, Linux x86_64/aarch64, python -m venv;
#                                      # otherwise calls the caller's `fail` with the reason
#   make_venv_room CACHE_ROOT NEED_KIB KEEP_DIR
#   start_venv_build VENV NEED_GIB MESSAGE   # an empty venv at VENV, room made for NEED_GIB
#
# An engine venv takes 5-10 GB and pip needs a few more GB beside it while it installs;
# five pins do not fit on every CI disk at once. When the filesystem holding CACHE_ROOT has
# less than NEED_KIB free, the OrbitKV engine venvs cached directly under CACHE_ROOT
# (a directory holding a .orbitkv-*-stamp file; nothing else is ever touched), other than
# KEEP_DIR, are removed least recently used first (mark_venv_used at each use) until
# NEED_KIB is free. Each removal is printed on stderr; a later run rebuilds that pin.
# ORBITKV_KEEP_VENVS=1 removes nothing. Returns 0 when NEED_KIB is free, 1 otherwise
# (the caller refuses to build, naming the shortfall).

check_venv_platform() {
    local what="$1" pyver
    command -v "$PYTHON" >/dev/null 2>&1 || fail "no '$PYTHON' interpreter on PATH"
    pyver="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    "$PYTHON" -c 'import sys; sys.exit(not ((3, 10) <= sys.version_info[:2] < (3, 15)))' \
        || fail "$what needs Python >=3.10,<3.15 (found $pyver)"
    case "$(uname -s)-$(uname -m)" in
        Linux-x86_64 | Linux-aarch64) ;;
        *) fail "no $what wheel for $(uname -s)-$(uname -m) (PyPI ships Linux x86_64/aarch64 only)" ;;
    esac
    "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null \
        || fail "'$PYTHON -m venv' is unavailable (install the python3-venv package)"
}

venv_free_kib() {
    df -Pk "$1" | awk 'NR==2 {print $4}'
}

mark_venv_used() {
    touch "$1/.orbitkv-used" 2>/dev/null || true
}

make_venv_room() {
    local root="$1" need_kib="$2" keep="$3" free dir used
    free="$(venv_free_kib "$root")"
    [[ -n "$free" ]] || return 1
    ((free >= need_kib)) && return 0
    if [[ "${ORBITKV_KEEP_VENVS:-0}" == 1 ]]; then
        echo "venv-room: $((free / 1024)) MiB free under $root, $((need_kib / 1024)) MiB needed;" \
            "ORBITKV_KEEP_VENVS=1, so no cached venv is removed" >&2
        return 1
    fi
    # Candidates: "<last use, seconds> <dir>", oldest first.
    local candidates=()
    for dir in "$root"/*/; do
        dir="${dir%/}"
        [[ "$dir" -ef "$keep" ]] && continue
        [[ -f "$dir/pyvenv.cfg" ]] || continue
        compgen -G "$dir/.orbitkv-*-stamp" >/dev/null || continue
        used="$(stat -c %Y "$dir/.orbitkv-used" 2>/dev/null || stat -c %Y "$dir/pyvenv.cfg")"
        candidates+=("$used $dir")
    done
    local line
    while IFS= read -r line; do
        [[ -n "$line" ]] || continue
        ((free >= need_kib)) && break
        dir="${line#* }"
        echo "venv-room: removing the cached venv $dir (least recently used) to make room:" \
            "$((free / 1024)) MiB free, $((need_kib / 1024)) MiB needed; a later run rebuilds it" \
            "(ORBITKV_KEEP_VENVS=1 keeps cached venvs)" >&2
        rm -rf "$dir"
        free="$(venv_free_kib "$root")"
    done < <(printf '%s\n' ${candidates[@]+"${candidates[@]}"} | sort -n)
    ((free >= need_kib))
}

# Replace VENV (refused when it is something other than a venv) with an empty venv, after
# making NEED_GIB free beside it (make_venv_room); MESSAGE says what is being built.
start_venv_build() {
    local venv="$1" need_gib="$2" message="$3" root
    root="$(dirname "$venv")"
    mkdir -p "$root"
    if [[ -e "$venv" && ! -f "$venv/pyvenv.cfg" ]]; then
        fail "$venv exists and is not a virtual environment; refusing to replace it"
    fi
    echo "$message" >&2
    rm -rf "$venv"
    if ! make_venv_room "$root" $((need_gib * 1024 * 1024)) "$venv"; then
        fail "needs $need_gib GiB free under $root to build (only $(($(venv_free_kib "$root") / 1024)) MiB free, after removing any other cached engine venv there)"
    fi
    "$PYTHON" -m venv "$venv" || fail "python -m venv failed"
}
