#!/usr/bin/env bash
# SSD tier benchmark: fio vs orbitkv-ssd on the same directory, same block sizes and modes,
# plus recovery time for a 100K-block index. Writes bench-results/ssd.json (repo root).
#
# Env: BENCH_DIR (default /var/tmp/orbitkv-ssd-bench; must not be tmpfs), TOTAL (bytes per
# run, default 1 GiB), QD (queue depth for both, default 16), BATCH (blocks per write_batch /
# read_batch call of ours, default 4*QD; in-flight I/O stays capped at QD), REPEAT (median of
# N interleaved fio/ours runs, default 5), RECOVERY_BLOCKS (default 100000).
#
# Fairness: both sides use io_uring at the same queue depth on the same filesystem. Writes:
# fio uses end_fsync=1; ours fdatasyncs data and journal after every write_batch call (its
# default, sync=true) and writes a 4 KiB header per block (not counted as payload). Reads:
# before every read phase the page cache is dropped for the file being read:
# fio with invalidate=1 (its posix_fadvise(POSIX_FADV_DONTNEED) at job start), ours with
# SsdTier::drop_page_cache() (fdatasync + posix_fadvise(DONTNEED) on the data file).
# Ours verifies every block (header key + xxh3 payload checksum) on read.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
CRATE="$ROOT/crates/orbitkv-ssd"
BENCH_DIR="${BENCH_DIR:-/var/tmp/orbitkv-ssd-bench}"
TOTAL="${TOTAL:-1073741824}"
QD="${QD:-16}"
REPEAT="${REPEAT:-5}"
BATCH="${BATCH:-$((QD * 4))}"
RECOVERY_BLOCKS="${RECOVERY_BLOCKS:-100000}"
OUT="$ROOT/bench-results/ssd.json"
RAW="$(mktemp -d)"
trap 'rm -rf "$RAW" "$BENCH_DIR"' EXIT

if ! command -v fio >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fio >/dev/null
    else
        sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fio >/dev/null
    fi
fi

mkdir -p "$BENCH_DIR" "$ROOT/bench-results"
if [ "$(stat -f -c %T "$BENCH_DIR")" = tmpfs ]; then
    echo "BENCH_DIR $BENCH_DIR is tmpfs (no O_DIRECT); pick a disk directory" >&2
    exit 1
fi

echo "building ssd_bench (release)..." >&2
(cd "$CRATE" && CARGO_TARGET_DIR="$ROOT/target/ssd" cargo build --release --example ssd_bench -q)
BIN="$ROOT/target/ssd/release/examples/ssd_bench"

for bs_mib in 1 4 16; do
    bs=$((bs_mib * 1048576))
    for mode in direct kernel; do
        direct=$([ "$mode" = direct ] && echo 1 || echo 0)
        for r in $(seq "$REPEAT"); do
            rm -rf "$BENCH_DIR"/*
            fio --name=w --filename="$BENCH_DIR/fio.dat" --size="$TOTAL" --bs="$bs" --rw=write \
                --ioengine=io_uring --iodepth="$QD" --direct="$direct" --end_fsync=1 \
                --output-format=json >"$RAW/fio-$mode-$bs_mib-write-$r.json"
            fio --name=r --filename="$BENCH_DIR/fio.dat" --size="$TOTAL" --bs="$bs" --rw=read \
                --ioengine=io_uring --iodepth="$QD" --direct="$direct" --invalidate=1 \
                --output-format=json >"$RAW/fio-$mode-$bs_mib-read-$r.json"
            rm -rf "$BENCH_DIR"/*
            for eng in uring psync; do
                "$BIN" throughput --dir "$BENCH_DIR/ours" --mode "$mode" --engine "$eng" \
                    --bs "$bs" --total "$TOTAL" --qd "$QD" --batch "$BATCH" >"$RAW/ours-$eng-$mode-$bs_mib-$r.json"
            done
            echo "bs=${bs_mib}MiB mode=$mode run $r done" >&2
        done
    done
done

echo "recovery: $RECOVERY_BLOCKS blocks..." >&2
rm -rf "$BENCH_DIR"/*
"$BIN" recovery --dir "$BENCH_DIR/rec" --mode direct --blocks "$RECOVERY_BLOCKS" --bs 4096 --qd 64 \
    >"$RAW/recovery-direct.json"
"$BIN" recovery --dir "$BENCH_DIR/rec" --mode kernel --blocks "$RECOVERY_BLOCKS" --bs 4096 --qd 64 \
    >"$RAW/recovery-kernel.json"

python3 - "$RAW" "$OUT" "$TOTAL" "$QD" "$REPEAT" "$BENCH_DIR" "$BATCH" <<'PY'
import json, os, platform, statistics, sys
raw, out, total, qd, repeat, bdir, batch = sys.argv[1:]
repeat = int(repeat)
def med(xs): return round(statistics.median(xs), 1)
rows = []
for bs_mib in (1, 4, 16):
    for mode in ("direct", "kernel"):
        for op in ("write", "read"):
            fio = []
            ours = {"uring": [], "psync": []}
            for r in range(1, repeat + 1):
                j = json.load(open(f"{raw}/fio-{mode}-{bs_mib}-{op}-{r}.json"))
                fio.append(j["jobs"][0][op]["bw_bytes"] / 1e6)
                for eng in ours:
                    o = json.load(open(f"{raw}/ours-{eng}-{mode}-{bs_mib}-{r}.json"))
                    ours[eng].append(o[f"{op}_MBps"])
            f, u, p = med(fio), med(ours["uring"]), med(ours["psync"])
            rows.append({"mode": mode, "bs_MiB": bs_mib, "op": op, "fio_MBps": f,
                         "ours_uring_MBps": u, "ours_psync_MBps": p,
                         "fio_range": [round(min(fio), 1), round(max(fio), 1)],
                         "ours_uring_range": [min(ours["uring"]), max(ours["uring"])],
                         "ratio_uring_over_fio": round(u / f, 3) if f else None,
                         "ratio_psync_over_fio": round(p / f, 3) if f else None})
rec = {m: json.load(open(f"{raw}/recovery-{m}.json")) for m in ("direct", "kernel")}
res = {
    "bench": "orbitkv-ssd vs fio",
    "dir": bdir, "bytes_per_run": int(total), "queue_depth": int(qd), "ours_batch_items": int(batch),
    "repeats": repeat, "statistic": "median (min/max in *_range); fio and ours interleaved per repeat",
    "kernel": platform.release(), "cpus": os.cpu_count(),
    "fairness": ("same dir, same bs, io_uring at the same iodepth on both sides; fio writes "
                 "end_fsync=1, ours fdatasync data+journal per write_batch call (BATCH blocks, at most QD in flight) and writes a 4 KiB "
                 "header per block (payload bytes counted only); page cache dropped before reads: "
                 "fio invalidate=1, ours posix_fadvise(DONTNEED) via SsdTier::drop_page_cache"),
    "throughput": rows,
    "recovery_100k": rec,
}
json.dump(res, open(out, "w"), indent=2)
print(json.dumps(res, indent=2))
PY
echo "wrote $OUT" >&2
