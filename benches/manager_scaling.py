"""Manager control-path scaling: requests/s and latency as client processes are added.

One real Manager (`python -m orbitkv serve`); N client processes, each with its own
session, run one operation in a closed loop for a fixed time:
  * `lookup`       - lookup of a 32-block chain that fully hits (a lease), then
                     `release_later` (opt-in: no reply, written in front of the
                     next lookup): 1 round trip;
  * `lookup_quiet` - the same with the adapters' release (`release(lease,
                     wait=False)`: its own message, no reply): 1 round trip +
                     1 one-way message;
  * `lookup_acked` - the same with an acknowledged release: 2 round trips (the
                     only lookup op before quiet releases existed);
  * `save`         - save of 4 new 4 KiB blocks (begin_save, copy, commit_save):
                     2 round trips, allocation and eviction under the cache lock.
Baselines in the same run:
  * ideal linear scaling of the N=1 figure (N x ops/s at N=1), capped by cores;
  * `echo`       - N pairs of processes exchanging the lookup's request/reply sizes
                   over Unix socketpairs (Python on both sides), two round trips per
                   operation: the kernel IPC + process wake-up cost with no Manager
                   (the baseline issue 10 names);
  * `echo_quiet` - the same pairs exchanging exactly the `lookup_quiet` op's messages: one
                   round trip, then a one-way message of a quiet release's size.
The Manager runs one thread per session; lookups and releases share its cache lock
(saves take it exclusively). CPU per operation is reported for the Manager (all
its threads) and the client processes, over the timed loop, to show where the
time goes.

Usage: python benches/manager_scaling.py [--clients 1,2,4,8] [--seconds 3]
                                         [--out bench-results/manager_scaling.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import socket
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orbitkv import _native
from orbitkv.launch import start_serve

ROOT = Path(__file__).resolve().parents[1]
FP = b"\x5a" * 32
CHAIN = 32
BB = 4096
LOOKUP_REQ = 16 + 8 + 32 * CHAIN  # header + ns/count + hashes, as on the wire
REPLY = 16 + 24
QUIET_RELEASE = 16 + 4 + 8  # header + count + one lease id


def chain(i: int) -> list[bytes]:
    return [i.to_bytes(4, "little") + j.to_bytes(4, "little") + bytes(24) for j in range(CHAIN)]


def client_loop(sock: str, op: str, seconds: float, worker: int, start: Any, out: Any, measured: Any) -> None:
    try:
        _client_loop(sock, op, seconds, worker, start, out, measured)
    except BaseException as e:  # reported to the parent, which fails loudly
        out.put(f"worker {worker} ({op}): {e!r}")
        raise


def closed_loop(op: Callable[[int], None], seconds: float, start: Any) -> tuple[int, list[float]]:
    """Run `op(i)` back to back for `seconds` after `start` is set: (count, latencies)."""
    lat: list[float] = []
    start.wait()
    deadline = time.perf_counter() + seconds
    while (t0 := time.perf_counter()) < deadline:
        op(len(lat))
        lat.append(time.perf_counter() - t0)
    return len(lat), lat


def _client_loop(sock: str, op: str, seconds: float, worker: int, start: Any, out: Any, measured: Any) -> None:
    c = _native.Client(sock)
    ns = c.register_namespace(FP, BB)
    hs = chain(worker % 64)
    payload = [bytes([worker % 256]) * BB] * 4

    def lookup(_: int) -> None:
        lease = c.lookup(ns, hs)
        assert lease.hit_blocks == CHAIN, lease
        c.release_later(lease)

    def lookup_quiet(_: int) -> None:
        lease = c.lookup(ns, hs)
        assert lease.hit_blocks == CHAIN, lease
        c.release(lease, wait=False)

    def lookup_acked(_: int) -> None:
        lease = c.lookup(ns, hs)
        assert lease.hit_blocks == CHAIN, lease
        c.release(lease)

    def save(n: int) -> None:
        keys = [worker.to_bytes(4, "little") + (4 * n + k).to_bytes(8, "little") + bytes(20) for k in range(4)]
        c.save(ns, keys, payload)

    cpu0 = time.process_time()
    ops = {"lookup": lookup, "lookup_quiet": lookup_quiet, "lookup_acked": lookup_acked, "save": save}
    count, lat = closed_loop(ops[op], seconds, start)
    # The process's CPU from before the start signal to the end (this process's
    # threads only: the native client runs on the calling thread).
    out.put((count, lat, time.process_time() - cpu0))
    measured.wait(60)  # the session (and its Manager thread) lives until the parent has read the counters
    c.close()


def echo_server(conn: socket.socket, quiet: bool) -> None:
    """Answer each lookup-sized request; with `quiet`, a release-sized message
    follows each answered request and gets no answer (the `lookup` op's shape)."""
    steps = [(LOOKUP_REQ, True), (QUIET_RELEASE, False)] if quiet else [(LOOKUP_REQ, True)]
    i, have = 0, 0
    while True:
        data = conn.recv(65536)
        if not data:
            return
        have += len(data)
        while have >= steps[i][0]:
            have -= steps[i][0]
            if steps[i][1]:
                conn.sendall(bytes(REPLY))
            i = (i + 1) % len(steps)


def echo_client(conn: socket.socket, quiet: bool, seconds: float, start: Any, out: Any) -> None:
    req, release = bytes(LOOKUP_REQ), bytes(QUIET_RELEASE)

    def round_trip() -> None:
        conn.sendall(req)
        got = 0
        while got < REPLY:
            got += len(conn.recv(65536))

    def two_round_trips(_: int) -> None:  # as lookup + acknowledged release
        round_trip()
        round_trip()

    def round_trip_and_one_way(_: int) -> None:  # as lookup + quiet release
        round_trip()
        conn.sendall(release)

    cpu0 = time.process_time()
    count, lat = closed_loop(round_trip_and_one_way if quiet else two_round_trips, seconds, start)
    out.put((count, lat, time.process_time() - cpu0))


def summarize(results: list[Any], seconds: float) -> dict[str, float]:
    failed = [r for r in results if isinstance(r, str)]
    if failed:
        raise SystemExit("benchmark worker failed: " + "; ".join(failed))
    lat = sorted(x for r in results for x in r[1])
    ops = sum(r[0] for r in results)
    return {
        "ops_per_s": ops / seconds,
        "p50_us": statistics.median(lat) * 1e6 if lat else 0.0,
        "p99_us": lat[int(0.99 * (len(lat) - 1))] * 1e6 if lat else 0.0,
        # CPU of the timed loops' processes (clients; for echo, the client side only).
        "clients_cpu_us_per_op": sum(r[2] for r in results) / ops * 1e6 if ops else 0.0,
    }


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid`, all its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def switches_by_thread(pid: int) -> dict[str, list[int]]:
    """Context switches of all threads of `pid` so far, by thread name:
    [voluntary (each is a sleep, so each later costs a wake-up), involuntary
    (preempted)]. Threads that ended are not counted."""
    out: dict[str, list[int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            counts = out.setdefault(name, [0, 0])
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    counts[0] += int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches:"):
                    counts[1] += int(line.split()[1])
        except OSError:  # the thread ended meanwhile
            pass
    return out


def manager_counters(sock: str) -> tuple[int, int]:
    with _native.Client(sock) as c:
        st = c.stats()
    return int(st.get("policy_touches_dropped_total", 0)), int(st["lookups_total"])


def run_clients(sock: str, op: str, n: int, seconds: float, mgr_pid: int) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    start, out, measured = ctx.Event(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=client_loop, args=(sock, op, seconds, w, start, out, measured)) for w in range(n)]
    for p in procs:
        p.start()
    time.sleep(0.5 + 0.05 * n)  # every client connected and mapped
    mgr0, sw0 = proc_cpu_s(mgr_pid), switches_by_thread(mgr_pid)
    start.set()
    results = [out.get(timeout=seconds + 60) for _ in procs]
    mgr1, sw1 = proc_cpu_s(mgr_pid), switches_by_thread(mgr_pid)
    measured.set()
    for p in procs:
        p.join()
    row = summarize(results, seconds)
    ops = row["ops_per_s"] * seconds
    # Where the CPU goes per operation: the Manager's threads over the timed loop.
    row["manager_cpu_us_per_op"] = (mgr1 - mgr0) / ops * 1e6 if ops else 0.0
    # How often the Manager's threads slept (and so had to be woken) per
    # operation, in all and by thread name; and how often they were preempted.
    per = {k: [v[0] - sw0.get(k, [0, 0])[0], v[1] - sw0.get(k, [0, 0])[1]] for k, v in sw1.items()}
    row["manager_sleeps_per_op"] = sum(v[0] for v in per.values()) / ops if ops else 0.0
    row["manager_preempted_per_op"] = sum(v[1] for v in per.values()) / ops if ops else 0.0
    row["manager_sleeps_per_op_by_thread"] = {k: round(v[0] / ops, 3) for k, v in per.items() if ops and v[0]}
    return row


def run_echo(n: int, seconds: float, quiet: bool) -> dict[str, float]:
    ctx = mp.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    procs = []
    for _ in range(n):
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        procs.append(ctx.Process(target=echo_server, args=(a, quiet)))
        procs.append(ctx.Process(target=echo_client, args=(b, quiet, seconds, start, out)))
    for p in procs:
        p.start()
    time.sleep(0.3)
    start.set()
    results = [out.get(timeout=seconds + 60) for _ in range(n)]
    for p in procs:
        p.kill()
        p.join()
    return summarize(results, seconds)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--out", default=str(ROOT / "bench-results" / "manager_scaling.json"))
    ap.add_argument("--manager-args", default="", help='more `orbitkv serve` flags, e.g. "--cache-policy lru"')
    ap.add_argument(
        "--ops",
        default="lookup,lookup_quiet,lookup_acked,save,echo,echo_quiet",
        help="which operations and baselines to run (comma-separated)",
    )
    a = ap.parse_args()
    counts = [int(x) for x in a.clients.split(",")]
    ops = set(a.ops.split(","))
    if unknown := ops - {"lookup", "lookup_quiet", "lookup_acked", "save", "echo", "echo_quiet"}:
        raise SystemExit(f"unknown --ops: {sorted(unknown)}")
    d = tempfile.mkdtemp(prefix="okv-scale-")
    sock = os.path.join(d, "m.sock")
    mgr = start_serve(sock, "--dram-size", "1GiB", *a.manager_args.split(), timeout_s=10)
    rows = []
    try:
        for n in counts:
            # (Re)store the chains the lookups hit: an earlier save phase may have evicted them.
            with _native.Client(sock) as c:
                ns = c.register_namespace(FP, BB)
                for i in range(64):
                    c.save(ns, chain(i), [bytes(BB)] * CHAIN)
            row: dict[str, Any] = {"clients": n}
            for op in [o for o in ("lookup", "lookup_quiet", "lookup_acked", "save") if o in ops]:
                before = manager_counters(sock)
                row[op] = run_clients(sock, op, n, a.seconds, mgr.pid)
                after = manager_counters(sock)
                # Lookups whose hits the eviction policy never saw (its replay fell behind).
                row[op]["policy_touches_dropped"] = after[0] - before[0]
                row[op]["manager_lookups"] = after[1] - before[1]
            if "echo" in ops:
                row["echo"] = run_echo(n, a.seconds, quiet=False)
            if "echo_quiet" in ops:
                row["echo_quiet"] = run_echo(n, a.seconds, quiet=True)
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        mgr.terminate()
        mgr.wait()
    base = rows[0]
    cores = os.cpu_count() or 1
    for row in rows:
        n = row["clients"]
        for op in ("lookup", "lookup_quiet", "lookup_acked", "save", "echo", "echo_quiet"):
            if op in row:
                # Ideal: linear in clients until every core is busy (a client plus its server side).
                ideal = base[op]["ops_per_s"] / base["clients"] * min(n, max(1, cores // 2))
                row[op]["vs_ideal_linear"] = row[op]["ops_per_s"] / ideal
        # The ratio (against two echo round trips), and against an echo of
        # exactly the messages each op exchanges.
        for op, echo in (
            ("lookup", "echo"),
            ("lookup_quiet", "echo"),
            ("lookup_quiet", "echo_quiet"),
            ("lookup_acked", "echo"),
        ):
            if op in row and echo in row:
                row[f"{op}_vs_{echo}"] = row[op]["ops_per_s"] / row[echo]["ops_per_s"]
    doc = {
        "bench": "manager_scaling",
        "ops": {
            "lookup": f"lookup of a {CHAIN}-block full hit + release_later (1 round trip, release on the next)",
            "lookup_quiet": f"lookup of a {CHAIN}-block full hit + quiet release (1 round trip + 1 one-way message)",
            "lookup_acked": f"lookup of a {CHAIN}-block full hit + acknowledged release (2 round trips)",
            "save": f"save of 4 new {BB}-byte blocks: begin_save + copy + commit_save (2 round trips)",
            "echo": "2 round trips of the lookup's request/reply sizes over a socketpair, Python both sides",
            "echo_quiet": "1 round trip of the lookup's sizes + 1 one-way message of a quiet release's size",
        },
        "seconds_per_point": a.seconds,
        "cpus": cores,
        "python": platform.python_version(),
        "rows": rows,
    }
    return write_result(a.out, doc)


def write_result(out: str, doc: dict[str, Any]) -> int:
    """Write a bench's JSON document (with the platform) to `out`; the exit status 0."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps({**doc, "platform": platform.platform()}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
