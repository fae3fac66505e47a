"""`orbitkv demo`: a synthetic multi-turn chat workload against a real Manager.

Several client processes replay conversations that share one system prompt.
For every turn a client hashes the prompt's complete blocks, looks them up,
restores the hit prefix (verifying every byte), "prefills" the rest (bytes
derived from each block's hash) and saves it. Prints hit rate, bytes moved and
GB/s; exits non-zero if any restored byte is wrong.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from orbitkv._progress import Progress
from orbitkv.hashing import chain_hashes, chain_root, fingerprint
from orbitkv.launch import ManagerStartError, start_serve


@dataclass
class Workload:
    conversations: int = 24
    turns: int = 4
    system_tokens: int = 2048
    user_tokens: int = 256
    reply_tokens: int = 160
    block_tokens: int = 16
    block_bytes: int = 256 * 1024
    seed: int = 7


@dataclass
class WorkerStats:
    lookups: int = 0
    blocks_asked: int = 0
    blocks_hit: int = 0
    bytes_restored: int = 0
    bytes_saved: int = 0
    blocks_refused: int = 0
    restore_seconds: float = 0.0
    save_seconds: float = 0.0
    lookup_seconds: float = 0.0
    mismatches: int = 0
    restores_failed: int = 0
    errors: list[str] = field(default_factory=list)


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1, 32000) for _ in range(n)]


def block_content(h: bytes, block_bytes: int) -> bytes:
    """What 'prefill' produces for a block: derived from its hash, so any
    process can verify restored bytes."""
    return h * (block_bytes // len(h)) + h[: block_bytes % len(h)]


def _worker(socket: str, wl: Workload, convs: list[int], q: Any) -> None:
    from orbitkv import _native

    st = WorkerStats()
    try:
        client = _native.Client(socket, timeout_ms=30000)
        fp = fingerprint(model="orbitkv-demo", block_tokens=wl.block_tokens, block_bytes=wl.block_bytes)
        ns = client.register_namespace(fp, wl.block_bytes)
        root = chain_root(fp)
        system = _tokens(random.Random(wl.seed), wl.system_tokens)
        bb = wl.block_bytes
        max_blocks = (wl.system_tokens + wl.turns * (wl.user_tokens + wl.reply_tokens)) // wl.block_tokens + 1
        restore_buf = bytearray(max_blocks * bb)  # reused, like an engine's KV pages
        # Turn-major, like a server with many chats in flight: every conversation's
        # turn t before any turn t+1, so reuse distances exceed a small arena.
        rngs = {conv: random.Random(wl.seed * 1_000_003 + conv) for conv in convs}
        histories = {conv: list(system) for conv in convs}
        for _turn in range(wl.turns):
            for conv in convs:
                rng, history = rngs[conv], histories[conv]
                history += _tokens(rng, wl.user_tokens)
                hashes = chain_hashes(history, wl.block_tokens, root)
                t0 = time.perf_counter()
                lease = client.lookup(ns, hashes)
                t1 = time.perf_counter()
                st.lookup_seconds += t1 - t0
                st.lookups += 1
                st.blocks_asked += len(hashes)
                hit = lease.hit_blocks
                st.blocks_hit += hit
                if hit:
                    view = memoryview(restore_buf)[: hit * bb]
                    t0 = time.perf_counter()
                    try:
                        st.bytes_restored += client.restore(lease, view)
                    except _native.RestoreFailed:
                        # The Manager could not serve this hit (e.g. no unpinned DRAM to
                        # stage SSD blocks into) and released the lease: recompute the
                        # prefix, as an engine does, and count it.
                        st.restores_failed += 1
                        st.blocks_hit -= hit
                        hit = 0
                    else:
                        client.release(lease)
                        st.restore_seconds += time.perf_counter() - t0
                        for i in range(hit):
                            if view[i * bb : (i + 1) * bb] != block_content(hashes[i], bb):
                                st.mismatches += 1
                missing = hashes[hit:]
                if missing:
                    src = b"".join(block_content(h, bb) for h in missing)
                    t0 = time.perf_counter()
                    r = client.save(ns, missing, src)
                    st.save_seconds += time.perf_counter() - t0
                    st.bytes_saved += r.bytes_copied
                    st.blocks_refused += r.refused
                history += _tokens(rng, wl.reply_tokens)
                q.put(("tick", 1))
        client.close()
    except Exception as e:  # reported to the parent, which fails the run
        st.errors.append(f"{type(e).__name__}: {e}")
    q.put(("done", asdict(st)))


def _memcpy_gbps(nbytes: int = 256 << 20) -> float:
    """Single-thread memcpy between pre-faulted buffers (the host-copy ceiling)."""
    src = bytearray(os.urandom(1 << 20)) * (nbytes >> 20)
    dst = memoryview(bytearray(nbytes))
    dst[:] = src  # fault the destination in
    best = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        dst[:] = src
        best = max(best, nbytes / (time.perf_counter() - t0) / 1e9)
    return best


def _start_manager(
    dram: str, extra: list[str]
) -> tuple[subprocess.Popen[bytes], str, tempfile.TemporaryDirectory[str]]:
    tmp = tempfile.TemporaryDirectory(prefix="orbitkv-demo-")
    sock = os.path.join(tmp.name, "manager.sock")
    try:
        proc = start_serve(sock, "--dram-size", dram, *extra, timeout_s=20, metrics="127.0.0.1:0")
    except ManagerStartError as e:
        raise SystemExit(f"orbitkv demo: {e}") from None
    return proc, sock, tmp


def run(
    socket: str | None,
    clients: int,
    wl: Workload,
    dram: str,
    quiet: bool = False,
    manager_args: list[str] | None = None,
) -> dict[str, Any]:
    from orbitkv import _native

    proc = tmp = None
    if socket is None:
        proc, socket, tmp = _start_manager(dram, manager_args or [])
    try:
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        shards = [list(range(i, wl.conversations, clients)) for i in range(clients)]
        procs = [ctx.Process(target=_worker, args=(socket, wl, s, q)) for s in shards if s]
        bar = Progress(wl.conversations * wl.turns, f"demo: {len(procs)} clients", enabled=None if not quiet else False)
        t0 = time.perf_counter()
        for p in procs:
            p.start()
        results: list[dict[str, Any]] = []
        while len(results) < len(procs):
            kind, payload = q.get(timeout=600)
            if kind == "tick":
                bar.update(payload)
            else:
                results.append(payload)
        wall = time.perf_counter() - t0
        for p in procs:
            p.join()
        bar.close()
        with _native.Client(socket) as c:
            mstats = c.stats()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=20)
        if tmp is not None:
            tmp.cleanup()

    tot = {k: sum(r[k] for r in results) for k in results[0] if k != "errors"}
    errors = [e for r in results for e in r["errors"]]
    restore_gbps = tot["bytes_restored"] / tot["restore_seconds"] / 1e9 if tot["restore_seconds"] else 0.0
    save_gbps = tot["bytes_saved"] / tot["save_seconds"] / 1e9 if tot["save_seconds"] else 0.0
    return {
        "clients": len(results),
        "workload": asdict(wl),
        "wall_seconds": wall,
        "hit_rate": tot["blocks_hit"] / max(tot["blocks_asked"], 1),
        "blocks_asked": tot["blocks_asked"],
        "blocks_hit": tot["blocks_hit"],
        "bytes_restored": tot["bytes_restored"],
        "bytes_saved": tot["bytes_saved"],
        "blocks_refused": tot["blocks_refused"],
        # Per-client copy throughput: bytes / seconds inside restore()/save() calls, summed over clients.
        "restore_gbps_per_client": restore_gbps,
        "save_gbps_per_client": save_gbps,
        "aggregate_gbps": (tot["bytes_restored"] + tot["bytes_saved"]) / wall / 1e9,
        "mean_lookup_ms": 1e3 * tot["lookup_seconds"] / max(tot["lookups"], 1),
        "mismatched_blocks": tot["mismatches"],
        # Hits the Manager could not serve (RestoreFailed): recomputed, not counted as hits.
        "restores_failed": tot["restores_failed"],
        "errors": errors,
        "manager": {
            k: mstats[k]
            for k in (
                "evictions_total",
                "blocks_committed_total",
                "live_leases",
                "live_saves",
                "dram_visible_bytes",
                "dram_capacity_bytes",
                "ssd_spilled_blocks_total",
                "ssd_bytes_written_total",
                "ssd_staged_blocks_total",
                "ssd_demotions_total",
            )
        },
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="orbitkv demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--socket", help="use this running Manager instead of starting one")
    p.add_argument("--clients", type=int, default=4, help="client processes (default 4)")
    p.add_argument("--conversations", type=int, default=Workload.conversations)
    p.add_argument("--turns", type=int, default=Workload.turns)
    p.add_argument("--system-tokens", type=int, default=Workload.system_tokens)
    p.add_argument("--block-kib", type=int, default=Workload.block_bytes // 1024, help="KV bytes per block, KiB")
    p.add_argument("--dram-size", default="1GiB", help="arena of the Manager the demo starts (default 1GiB)")
    p.add_argument("--ssd-dir", help="give the Manager the demo starts an SSD tier in this directory")
    p.add_argument("--ssd-admit-hits", type=int, default=0, help="with --ssd-dir: hits before a block is spilled")
    p.add_argument(
        "--ssd-write-policy",
        default="evict",
        choices=["evict", "eager"],
        help="with --ssd-dir: spill blocks about to be evicted (default) or every admitted block",
    )
    p.add_argument("--ssd-capacity", default="4GiB", help="with --ssd-dir: SSD tier capacity (default 4GiB)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    a = p.parse_args(argv)
    if a.clients < 1 or a.conversations < 1 or a.turns < 1 or a.block_kib < 1:
        p.error("--clients, --conversations, --turns and --block-kib must be positive")
    wl = Workload(
        conversations=a.conversations, turns=a.turns, system_tokens=a.system_tokens, block_bytes=a.block_kib * 1024
    )
    manager_args: list[str] = []
    if a.ssd_dir:
        if a.socket:
            p.error("--ssd-dir configures the Manager the demo starts; it cannot be used with --socket")
        manager_args = [
            "--ssd-dir",
            a.ssd_dir,
            "--ssd-capacity",
            a.ssd_capacity,
            "--ssd-admit-hits",
            str(a.ssd_admit_hits),
            "--ssd-write-policy",
            a.ssd_write_policy,
        ]
    res = run(a.socket, a.clients, wl, a.dram_size, quiet=a.quiet, manager_args=manager_args)
    res["host_memcpy_gbps"] = _memcpy_gbps()
    gib = 1 << 30
    print(
        f"OrbitKV demo: {res['clients']} client processes, {wl.conversations} conversations x {wl.turns} turns, "
        f"{wl.block_bytes // 1024} KiB blocks"
    )
    print(f"  hit rate          {100 * res['hit_rate']:.1f} %  ({res['blocks_hit']}/{res['blocks_asked']} blocks)")
    moved = f"{res['bytes_restored'] / gib:.2f} GiB restored, {res['bytes_saved'] / gib:.2f} GiB saved"
    print(f"  bytes moved       {moved}")
    print(f"  restore           {res['restore_gbps_per_client']:.2f} GB/s per client (inside restore calls)")
    print(f"  save              {res['save_gbps_per_client']:.2f} GB/s per client (inside save calls)")
    print(f"  aggregate         {res['aggregate_gbps']:.2f} GB/s over {res['wall_seconds']:.2f} s wall")
    print(f"  host memcpy       {res['host_memcpy_gbps']:.2f} GB/s single thread, same machine (baseline)")
    print(f"  lookup latency    {res['mean_lookup_ms']:.3f} ms mean")
    print(f"  evictions         {res['manager']['evictions_total']}; refused saves {res['blocks_refused']}")
    if a.ssd_dir:
        mg = res["manager"]
        print(
            f"  SSD tier          {mg['ssd_spilled_blocks_total']} blocks spilled "
            f"({mg['ssd_bytes_written_total'] / gib:.2f} GiB), {mg['ssd_staged_blocks_total']} staged back, "
            f"{mg['ssd_demotions_total']} demoted"
        )
    if res["restores_failed"]:
        print(f"  restores failed   {res['restores_failed']} (the Manager could not serve the hit; recomputed)")
    print(f"  verification      {res['mismatched_blocks']} mismatched blocks")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)
    if res["errors"]:
        for e in res["errors"]:
            print(f"  error: {e}", file=sys.stderr)
        return 1
    return 1 if res["mismatched_blocks"] else 0
