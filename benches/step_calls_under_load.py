"""How long an engine step's Manager call (a save's `begin_save` + `abort_save`) waits while
a load of the same process stages its blocks from the SSD tier.

An adapter worker makes both kinds of call: loads (`lookup` + `acquire`) on its pool
threads, saves (`begin_save`, `commit_save`) on the engine's step. A native `Client` has
one connection and holds it for the whole of a call (requests and replies in order), so a
step's save call that comes while a pool thread's `acquire` waits for SSD staging waits
for that staging too. This bench measures it against a real Manager with an SSD tier:

  * `alone`           - the save call with nothing else in flight (baseline, same run);
  * `same_client`     - the same call on the client whose other thread is in an `acquire`
                        of `--load-blocks` blocks staged from SSD (what a worker does today);
  * `separate_client` - the same call on a second connection of the same process during
                        such an `acquire` (what one connection for loads and another for
                        the step's calls would give);
  * `acquire`         - the staging `acquire` itself, for scale.

Each repetition loads blocks that are on SSD only (saved with `--ssd-write-policy eager`,
then pushed out of a DRAM arena smaller than what was saved; the Manager evicts by LRU
here, so the oldest blocks are the SSD-only ones); medians and ranges over `--reps`.
Writes bench-results/step_calls_under_load.json.

    python benches/step_calls_under_load.py [--block-mib 4] [--load-blocks 12] [--reps 8]
        [--ssd-mode direct|kernel] [--workdir /var/tmp]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benches"))

from manager_scaling import write_result  # noqa: E402

from orbitkv import _native  # noqa: E402
from orbitkv.launch import serve_command  # noqa: E402

MiB = 1 << 20


def key(i: int) -> bytes:
    return hashlib.sha256(b"step-calls-%d" % i).digest()


def save_call(c: Any, ns: Any, i: int) -> float:
    """One step-path save call (begin + abort of one block), in seconds."""
    t = time.perf_counter()
    c.abort_save(c.begin_save(ns, [key(10**6 + i)]))
    return time.perf_counter() - t


def during_acquire(loader: Any, lease: Any, caller: Any, ns: Any, i: int) -> tuple[float, float]:
    """(the save call on `caller` started 1 ms into `loader`'s acquire of `lease`, the acquire)."""
    took: list[float] = []

    def load() -> None:
        t = time.perf_counter()
        loader.acquire(lease)
        took.append(time.perf_counter() - t)

    th = threading.Thread(target=load)
    th.start()
    time.sleep(0.001)
    waited = save_call(caller, ns, i)
    th.join()
    loader.release(lease)
    return waited, took[0]


def summary(xs: list[float]) -> dict[str, float]:
    ms = [x * 1e3 for x in xs]
    return {"median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--block-mib", type=int, default=4)
    ap.add_argument("--load-blocks", type=int, default=12, help="blocks each acquire stages from SSD")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--ssd-mode", default="direct", choices=["direct", "kernel"])
    ap.add_argument("--workdir", default="/var/tmp", help="where the Manager's socket and SSD files go")
    ap.add_argument("--out", default="bench-results/step_calls_under_load.json")
    a = ap.parse_args()
    if a.block_mib < 1 or a.load_blocks < 1 or a.reps < 1:
        ap.error("--block-mib, --load-blocks and --reps must be positive")
    bb = a.block_mib * MiB
    # Each repetition loads two ranges of `--load-blocks` blocks (one per case) that are on
    # SSD only: saved first, then pushed out of a DRAM arena of a quarter of them by the
    # blocks saved after them (LRU: the oldest leave first).
    ssd_only = 2 * a.load_blocks * a.reps
    saved = ssd_only + ssd_only // 2
    dram = max(64, ssd_only * a.block_mib // 4)
    rows: dict[str, list[float]] = {"alone": [], "same_client": [], "separate_client": [], "acquire": []}
    with tempfile.TemporaryDirectory(dir=a.workdir, prefix="okv-stepcalls-") as d:
        sock = Path(d) / "m.sock"
        (Path(d) / "ssd").mkdir()
        flags = ["--dram-size", f"{dram}MiB", "--segment-size", f"{max(16, a.block_mib * 4)}MiB"]
        flags += ["--ssd-dir", str(Path(d) / "ssd"), "--ssd-capacity", f"{saved * a.block_mib * 2}MiB"]
        flags += ["--ssd-write-policy", "eager", "--ssd-mode", a.ssd_mode, "--cache-policy", "lru"]
        mgr = subprocess.Popen(serve_command(sock, *flags), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 30
            while not sock.exists():
                if mgr.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the Manager did not start (flags {flags})")
                time.sleep(0.05)
            worker = _native.Client(str(sock), timeout_ms=60000)
            other = _native.Client(str(sock), timeout_ms=60000)
            ns = worker.register_namespace(b"s" * 32, bb)
            ns_other = other.register_namespace(b"s" * 32, bb)
            payload = bytes(range(256)) * (bb // 256)
            for i in range(saved):
                worker.save(ns, [key(i)], [payload])
                # eager write-behind keeps up, so nothing leaves DRAM unwritten
                deadline = time.monotonic() + 60
                while worker.stats()["ssd_blocks"] < i + 1:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"block {i} did not reach the SSD")
                    time.sleep(0.002)
            ranges = iter(range(0, ssd_only, a.load_blocks))
            for r in range(a.reps):
                rows["alone"].append(save_call(worker, ns, 3 * r))
                for c, (name, caller, cns) in enumerate(
                    (("same_client", worker, ns), ("separate_client", other, ns_other))
                ):
                    first = next(ranges)
                    lease = worker.lookup(ns, [key(i) for i in range(first, first + a.load_blocks)])
                    if lease.hit_blocks != a.load_blocks or len(lease.ssd_blocks) != a.load_blocks:
                        raise RuntimeError(
                            f"repetition {r}: {lease.hit_blocks} hits, {len(lease.ssd_blocks)} from SSD "
                            f"(wanted {a.load_blocks} blocks on SSD only)"
                        )
                    waited, acq = during_acquire(worker, lease, caller, cns, 3 * r + 1 + c)
                    rows[name].append(waited)
                    rows["acquire"].append(acq)
            worker.close()
            other.close()
        finally:
            mgr.terminate()
            mgr.wait(30)
    doc: dict[str, Any] = {
        "bench": "step_calls_under_load",
        "block_bytes": bb,
        "load_blocks": a.load_blocks,
        "reps": a.reps,
        "ssd_mode": a.ssd_mode,
        "results": {k: summary(v) for k, v in rows.items() if v},
        "raw_ms": {k: [x * 1e3 for x in v] for k, v in rows.items()},
    }
    for k, v in doc["results"].items():
        print(f"{k:16s} median {v['median_ms']:8.2f} ms  (min {v['min_ms']:.2f}, max {v['max_ms']:.2f})")
    return write_result(a.out, doc)


if __name__ == "__main__":
    raise SystemExit(main())
