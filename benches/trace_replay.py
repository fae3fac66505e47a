"""Replay a prefix-block trace through a real Manager from several client processes.

Reads the public Mooncake FAST25 trace format (one JSON object per line with
`hash_ids`, one id per 512-token prefix block, and `timestamp` in milliseconds, used
only with `--pace`; `input_length` and `output_length` are ignored), supplied by the
user, or generates a seeded multi-turn chat trace (`--generate N`; no timestamps).
Nothing is downloaded. For every (trace, capacity, policy): a fresh `orbitkv serve`
with a DRAM arena of `capacity` blocks (and, with `--ssd-blocks`, an SSD tier of that
many more), `--cache-policy` set, then `--clients` processes replay the requests
(each takes the next request in trace order when it is free, so up to `clients`
requests are in flight, as in a server): `lookup` → `restore`
of the hit prefix (every restored byte compared with the bytes saved for that block
id) → `release` → `save` of the blocks after the hit. Requests go back to back by
default; `--pace X` issues each no earlier than its trace timestamp ÷ X after the start
(X = 1: the trace's own rate), so a disk that keeps up with the trace's rate but not
with back-to-back replay shows the policy rather than the disk.

`--hints none,turns:T,continues:T,return-time` (with `--pace`) also sends retention hints
an application could send, after each request, for its whole chain (`Client.retain`; the
sources as in `benches/hint_sim.rs`): `turns:T` keeps each request that continues a
conversation for T trace seconds; `continues:T` keeps each request whose conversation
goes on for T trace seconds and marks the last turn done — it knows **whether** the
conversation goes on (the trace's future for a chat; an agent loop knows it), not when;
`return-time` keeps each request until its
conversation's next turn arrives (+1 trace second, +0.5 s of replay lateness) and marks
the last turn done — it **uses the trace's future** (an application that knows when it
returns). Durations are trace seconds ÷ PACE on the Manager's clock. One run per
(policy, hint source); the row's policy key is `POLICY+hints:SOURCE`.

`--policy-seed S` starts every Manager with `--cache-policy-seed S` (`duel`'s sample, `tinylfu`'s sketch;
unset, each Manager draws its own); `--repeat N` replays every point N times, the
policies alternating, and reports every run (seed S + run index when a seed is given).
With an SSD tier each run also reports the Manager's `ssd_spilled_blocks_total` and
`ssd_evicted_unspilled_blocks_total` (blocks DRAM evicted before their spill was written).

Printed and written as JSON (`--out`): hit rate per policy, the blocks served from DRAM
and from SSD (the Manager's staged-block counter), and, computed in the same run on the
same trace and capacity, LRU and the offline optimum (Belady with bypass, on the same
prefix lookups; with an SSD tier the optimum gets DRAM + SSD as one capacity).
`--png` draws hit rate vs capacity for the first policy, LRU and the optimum
(matplotlib).

  python benches/trace_replay.py --trace conversation_trace.jsonl --capacity 4096,16384 \\
      --policies duel,lru --clients 4 --png docs/trace_replay.png
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import multiprocessing as mp
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

KiB = 1024


def read_requests(path: str) -> list[dict[str, Any]]:
    """The trace's requests, one JSON object per non-empty line, each with a valid
    `hash_ids` list (non-negative integers); exits naming the line otherwise."""
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                ids = obj["hash_ids"]
            except (ValueError, KeyError, TypeError) as e:
                raise SystemExit(f"{path}:{n}: expected a JSON object with a `hash_ids` list ({e})") from e
            if not isinstance(ids, list) or not all(isinstance(x, int) and x >= 0 for x in ids):
                raise SystemExit(f"{path}:{n}: `hash_ids` must be a list of non-negative integers")
            out.append(obj)
    if not out:
        raise SystemExit(f"{path}: no requests")
    return out


def load_trace(path: str) -> tuple[list[list[int]], list[float] | None]:
    """The requests' block ids, and their timestamps in seconds (None when a line has none)."""
    out = []
    times: list[float] | None = []
    for obj in read_requests(path):
        out.append(obj["hash_ids"])
        ts = obj.get("timestamp")
        if times is not None and isinstance(ts, (int, float)) and ts >= 0:
            times.append(ts / 1000.0)
        else:
            times = None
    return out, times


def generate(n: int, seed: int) -> list[list[int]]:
    """Multi-turn chats sharing a system block (id 0): a request continues an open chat
    (its previous prompt plus new blocks) or starts one; chats end after a few turns."""
    rng = random.Random(seed)
    chats: list[list[int]] = []
    nxt, out = 1, []
    for _ in range(n):
        i = rng.randrange(len(chats) + 3)
        prompt = list(chats[i]) if i < len(chats) else [0]
        prompt += range(nxt, nxt + rng.randint(1, 8))
        nxt = prompt[-1] + 1
        if i < len(chats) and (len(prompt) > 40 or rng.random() < 0.2):
            chats.pop(i)
        elif i < len(chats):
            chats[i] = prompt
        else:
            chats.append(prompt)
        out.append(prompt)
    return out


# ---- references computed in the same run -------------------------------------------


def hit_rate_lru(trace: list[list[int]], capacity: int) -> float:
    cache: OrderedDict[int, None] = OrderedDict()
    asked = served = 0
    for req in trace:
        hit = 0
        while hit < len(req) and req[hit] in cache:
            hit += 1
        asked, served = asked + len(req), served + hit
        for i, b in enumerate(req):
            if b in cache:
                if i < hit:
                    cache.move_to_end(b)
                continue
            cache[b] = None
            if len(cache) > capacity:
                cache.popitem(last=False)
    return served / max(asked, 1)


def hit_rate_optimum(trace: list[list[int]], capacity: int) -> float:
    """Belady with bypass: evict the block needed farthest ahead; do not admit a block
    needed later than every resident."""
    never = len(trace)
    nxt: list[list[int]] = [[never] * len(r) for r in trace]
    seen: dict[int, int] = {}
    for r in range(len(trace) - 1, -1, -1):
        for i, b in enumerate(trace[r]):
            nxt[r][i] = seen.get(b, never)
        for b in trace[r]:
            seen[b] = r
    due: dict[int, int] = {}
    heap: list[tuple[int, int]] = []  # (-next use, block), lazily cleaned
    asked = served = 0
    for r, req in enumerate(trace):
        hit = 0
        while hit < len(req) and req[hit] in due:
            hit += 1
        asked, served = asked + len(req), served + hit
        for i, b in enumerate(req):
            nu = nxt[r][i]
            if b in due:
                due[b] = nu
                heapq.heappush(heap, (-nu, b))
                continue
            if len(due) >= capacity:
                while heap and due.get(heap[0][1]) != -heap[0][0]:
                    heapq.heappop(heap)
                if not heap or -heap[0][0] <= nu:
                    continue  # bypass
                _, victim = heapq.heappop(heap)
                del due[victim]
            due[b] = nu
            heapq.heappush(heap, (-nu, b))
    return served / max(asked, 1)


# ---- replay through a real Manager ---------------------------------------------------


def block_hash(block_id: int) -> bytes:
    return hashlib.sha256(b"orbitkv-trace-replay/" + block_id.to_bytes(8, "little")).digest()


def block_bytes_of(h: bytes, size: int) -> bytes:
    return h * (size // len(h)) + h[: size % len(h)]


def conversation_turns(trace: list[list[int]]) -> tuple[list[int | None], list[int | None]]:
    """Per request, the earlier request it continues (its blocks start with all of that
    request's blocks but the last; at least 2 full blocks) and the later one continuing it."""
    open_: dict[tuple[int, ...], int] = {}
    prev: list[int | None] = [None] * len(trace)
    nxt: list[int | None] = [None] * len(trace)
    for i, ids in enumerate(trace):
        for n in range(len(ids), 1, -1):
            p = open_.get(tuple(ids[:n]))
            if p is not None:
                prev[i] = p
                if nxt[p] is None:
                    nxt[p] = i
                break
        if len(ids) >= 3:
            open_[tuple(ids[:-1])] = i
    return prev, nxt


def hint_plan(source: str, trace: list[list[int]], times: list[float], pace: float) -> list[Any]:
    """Per request, the `Client.retain` keyword arguments of `source` (None: no hint)."""
    if source == "none":
        return [None] * len(trace)
    prev, nxt = conversation_turns(trace)
    if source.startswith("turns:"):
        keep = float(source.split(":", 1)[1]) / pace
        return [{"keep_for_s": keep} if p is not None else None for p in prev]
    if source.startswith("continues:"):
        # Knows whether the conversation goes on (an agent loop, a chat that was not
        # closed), not when: keep for T, done after the last turn.
        keep = float(source.split(":", 1)[1]) / pace
        return [{"keep_for_s": keep} if n is not None else {"done": True} for n in nxt]
    if source == "return-time":
        return [
            {"keep_for_s": min(86_400.0, (times[n] - times[i] + 1.0) / pace + 0.5)} if n is not None else {"done": True}
            for i, n in enumerate(nxt)
        ]
    raise SystemExit(
        f"trace_replay: --hints {source!r}: expected none, turns:SECONDS, continues:SECONDS or return-time"
    )


def _client(socket: str, tasks: Any, max_blocks: int, block: int, q: Any, start: float) -> None:
    from orbitkv import _native
    from orbitkv.hashing import fingerprint

    st: dict[str, Any] = {
        "asked": 0,
        "served": 0,
        "mismatches": 0,
        "refused": 0,
        "requests": 0,
        "restore_failed": 0,
        "max_late_s": 0.0,
        "hints": 0,
        "errors": [],
    }
    try:
        c = _native.Client(socket, timeout_ms=60000)
        ns = c.register_namespace(fingerprint(bench="trace_replay", block_bytes=block), block)
        buf = bytearray(max_blocks * block)
        while (task := tasks.get()) is not None:
            due, req, hint = task
            if due is not None:  # --pace: not before its time (wall clock shared by the processes)
                wait = start + due - time.time()
                if wait > 0:
                    time.sleep(wait)
                else:
                    st["max_late_s"] = max(st["max_late_s"], -wait)
                st["last_issue"] = time.time()
            hashes = [block_hash(b) for b in req]
            lease = c.lookup(ns, hashes)
            hit = lease.hit_blocks
            st["asked"] += len(req)
            st["served"] += hit
            if hit:
                view = memoryview(buf)[: hit * block]
                try:
                    c.restore(lease, view)
                except _native.RestoreFailed:
                    # What an engine does: recompute. The Manager released the lease (e.g. no
                    # DRAM slot free to stage SSD blocks into); counted, not served.
                    st["restore_failed"] += 1
                    st["served"] -= hit
                    hit = 0
                else:
                    c.release(lease)
                    for i in range(hit):
                        if view[i * block : (i + 1) * block] != block_bytes_of(hashes[i], block):
                            st["mismatches"] += 1
            if hit < len(req):
                r = c.save(ns, hashes[hit:], b"".join(block_bytes_of(h, block) for h in hashes[hit:]))
                st["refused"] += r.refused
            if hint is not None:
                c.retain(ns, hashes, **hint)
                st["hints"] += 1
            st["requests"] += 1
            if st["requests"] % 200 == 0:
                q.put(("tick", 200))
        c.close()
    except Exception as e:  # reported to the parent, which fails the run
        st["errors"].append(f"{type(e).__name__}: {e}")
    q.put(("done", st))


def _start_manager(
    tmp: str, dram: int, policy: str, ssd: int, block: int, seed: int | None, extra: list[str]
) -> tuple[subprocess.Popen[bytes], str]:
    from orbitkv.launch import ManagerStartError, start_serve

    sock = os.path.join(tmp, "manager.sock")
    args = ["--dram-size", str(dram), "--segment-size", str(min(dram, 256 << 20)), "--cache-policy", policy]
    if seed is not None:
        args += ["--cache-policy-seed", str(seed)]
    if ssd:
        # One SSD block holds a block plus its 4 KiB header, on 4 KiB alignment.
        per = -(-(block + 4 * KiB) // (4 * KiB)) * 4 * KiB
        args += ["--ssd-dir", os.path.join(tmp, "ssd"), "--ssd-capacity", str(ssd * per), "--ssd-mode", "kernel"]
    args += extra
    try:
        return start_serve(sock, *args, timeout_s=30), sock
    except ManagerStartError as e:
        raise SystemExit(f"trace_replay: {e} (orbitkv serve {' '.join(args)})") from None


def replay(
    trace: list[list[int]],
    capacity: int,
    ssd_blocks: int,
    policy: str,
    clients: int,
    block: int,
    workdir: str,
    quiet: bool,
    extra: list[str],
    seed: int | None = None,
    due: list[float] | None = None,
    hints: list[Any] | None = None,
) -> dict[str, Any]:
    """One fresh Manager, the trace replayed once. `due`: per request, seconds after
    the start before which it is not issued (`--pace`); None: back to back. `hints`: per
    request, the retention hint sent after it (None: none)."""
    from orbitkv import _native

    tmp = tempfile.mkdtemp(prefix="replay-", dir=workdir)
    proc, sock = _start_manager(tmp, capacity * block, policy, ssd_blocks, block, seed, extra)
    try:
        ctx = mp.get_context("spawn")
        q, tasks = ctx.Queue(), ctx.Queue()
        for i, req in enumerate(trace):  # taken in trace order by whichever client is free
            tasks.put((due[i] if due is not None else None, req, hints[i] if hints is not None else None))
        for _ in range(clients):
            tasks.put(None)
        tasks.cancel_join_thread()  # a run that fails early must not wait for its backlog to drain
        longest = max(len(r) for r in trace)
        start = time.time() + 3.0  # paced runs: time for the clients to start
        procs = [ctx.Process(target=_client, args=(sock, tasks, longest, block, q, start)) for _ in range(clients)]
        t0 = time.perf_counter()
        for p in procs:
            p.start()
        results, done_requests = [], 0
        while len(results) < len(procs):
            kind, payload = q.get(timeout=1800)
            if kind == "tick":
                done_requests += payload
                if not quiet:
                    print(f"\r  {policy}: {done_requests}/{len(trace)} requests", end="", file=sys.stderr, flush=True)
            else:
                results.append(payload)
        wall = time.perf_counter() - t0
        for p in procs:
            p.join()
        if not quiet:
            print(file=sys.stderr)
        with _native.Client(sock) as c:
            stats = c.stats()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)
    errors = [e for r in results for e in r["errors"]]
    if errors:
        raise SystemExit(f"trace_replay: client errors: {errors[:3]}")
    asked = sum(r["asked"] for r in results)
    served = sum(r["served"] for r in results)
    from_ssd = int(stats.get("ssd_staged_blocks_total", 0))
    return {
        "policy": policy,
        "policy_seed": seed,
        "paced": due is not None,
        "max_late_seconds": max(r["max_late_s"] for r in results) if due is not None else None,
        # Paced: from the start to the last request issued (at least the trace's span / pace).
        "issue_span_seconds": max(r["last_issue"] for r in results) - start if due is not None else None,
        "hit_rate": served / max(asked, 1),
        "blocks_asked": asked,
        "blocks_served": served,
        "served_from_dram": served - from_ssd,
        "served_from_ssd": from_ssd,
        "hit_rate_dram": (served - from_ssd) / max(asked, 1),
        "hit_rate_ssd": from_ssd / max(asked, 1),
        "mismatched_blocks": sum(r["mismatches"] for r in results),
        "blocks_refused": sum(r["refused"] for r in results),
        "restores_failed": sum(r["restore_failed"] for r in results),
        "evictions": stats.get("evictions_total"),
        "hints_sent": sum(r["hints"] for r in results),
        "hint_kept_blocks_total": stats.get("hint_kept_blocks_total"),
        "hint_refused_blocks_total": stats.get("hint_refused_blocks_total"),
        "hint_expired_blocks_total": stats.get("hint_expired_blocks_total"),
        "ssd_bytes_written": stats.get("ssd_bytes_written_total"),
        "ssd_spilled_blocks": stats.get("ssd_spilled_blocks_total"),
        "ssd_evicted_unspilled_blocks": stats.get("ssd_evicted_unspilled_blocks_total"),
        "wall_seconds": wall,
    }


def plot(rows: list[dict[str, Any]], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise SystemExit(f"--png needs matplotlib ({e}); pip install matplotlib, or drop --png") from e
    traces = sorted({r["trace"] for r in rows})
    fig, axes = plt.subplots(1, len(traces), figsize=(5.5 * len(traces), 4), squeeze=False)
    for ax, name in zip(axes[0], traces, strict=True):
        pts = sorted((r for r in rows if r["trace"] == name), key=lambda r: r["capacity_blocks"])
        caps = [r["capacity_blocks"] + r["ssd_blocks"] for r in pts]
        ax.plot(caps, [r["optimum"] for r in pts], "k--o", label="offline optimum")
        ax.plot(caps, [r["lru"] for r in pts], ":s", color="gray", label="LRU")
        for pol in pts[0]["policies"]:
            ax.plot(caps, [r["policies"][pol]["hit_rate"] for r in pts], "-o", label=f"OrbitKV {pol}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("capacity (blocks)")
        ax.set_ylabel("prefix hit rate")
        ax.set_title(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", action="append", default=[], help="trace file (FAST25 JSONL); repeatable")
    ap.add_argument("--generate", type=int, default=0, help="also replay a seeded generated trace of N requests")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--limit", type=int, default=0, help="replay only the first N requests of each trace")
    ap.add_argument("--capacity", default="4096,16384", help="DRAM capacities in blocks, comma-separated")
    ap.add_argument("--ssd-blocks", type=int, default=0, help="add an SSD tier of this many blocks")
    ap.add_argument("--policies", default="duel,lru", help="Manager --cache-policy values")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--manager-args", default="", help='more `orbitkv serve` flags, e.g. "--ssd-admit-hits 1"')
    ap.add_argument("--block-bytes", type=int, default=64 * KiB)
    ap.add_argument("--workdir", default=None, help="where Managers keep sockets and SSD files (default: /var/tmp)")
    ap.add_argument("--out", default="bench-results/trace_replay.json")
    ap.add_argument("--png", default=None, help="write a plot of hit rate vs capacity here")
    ap.add_argument(
        "--policy-seed",
        type=int,
        default=None,
        help="start every Manager with --cache-policy-seed (default: each draws its own)",
    )
    ap.add_argument("--repeat", type=int, default=1, help="replay every point this many times (policies alternate)")
    ap.add_argument(
        "--pace",
        type=float,
        default=0.0,
        help="issue each request at its trace timestamp / PACE (1: the trace's rate; 0: back to back)",
    )
    ap.add_argument(
        "--hints",
        default="none",
        help="retention hint sources, comma-separated: none, turns:S, continues:S, return-time (needs --pace)",
    )
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args()
    traces: list[tuple[str, list[list[int]], list[float] | None]] = [(Path(p).stem, *load_trace(p)) for p in a.trace]
    if a.generate:
        traces.append((f"generated-{a.generate}-seed{a.seed}", generate(a.generate, a.seed), None))
    if a.pace < 0 or a.repeat < 1:
        ap.error("--pace must be >= 0 and --repeat >= 1")
    if a.pace and any(t is None for _, _, t in traces):
        ap.error("--pace needs a `timestamp` on every request of every trace (generated traces have none)")
    if not traces:
        ap.error("give --trace FILE (the FAST25 JSONL format) and/or --generate N")
    sources = [h for h in a.hints.split(",") if h]
    if any(h != "none" for h in sources) and not a.pace:
        ap.error("--hints other than none needs --pace (hint durations are trace seconds / PACE)")
    if a.clients < 1 or a.block_bytes < 4 * KiB or a.block_bytes % (4 * KiB):
        ap.error("--clients must be >= 1 and --block-bytes a positive multiple of 4096")
    caps = [int(c) for c in a.capacity.split(",")]
    policies = [p for p in a.policies.split(",") if p]
    workdir = a.workdir or ("/var/tmp" if os.path.isdir("/var/tmp") else tempfile.gettempdir())
    rows = []
    for name, trace, times in traces:
        if a.limit:
            trace = trace[: a.limit]
        due = [(t - times[0]) / a.pace for t in times[: len(trace)]] if a.pace and times else None
        plans = {h: hint_plan(h, trace, times or [], a.pace) for h in sources}
        for cap in caps:
            t0 = time.perf_counter()
            lru = hit_rate_lru(trace, cap + a.ssd_blocks)
            opt = hit_rate_optimum(trace, cap + a.ssd_blocks)
            row: dict[str, Any] = {
                "trace": name,
                "requests": len(trace),
                "capacity_blocks": cap,
                "manager_args": a.manager_args,
                "ssd_blocks": a.ssd_blocks,
                "block_bytes": a.block_bytes,
                "clients": a.clients,
                "lru": lru,
                "optimum": opt,
                "reference_seconds": time.perf_counter() - t0,
                "pace": a.pace,
                "policies": {},
            }
            runs: dict[str, list[dict[str, Any]]] = {}
            for i in range(a.repeat):
                seed = None if a.policy_seed is None else a.policy_seed + i
                line = f"{name:>24} dram {cap:>6} ssd {a.ssd_blocks:>6}  lru {lru:.3f}  optimum {opt:.3f}"
                if a.repeat > 1:
                    line += f"  run {i + 1}/{a.repeat}"
                for pol, source in [(p, h) for p in policies for h in sources]:
                    key = pol if source == "none" else f"{pol}+hints:{source}"
                    r = replay(
                        trace,
                        cap,
                        a.ssd_blocks,
                        pol,
                        a.clients,
                        a.block_bytes,
                        workdir,
                        a.quiet,
                        a.manager_args.split(),
                        seed,
                        due,
                        plans[source],
                    )
                    r["hints"] = source
                    r["vs_optimum"] = r["hit_rate"] / opt if opt else None
                    r["vs_lru"] = r["hit_rate"] / lru if lru else None
                    runs.setdefault(key, []).append(r)
                    line += (
                        f"  {key} {r['hit_rate']:.3f} (dram {r['hit_rate_dram']:.3f}"
                        f" ssd {r['hit_rate_ssd']:.3f}; {r['mismatched_blocks']} wrong"
                    )
                    if a.ssd_blocks:
                        line += (
                            f"; {r['ssd_spilled_blocks']} spilled, {r['ssd_evicted_unspilled_blocks']} lost unspilled"
                        )
                    if due is not None:
                        line += f"; {r['max_late_seconds']:.1f} s late at most"
                    line += ")"
                print(line, flush=True)
            for pol, rs in runs.items():
                if len(rs) == 1:
                    row["policies"][pol] = rs[0]
                    continue
                rates = [r["hit_rate"] for r in rs]
                row["policies"][pol] = {
                    "hit_rate": sum(rates) / len(rates),
                    "hit_rate_min": min(rates),
                    "hit_rate_max": max(rates),
                    "hit_rate_dram": sum(r["hit_rate_dram"] for r in rs) / len(rs),
                    "hit_rate_ssd": sum(r["hit_rate_ssd"] for r in rs) / len(rs),
                    "mismatched_blocks": sum(r["mismatched_blocks"] for r in rs),
                    "runs": rs,
                }
            rows.append(row)
    wrong = sum(r["mismatched_blocks"] for row in rows for r in row["policies"].values())
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"bench": "trace_replay", "rows": rows, "mismatched_blocks": wrong}, f, indent=2)
    print(f"wrote {a.out} ({wrong} wrong blocks)")
    if a.png:
        plot(rows, a.png)
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
