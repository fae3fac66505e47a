"""The remote tier against the store's own client, same run, same cluster, same sizes.

A real Redis Cluster on loopback (3 masters + 3 replicas, `scripts/redis-cluster.sh`) and
three real Managers (`python -m orbitkv serve`): A and B use the cluster as their remote
tier, C has none.

  remote restore  B restores a chain that only the cluster holds (A committed it and
                  wrote it behind): `lookup` (B reads every block from the cluster, one
                  connection, verifies it and commits it into DRAM) + `restore` into this
                  process + `release`; bytes compared. GB/s of payload.
  redis-benchmark `redis-benchmark --cluster -c 1 -t set,get -d SIZE --csv` against the
                  same cluster: its GET rate x SIZE (the same connection count as the
                  Manager's one; it checks nothing and keeps no copy), over at least 2 GiB
                  so that its fixed start does not cap the rate.
  lookup, cluster down  the cluster stopped, B's breaker open: mean lookup + release of
                  an absent block on B, against C (no remote tier), both with no presence
                  table, interleaved rounds.

Goals (issue 30): remote restore >= 0.8x redis-benchmark's GET throughput at 256 KiB -
4 MiB; the lookup with the cluster down <= 5 us more than without a remote tier.

    python benches/remote_tier.py --out R.json [--sizes 262144,1048576,4194304] [--mib 128] [--reps 3]

Needs Debian's redis-server and redis-tools, and the orbitkv wheel installed.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
BASE_PORT = 21400


def cluster(cmd: str, d: Path) -> None:
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "redis-cluster.sh"), cmd, str(d), str(BASE_PORT)],
        check=True,
        capture_output=True,
    )


def seeds() -> str:
    return ",".join(f"127.0.0.1:{BASE_PORT + i}" for i in range(6))


class Manager:
    def __init__(self, work: Path, name: str, dram: int, *flags: str) -> None:
        from orbitkv import _native
        from orbitkv.launch import serve_command

        self.sock = str(work / f"{name}.sock")
        self.log = open(work / f"{name}.log", "wb")  # closed in stop()
        seg = 256 * MiB
        dram = -(-dram // seg) * seg
        self.proc = subprocess.Popen(
            serve_command(
                self.sock, "--dram-size", str(dram), "--segment-size", str(seg), "--presence-slots", "off", *flags
            ),
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                self.c = _native.Client(self.sock, timeout_ms=60000)
                break
            except _native.ManagerUnavailable:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"Manager {name} did not start; see {work}/{name}.log") from None
                time.sleep(0.05)

    def stat(self, key: str) -> int:
        return int(self.c.stats().get(key, 0))

    def stop(self) -> None:
        self.c.close()
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


# redis-benchmark's rate includes a fixed start (the cluster's slot map, connecting) of
# about a quarter of a second: with the few requests of one restore (16 at 4 MiB) that
# start capped every size at ~0.26 GB/s. It runs at least this many bytes instead; its
# CSV rate is requests over a run time counted in coarse steps (2 GiB runs read 1.71,
# 2.14 or 2.86 GB/s and nothing between), so the runs are long enough for those steps to
# be a few per cent.
RB_MIN_BYTES = 8 << 30


def redis_benchmark(d: Path, size: int, n: int) -> dict[str, Any]:
    n = max(n, RB_MIN_BYTES // size)
    exe = shutil.which("redis-benchmark")
    if exe is None:
        raise RuntimeError("redis-benchmark is not installed (Debian package redis-tools)")
    admin = (d / "admin-password").read_text().strip()
    r = subprocess.run(
        [
            exe,
            "--cluster",
            "-h",
            "127.0.0.1",
            "-p",
            str(BASE_PORT),
            "-a",
            admin,
            "-c",
            "1",
            "-n",
            str(n),
            "-d",
            str(size),
            "-t",
            "set,get",
            "--csv",
        ],
        capture_output=True,
        text=True,
        check=True,
        env=os.environ | {"REDISCLI_AUTH": admin},
    )
    rows = {row[0]: row for row in csv.reader(io.StringIO(r.stdout)) if row}
    get = rows.get("GET")
    if get is None:
        raise RuntimeError(f"redis-benchmark printed no GET row: {r.stdout[-500:]} {r.stderr[-500:]}")
    rps = float(get[1])
    return {"requests_per_s": rps, "gbps": rps * size / 1e9, "requests": n}


def remote_restore(a: Manager, b: Manager, size: int, n: int, tag: str) -> dict[str, Any]:
    from orbitkv.hashing import fingerprint

    fp = fingerprint(bench="remote_tier", block_bytes=size)
    data = os.urandom(n * size)
    hashes = [hashlib.sha256(f"{tag}:{i}".encode()).digest() for i in range(n)]
    ns_a = a.c.register_namespace(fp, size)
    # A write-behind put ends written, failed (errors), skipped (breaker open) or dropped
    # (queue full, or the block gone first); a failed one is not retried (a later miss).
    ends = ("remote_puts_total", "remote_errors_total", "remote_skipped_total", "remote_dropped_blocks_total")
    ends0 = {k: a.stat(k) for k in ends}
    r = a.c.save(ns_a, hashes, data)
    if r.stored != n:
        raise RuntimeError(f"A stored {r.stored} of {n} blocks")
    deadline = time.monotonic() + 120
    while sum(a.stat(k) - ends0[k] for k in ends) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"A settled {sum(a.stat(k) - ends0[k] for k in ends)} of {n} puts in 120 s")
        time.sleep(0.02)
    settled = {k: a.stat(k) - ends0[k] for k in ends}
    ns_b = b.c.register_namespace(fp, size)
    dst = bytearray(n * size)
    filled0 = b.stat("remote_filled_blocks_total")
    t0 = time.perf_counter()
    lease = b.c.lookup(ns_b, hashes)
    t1 = time.perf_counter()
    hit = lease.hit_blocks
    if hit:
        b.c.restore(lease, memoryview(dst)[: hit * size])
    t2 = time.perf_counter()
    b.c.release(lease)
    filled = b.stat("remote_filled_blocks_total") - filled0
    return {
        "blocks": n,
        "hit_blocks": hit,
        "filled_from_remote": filled,
        "written_behind": settled["remote_puts_total"],
        "puts_not_written": {k: v for k, v in settled.items() if k != "remote_puts_total" and v},
        "exact": hit == n and bytes(dst) == data,
        "lookup_s": t1 - t0,
        "restore_s": t2 - t1,
        "gbps": hit * size / (t2 - t0) / 1e9,  # what was served (all n when every put was written)
    }


def lookup_cost(m: Manager, rounds: int, per_round: int) -> list[float]:
    from orbitkv.hashing import fingerprint

    ns = m.c.register_namespace(fingerprint(bench="remote_tier_down", block_bytes=4096), 4096)
    out = []
    for r in range(rounds):
        hs = [hashlib.sha256(f"down:{r}:{i}".encode()).digest() for i in range(per_round)]
        t0 = time.perf_counter()
        for h in hs:
            lease = m.c.lookup(ns, [h])
            m.c.release(lease)
        out.append((time.perf_counter() - t0) / per_round * 1e6)
    return out


def run(args: argparse.Namespace, sizes: list[int], work: Path, d: Path, managers: list[Manager]) -> dict[str, Any]:
    flags = ("--remote-nodes", seeds(), "--remote-password-file", str(d / "password"))
    dram = 2 * args.mib * MiB * args.reps + 256 * MiB
    a = Manager(work, "a", dram, *flags, "--remote-write-queue", str(args.mib * MiB // min(sizes) * 2))
    managers.append(a)
    b = Manager(work, "b", dram, *flags)
    managers.append(b)
    c = Manager(work, "c", 256 * MiB)
    managers.append(c)
    out: dict[str, Any] = {
        "bench": "remote_tier",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "redis": subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.strip(),
        "payload_mib": args.mib,
        "reps": args.reps,
        "sizes": {},
    }
    for size in sizes:
        n = args.mib * MiB // size
        reps = [remote_restore(a, b, size, n, f"{size}:{r}") for r in range(args.reps)]
        rb = [redis_benchmark(d, size, n) for _ in range(args.reps)]
        ours = statistics.median(x["gbps"] for x in reps)
        theirs = statistics.median(x["gbps"] for x in rb)
        exact = all(x["exact"] for x in reps)
        out["sizes"][str(size)] = {
            "remote_restore": reps,
            "redis_benchmark_get": rb,
            "remote_restore_gbps": ours,
            "redis_benchmark_get_gbps": theirs,
            "ratio": ours / theirs,
            "all_exact": exact,
        }
        print(
            f"remote_tier: {size >> 10} KiB: restore {ours:.2f} GB/s, redis-benchmark GET {theirs:.2f} GB/s, "
            f"ratio {ours / theirs:.2f}, exact {exact}",
            flush=True,
        )
    cluster("stop", d)
    lookup_cost(b, 1, 50)  # opens B's breaker (its first requests wait for their deadline)
    down: list[float] = []
    none: list[float] = []
    for _ in range(5):
        down += lookup_cost(b, 1, 2000)
        none += lookup_cost(c, 1, 2000)
    out["lookup_cluster_down_us"] = {
        "remote_down": statistics.median(down),
        "no_remote_tier": statistics.median(none),
        "extra": statistics.median(down) - statistics.median(none),
        # Rounds are bimodal on a 2-core VM (~12 us or ~30-40 us, with and without a
        # remote tier alike: where the scheduler puts the two threads): the best rounds
        # compare the code paths.
        "extra_best": min(down) - min(none),
        "rounds": {"remote_down": down, "no_remote_tier": none},
        "breaker_skipped": b.stat("remote_skipped_total"),
    }
    print(
        f"remote_tier: lookup with the cluster down {statistics.median(down):.1f} us, "
        f"without a remote tier {statistics.median(none):.1f} us (best rounds {min(down):.1f} / {min(none):.1f} us)",
        flush=True,
    )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sizes", default="262144,1048576,4194304")
    ap.add_argument("--mib", type=int, default=128, help="payload per size and repetition")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    if shutil.which("redis-server") is None:
        ap.error("redis-server is not installed (Debian packages redis-server redis-tools)")
    sizes = [int(s) for s in args.sizes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="remote-tier-"))
    d = work / "cluster"
    cluster("start", d)
    managers: list[Manager] = []
    try:
        out = run(args, sizes, work, d, managers)
    finally:
        for m in managers:
            m.stop()
        subprocess.run(["bash", str(ROOT / "scripts" / "redis-cluster.sh"), "stop", str(d)], capture_output=True)
    args.out.write_text(json.dumps(out, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
