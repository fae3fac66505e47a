"""How long an engine step's Manager call (`begin_save` + `abort_save` of one block) takes
while other clients keep the Manager busy: the tail a worker's step sees from the Manager's
own locks and threads, not from its own connection (benches/step_calls_under_load.py
measures that one).

A real Manager with a small DRAM arena and an SSD tier written eagerly. `--churners`
processes, each with its own connection, save chains of four new blocks and, one time in
two, look up, acquire and release a chain saved earlier. DRAM holds a fraction of what they
save, so evictions, SSD write-behind and SSD staging run the whole time. A step client of
its own times one save call every 2 ms. Each point runs twice: first with no churners (the
baseline, same run), then with them. Reported: p50, p99, p99.9 and max in ms, and how many
calls took over 10 and over 50 ms; beside them, the Manager's own BeginSave latency over
every session (its histogram: arrival to reply), which tells the Manager's locks apart from
waiting for a core.

    python benches/step_calls_under_churn.py [--churners 3] [--seconds 15] [--block-mib 1,4]
        [--ssd-mode kernel|direct] [--workdir /var/tmp]

Writes bench-results/step_calls_under_churn.json. On a host with fewer cores than
churners + 2, the tail includes waiting for a core, as it would in an engine on such a host.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing as mp
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benches"))

from manager_scaling import write_result  # noqa: E402

from orbitkv import _native  # noqa: E402
from orbitkv.launch import serve_command  # noqa: E402

MiB = 1 << 20
FINGERPRINT = hashlib.sha256(b"bench step_calls_under_churn").digest()


def key(tag: bytes, i: int) -> bytes:
    return hashlib.sha256(b"%s-%d" % (tag, i)).digest()


def churn(sock: str, w: int, block_bytes: int, stop_at: float, errors: Any) -> None:
    """Save new 4-block chains; one time in two, restore a random earlier one."""
    c = _native.Client(sock, timeout_ms=60000)
    ns = c.register_namespace(FINGERPRINT, block_bytes)
    payload = os.urandom(block_bytes)
    rng = random.Random(w)
    saved: list[list[bytes]] = []
    n = 0
    while time.monotonic() < stop_at:
        chain = [key(b"w%d" % w, n + j) for j in range(4)]
        n += 4
        try:
            c.save(ns, chain, [payload] * 4)
            saved.append(chain)
            if rng.random() < 0.5:
                lease = c.lookup(ns, rng.choice(saved))
                try:
                    if lease.hit_blocks:
                        c.acquire(lease)
                finally:
                    c.release(lease)
        except _native.RestoreFailed:
            pass  # staging found no DRAM to stage into: the engine would recompute
        except Exception as e:  # counted; the bench fails on any
            errors.put(f"churner {w}: {type(e).__name__}: {e}")
            return
    c.close()


def point(workdir: str, churners: int, seconds: float, block_mib: int, ssd_mode: str) -> dict[str, Any]:
    bb = block_mib * MiB
    with tempfile.TemporaryDirectory(dir=workdir, prefix="okv-churn-") as d:
        sock = str(Path(d) / "m.sock")
        (Path(d) / "ssd").mkdir()
        flags = ["--dram-size", "256MiB", "--segment-size", f"{max(16, 4 * block_mib)}MiB"]
        flags += ["--ssd-dir", str(Path(d) / "ssd"), "--ssd-capacity", "3GiB", "--ssd-write-policy", "eager"]
        flags += ["--ssd-mode", ssd_mode]
        mgr = subprocess.Popen(serve_command(sock, *flags), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 30
            while not Path(sock).exists():
                if mgr.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the Manager did not start (flags {flags})")
                time.sleep(0.05)
            ctx = mp.get_context("spawn")
            errors = ctx.Queue()
            warmup = 2.0 if churners else 0.0
            stop_at = time.monotonic() + warmup + seconds + 1.0
            procs = [ctx.Process(target=churn, args=(sock, w, bb, stop_at, errors)) for w in range(churners)]
            for p in procs:
                p.start()
            time.sleep(warmup)
            c = _native.Client(sock, timeout_ms=60000)
            ns = c.register_namespace(FINGERPRINT, bb)
            lat: list[float] = []
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                t = time.perf_counter()
                c.abort_save(c.begin_save(ns, [key(b"step", len(lat))]))
                lat.append((time.perf_counter() - t) * 1e3)
                time.sleep(0.002)
            for p in procs:
                p.join(60)
            stats = c.stats()
            c.close()
            failed = [errors.get() for _ in range(errors.qsize())] if churners else []
            if failed:
                raise RuntimeError("; ".join(failed))
        finally:
            mgr.terminate()
            mgr.wait(30)
    lat.sort()

    def q(f: float) -> float:
        return lat[min(len(lat) - 1, int(f * len(lat)))]

    return {
        "churners": churners,
        "block_bytes": bb,
        "calls": len(lat),
        "p50_ms": q(0.5),
        "p99_ms": q(0.99),
        "p999_ms": q(0.999),
        "max_ms": lat[-1],
        "over_10ms": sum(x > 10 for x in lat),
        "over_50ms": sum(x > 50 for x in lat),
        "ssd_blocks_at_end": stats.get("ssd_blocks"),
        # The Manager's own time for every session's BeginSave (arrival to reply, bucket
        # bounds in µs): what the Manager's locks and threads add, apart from waiting for a core.
        "manager_begin_save_us": stats.get("latency_us", {}).get("begin_save"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--churners", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--block-mib", default="1,4", help="block sizes in MiB, comma-separated")
    ap.add_argument("--ssd-mode", default="kernel", choices=["kernel", "direct"])
    ap.add_argument("--workdir", default="/var/tmp")
    ap.add_argument("--out", default="bench-results/step_calls_under_churn.json")
    a = ap.parse_args()
    try:
        sizes = [int(s) for s in a.block_mib.split(",")]
    except ValueError:
        ap.error(f"--block-mib {a.block_mib!r}: whole numbers of MiB, comma-separated")
    if a.churners < 1 or a.seconds <= 0 or any(s < 1 or s > 16 for s in sizes):
        ap.error("--churners >= 1, --seconds > 0, block sizes 1-16 MiB")
    rows = []
    for mib in sizes:
        for n in (0, a.churners):
            r = point(a.workdir, n, a.seconds, mib, a.ssd_mode)
            rows.append(r)
            print(
                f"{mib:3d} MiB blocks, {n} churners: p50 {r['p50_ms']:.3f}  p99 {r['p99_ms']:.3f}  "
                f"p99.9 {r['p999_ms']:.3f}  max {r['max_ms']:.3f} ms  (>10 ms: {r['over_10ms']}, "
                f">50 ms: {r['over_50ms']}; {r['calls']} calls)"
            )
            m = r["manager_begin_save_us"] or {}
            mean, p99, n = m.get("mean"), m.get("p99_le"), m.get("count")
            print(f"    the Manager's BeginSave (every session): mean {mean} us, p99 <= {p99} us ({n} calls)")
    doc = {
        "bench": "step_calls_under_churn",
        "ssd_mode": a.ssd_mode,
        "seconds_per_point": a.seconds,
        "cpus": os.cpu_count(),
        "rows": rows,
    }
    return write_result(a.out, doc)


if __name__ == "__main__":
    raise SystemExit(main())
