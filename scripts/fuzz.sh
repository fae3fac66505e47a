#!/usr/bin/env bash
# Fuzz every decoder that reads bytes from another process (libFuzzer via cargo-fuzz).
#   scripts/fuzz.sh [seconds per target, default 60]
# cargo-fuzz needs nightly flags; the stable toolchain is used with RUSTC_BOOTSTRAP=1.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../fuzz"
secs="${1:-60}"
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
export RUSTC_BOOTSTRAP=1
for t in decode_request decode_response read_frame decode_peer presence_reader remote_value; do
    echo "== fuzz $t for ${secs}s"
    cargo fuzz run "$t" -- -max_total_time="$secs" -max_len=4096 2>&1 | grep -E "^Done|ERROR|SUMMARY|panicked"
done
