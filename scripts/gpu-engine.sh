#!/usr/bin/env bash
# Released vLLM on a GPU host, for the GPU engine suite (python/tests/gpu_engine) and
# benches/engine_ttft.py. Two steps, because a GPU host often has no network:
#
#   scripts/gpu-engine.sh fetch PIN [DIR]      # on a machine with network: the wheels vLLM PIN
#                                               # needs beyond the GPU host's own stack, cut into
#                                               # parts of $PART_MIB (48) MiB + DIR/engine.sha256
#   scripts/gpu-engine.sh install DIR [SITE]   # on the GPU host: check the parts, join them,
#                                               # install every wheel into SITE (/tmp/vsite)
#
# Then: export PYTHONPATH=SITE VLLM_USE_V2_MODEL_RUNNER=0 and run the suite (docs/gpu.md).
# The package lists (scripts/gpu-engine/vllm-PIN-device-*.txt) name what a host with
# Python 3.12, torch 2.11 (CUDA 13), Triton and transformers lacks for vLLM PIN: for
# 0.31.0 its torch 2.13.0 stack (torch, triton 3.7.1, NCCL 2.29.7, torchvision 0.28.0)
# and 86 small packages; for 0.33.0 torch 2.14.0, triton 3.8.0, NCCL 2.30.7, torchvision 0.29.0
# and 87 (made from the releases' metadata; installed and run on the H200 on 2026-12-03: flashinfer
# and cuDNN 9.24 are left out as for 0.31.0); 0.34.0's are 0.33.0's plus the CuTe DSL
# (nvidia-cutlass-dsl 4.8.0 with its cu13 libraries, which 0.34's kernel warm-up imports on
# CUDA) and quack-kernels (installed and run on the H200 on 2026-12-04, flashinfer left out).
# The CuTe DSL adds its own packages to sys.path from a .pth file, which a --target install
# does not read: `install` prints the PYTHONPATH that includes them. A host with network can
# `pip install vllm==PIN` (0.34.0: not as declared, see scripts/vllm-venv.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cmd=${1:-}
case "$cmd" in
fetch)
    pin=${2:?usage: gpu-engine.sh fetch PIN [DIR]}
    out=${3:-.gpu-wheels}
    deps="$here/gpu-engine/vllm-$pin-device-deps.txt"
    stack="$here/gpu-engine/vllm-$pin-device-stack.txt"
    [ -f "$deps" ] || { echo "gpu-engine.sh: no package list for vLLM $pin ($deps)" >&2; exit 2; }
    plat=(--only-binary=:all: --python-version 3.12 --implementation cp)
    for p in 2_39 2_35 2_34 2_31 2_28 2_27 2_24 2_18 2_17; do plat+=(--platform "manylinux_${p}_x86_64"); done
    plat+=(--platform manylinux2014_x86_64)
    tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
    mkdir -p "$tmp/wheels" "$out"
    echo "gpu-engine.sh: downloading vLLM $pin and its packages for a Python 3.12 x86-64 GPU host"
    python3 -m pip download -q --no-deps "${plat[@]}" -d "$tmp/wheels" "vllm==$pin" -r "$deps"
    [ -s "$stack" ] && python3 -m pip download -q --no-deps "${plat[@]}" -d "$tmp/wheels" -r "$stack"
    rm -f "$out"/engine.part* "$out"/engine.sha256
    tar -C "$tmp" -cf - wheels | split -b "${PART_MIB:-48}M" -d - "$out/engine.part"
    (cd "$out" && sha256sum engine.part* > engine.sha256)
    echo "gpu-engine.sh: $(ls "$out"/engine.part* | wc -l) parts, $(du -sh "$out" | cut -f1), in $out"
    ;;
install)
    dir=${2:?usage: gpu-engine.sh install DIR [SITE]}
    site=${3:-/tmp/vsite}
    if [ -f "$site/.done" ]; then echo "gpu-engine.sh: already installed in $site"; exit 0; fi
    [ -f "$dir/engine.sha256" ] || { echo "gpu-engine.sh: $dir/engine.sha256 missing" >&2; exit 2; }
    (cd "$dir" && sha256sum -c --quiet engine.sha256) || { echo "gpu-engine.sh: a part is missing or damaged" >&2; exit 2; }
    tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
    cat "$dir"/engine.part* | tar -C "$tmp" -xf -
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$tmp"/wheels/*.whl
    touch "$site/.done"
    path="$site"
    [ -d "$site/nvidia_cutlass_dsl/dsl_packages" ] && path="$site:$site/nvidia_cutlass_dsl/dsl_packages"
    echo "gpu-engine.sh: export PYTHONPATH=$path (plus the orbitkv wheel's site)"
    PYTHONPATH="$path" python3 -c 'import torch, vllm; print("gpu-engine.sh: vllm", vllm.__version__, "torch", torch.__version__, "cuda", torch.cuda.is_available())'
    ;;
*)
    sed -n '2,16p' "$0" >&2; exit 2 ;;
esac
