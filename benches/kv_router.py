"""A KV-aware router built only from the Managers' KV events: does it know which host
holds each request's longest prefix?

Starts `--hosts` Managers (fresh, DRAM only, `--capacity` blocks each, `--kv-events` on a
loopback port), and a router that subscribes to every Manager's stream, decodes each batch
with the installed vLLM's own `KVEventBatch` (msgspec, as vLLM's consumers do) and keeps,
per host, the set of block hashes the events say are there (`BlockStored` adds,
`BlockRemoved` removes, `AllBlocksCleared` empties). Then a trace (Mooncake FAST25 JSONL,
`hash_ids`; or `--generate N` seeded multi-turn chats, `trace_replay.py`'s) is replayed in order; per request:

1. the router predicts, per host, the longest prefix of the request's blocks its view
   holds, and routes the request to the host with the longest when it is 2 blocks or more,
   else (and among ties) to the host given the fewest requests so far;
2. every host is asked for real (`lookup`, released at once): the hits it would serve;
3. the request's blocks after the chosen host's hit are saved there (evicting as the
   arena fills: `BlockRemoved` events), and the router waits until the stored blocks are
   in its view (at most `--settle-ms`, then 3 ms more for the evictions of the same save;
   `--settle-ms 0`: no wait, the next request is predicted with whatever lag the stream has).

A prediction **matches** when the longest predicted prefix equals the longest real hit and
the predicted best host is one of the real best hosts. Also reported: per-host exact
matches, the event lag (save returned → its blocks in the view), sequence gaps.

Runs in a venv with vLLM (for `vllm.distributed.kv_events`), pyzmq and the orbitkv wheel:
the vLLM test venv (`scripts/vllm-venv.sh`), e.g.

  $(scripts/vllm-venv.sh 0.33.0 | tail -1)/bin/python benches/kv_router.py \\
      --trace conversation_trace.jsonl --limit 4000 --capacity 2048 --out kv_router.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

KiB = 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def load_trace(path: str, limit: int) -> list[list[int]]:
    """The block ids of the first `limit` requests (0: all) of a FAST25 trace."""
    from trace_replay import read_requests  # this script's folder is on sys.path

    ids = [obj["hash_ids"] for obj in read_requests(path)]
    return ids[:limit] if limit else ids


def block_hash(block_id: int) -> bytes:
    return block_id.to_bytes(8, "little") + b"kv-router-bench" + bytes(9)


class View:
    """One host's blocks as its event stream says, keyed by hash and medium (a block moves
    between `CPU`, the Manager's DRAM, and `STORAGE`, its SSD): a SUB socket read on a
    thread. A block is on the host while it is in any medium."""

    def __init__(self, endpoint: str) -> None:
        import msgspec
        import zmq
        from vllm.distributed.kv_events import KVEventBatch

        self.blocks: dict[bytes, set[str]] = {}
        self.lock = threading.Lock()
        self.batches = 0
        self.events = 0
        self.gaps = 0
        self._last_seq: int | None = None
        self._decoder = msgspec.msgpack.Decoder(KVEventBatch)
        self._ctx = zmq.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.connect(endpoint)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

        while not self._stop.is_set():
            if not self._sub.poll(50):
                continue
            _topic, seq, payload = self._sub.recv_multipart()
            s = int.from_bytes(seq, "big")
            batch = self._decoder.decode(payload)
            with self.lock:
                if self._last_seq is not None and s != self._last_seq + 1:
                    self.gaps += 1
                self._last_seq = s
                self.batches += 1
                for e in batch.events:
                    self.events += 1
                    if isinstance(e, BlockStored):
                        for h in e.block_hashes:
                            self.blocks.setdefault(h, set()).add(e.medium)
                    elif isinstance(e, BlockRemoved):
                        for h in e.block_hashes:
                            media = self.blocks.get(h)
                            if media is not None:
                                media.discard(e.medium)
                                if not media:
                                    del self.blocks[h]
                    elif isinstance(e, AllBlocksCleared):
                        self.blocks.clear()

    def prefix(self, hashes: list[bytes]) -> int:
        with self.lock:
            n = 0
            for h in hashes:
                if h not in self.blocks:
                    break
                n += 1
            return n

    def holds(self, hashes: list[bytes]) -> bool:
        with self.lock:
            return all(h in self.blocks for h in hashes)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sub.close(0)
        self._ctx.term()


def run(trace: list[list[int]], hosts: int, capacity: int, block: int, settle_ms: float, quiet: bool) -> dict[str, Any]:
    from orbitkv import _native
    from orbitkv.launch import start_serve

    tmp = tempfile.mkdtemp(prefix="kv-router-", dir="/tmp")
    procs, clients, nss, views = [], [], [], []
    try:
        for i in range(hosts):
            d = os.path.join(tmp, f"m{i}")
            os.mkdir(d, 0o700)
            sock = os.path.join(d, "m.sock")
            endpoint = f"tcp://127.0.0.1:{free_port()}"
            dram = capacity * block
            args = ["--dram-size", str(dram), "--segment-size", str(dram), "--kv-events", endpoint]
            args += ["--presence-slots", "off"]
            procs.append(start_serve(sock, *args, timeout_s=30))
            views.append(View(endpoint))
            c = _native.Client(sock, timeout_ms=30000)
            clients.append(c)
            nss.append(c.register_namespace(b"r" * 32, block))
        time.sleep(0.5)  # a SUB socket misses what is published before it joined
        zeros = bytearray(max(len(r) for r in trace) * block)
        matches = exact = asked = 0
        routed = [0] * hosts
        lags: list[float] = []
        late = 0
        mismatch_examples: list[dict[str, Any]] = []
        t0 = time.perf_counter()
        for n, ids in enumerate(trace):
            hashes = [block_hash(b) for b in ids]
            predicted = [v.prefix(hashes) for v in views]
            actual = []
            for c, ns in zip(clients, nss, strict=True):
                with c.lookup(ns, hashes) as lease:
                    actual.append(int(lease.hit_blocks))
            asked += 1
            best_p, best_a = max(predicted), max(actual)
            hosts_p = {i for i, p in enumerate(predicted) if p == best_p}
            hosts_a = {i for i, a in enumerate(actual) if a == best_a}
            if best_p == best_a and hosts_p & hosts_a:
                matches += 1
            elif len(mismatch_examples) < 10:
                mismatch_examples.append({"request": n, "predicted": predicted, "actual": actual})
            exact += sum(1 for p, a in zip(predicted, actual, strict=True) if p == a)
            # Route: to the longest predicted prefix when it is 2 blocks or more (a
            # conversation goes back to the host holding its turns); else, and among ties,
            # to the host given the fewest requests so far (a block 0 shared by every
            # request would otherwise send everything to one host).
            candidates = hosts_p if best_p >= 2 else set(range(hosts))
            host = min(sorted(candidates), key=lambda i: routed[i])
            routed[host] += 1
            hit = actual[host]
            if hit < len(hashes):
                rest = hashes[hit:]
                r = clients[host].save(nss[host], rest, memoryview(zeros)[: len(rest) * block])
                stored = r.stored
                t_saved = time.perf_counter()
                deadline = t_saved + settle_ms / 1000
                while not views[host].holds(rest) and time.perf_counter() < deadline:
                    time.sleep(0.0002)
                if views[host].holds(rest):
                    lags.append(time.perf_counter() - t_saved)
                elif stored == len(rest):
                    late += 1  # not all in the view in time (or evicted by a later save already)
                if settle_ms > 0:
                    time.sleep(0.003)  # the evictions of the same save arrive in the same drain
            if not quiet and (n + 1) % 500 == 0:
                print(f"\r  {n + 1}/{len(trace)} requests, match {matches / asked:.4f}", end="", file=sys.stderr)
        wall = time.perf_counter() - t0
        if not quiet:
            print(file=sys.stderr)
        stats = [c.stats() for c in clients]
        lags.sort()
        return {
            "requests": asked,
            "hosts": hosts,
            "capacity_blocks": capacity,
            "block_bytes": block,
            "match_rate": matches / max(asked, 1),
            "host_exact_rate": exact / max(asked * hosts, 1),
            "mismatch_examples": mismatch_examples,
            "event_lag_ms": {
                "p50": 1e3 * lags[len(lags) // 2] if lags else None,
                "p99": 1e3 * lags[int(len(lags) * 0.99)] if lags else None,
                "max": 1e3 * lags[-1] if lags else None,
            },
            "saves_not_in_view_within_settle": late,
            "sequence_gaps": sum(v.gaps for v in views),
            "batches": sum(v.batches for v in views),
            "events": sum(v.events for v in views),
            "routed": routed,
            "evictions": [s["evictions_total"] for s in stats],
            "kv_events_dropped": [s["kv_events_dropped_total"] for s in stats],
            "wall_seconds": wall,
        }
    finally:
        for v in views:
            v.close()
        for c in clients:
            c.close()
        for p in procs:
            p.terminate()
            p.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default=None, help="trace file (FAST25 JSONL)")
    ap.add_argument("--generate", type=int, default=0, help="replay N seeded generated chat requests instead")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--limit", type=int, default=0, help="only the first N requests of --trace")
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--capacity", type=int, default=2048, help="DRAM blocks per Manager")
    ap.add_argument("--block-bytes", type=int, default=16 * KiB)
    ap.add_argument(
        "--settle-ms",
        type=float,
        default=200.0,
        help="longest wait for a save's blocks in the view (0: no wait at all, the router predicts with its lag)",
    )
    ap.add_argument("--out", default="bench-results/kv_router.json")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args()
    if bool(a.trace) == bool(a.generate):
        ap.error("give exactly one of --trace FILE and --generate N")
    if a.hosts < 1 or a.capacity < 1 or a.block_bytes < 4 * KiB or a.block_bytes % (4 * KiB):
        ap.error("--hosts and --capacity must be >= 1, --block-bytes a positive multiple of 4096")
    from trace_replay import generate  # seeded multi-turn chats, as trace_replay.py replays them

    trace = load_trace(a.trace, a.limit) if a.trace else generate(a.generate, a.seed)
    name = Path(a.trace).stem if a.trace else f"generated-{a.generate}-seed{a.seed}"
    r = run(trace, a.hosts, a.capacity, a.block_bytes, a.settle_ms, a.quiet)
    r["trace"] = name
    print(
        f"{name}: {r['requests']} requests over {a.hosts} Managers of {a.capacity} blocks: the router's longest "
        f"prefix matched the real lookups for {r['match_rate']:.4f} of requests (per host {r['host_exact_rate']:.4f}); "
        f"event lag p50 {r['event_lag_ms']['p50']} ms; {r['sequence_gaps']} sequence gaps; "
        f"evictions {r['evictions']}"
    )
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"bench": "kv_router", **r}, indent=2) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
