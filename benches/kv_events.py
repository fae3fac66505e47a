#!/usr/bin/env python3
"""What the KV-event stream (`orbitkv serve --kv-events`) costs the save path, and whether a
subscriber keeps up: saves/s with the stream off and on (a SUB subscriber decoding every
batch), same run, rounds interleaved.

Each point: a fresh Manager with a 64 MiB arena (so every save past the first 16 K blocks
evicts: a `BlockStored` and a `BlockRemoved` per block), N client processes saving 4 new
4 KiB blocks per operation in a closed loop (`benches/manager_scaling.py`'s `save`). With
the stream on, a subscriber process reads the stream for the whole point and reports the
changes it decoded (`on`); `on_unread` publishes to no subscriber (the Manager's side of the
cost alone: on a small machine the subscriber competes for the same cores). The Manager's
`kv_events_published_total` and `_dropped_total` are read after each point. Needs pyzmq
and msgspec (the vLLM venv has both).

    python benches/kv_events.py --out kv_events.json [--clients 1,2] [--seconds 3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from manager_scaling import run_clients, write_result

from orbitkv import _native
from orbitkv.launch import start_serve


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def subscriber(endpoint: str, ready: Any, stop: Any, out: Any) -> None:
    """Reads the stream until `stop`; puts (batches, changes decoded, sequence gaps)."""
    import msgspec
    import zmq

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    time.sleep(0.3)
    ready.set()
    batches = changes = gaps = 0
    last = None
    while not (stop.is_set() and not sub.poll(200)):
        if not sub.poll(100):
            continue
        _, seq, payload = sub.recv_multipart()
        n = int.from_bytes(seq, "big")
        gaps += 0 if last is None or n == last + 1 else 1
        last = n
        batches += 1
        _, events, _ = msgspec.msgpack.decode(payload)
        changes += sum(len(e["block_hashes"]) for e in events)
    out.put((batches, changes, gaps))
    sub.close(0)
    ctx.term()


def point(clients: int, seconds: float, events: bool, subscribe: bool) -> dict[str, Any]:
    d = tempfile.mkdtemp(prefix="okv-ev-")
    sock = os.path.join(d, "m.sock")
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    flags = ["--dram-size", "64MiB"] + (["--kv-events", endpoint] if events else [])
    mgr = start_serve(sock, *flags, timeout_s=10)
    ctx = mp.get_context("spawn")
    ready, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    sub = None
    try:
        if events and subscribe:
            sub = ctx.Process(target=subscriber, args=(endpoint, ready, stop, out))
            sub.start()
            ready.wait(30)
        row: dict[str, Any] = dict(run_clients(sock, "save", clients, seconds, mgr.pid))
        time.sleep(0.5)  # the publisher drains its queue
        with _native.Client(sock) as c:
            st = c.stats()
        row["published"] = int(st["kv_events_published_total"])
        row["dropped"] = int(st["kv_events_dropped_total"])
        row["blocks_committed"] = int(st["blocks_committed_total"])
        if sub is not None:
            stop.set()
            row["received_batches"], row["received_changes"], row["sequence_gaps"] = out.get(timeout=60)
            sub.join()
        return row
    finally:
        if sub is not None and sub.is_alive():
            sub.kill()
        mgr.terminate()
        mgr.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", default="1,2")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    rows: list[dict[str, Any]] = []
    for n in (int(x) for x in a.clients.split(",")):
        runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": [], "on_unread": []}
        for r in range(a.rounds):
            for mode in list(runs) if r % 2 == 0 else list(reversed(runs)):
                runs[mode].append(point(n, a.seconds, mode != "off", mode == "on"))
                rate = runs[mode][-1]["ops_per_s"]
                print(f"kv_events: {n} client(s), round {r}, {mode}: {rate:.0f} saves/s", flush=True)
        med = {m: statistics.median(x["ops_per_s"] for x in runs[m]) for m in runs}
        ratios = {"on_over_off": med["on"] / med["off"], "on_unread_over_off": med["on_unread"] / med["off"]}
        rows.append({"clients": n, "saves_per_s_median": med, **ratios, "runs": runs})
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "runs"}), flush=True)
    doc = {
        "bench": "kv_events",
        "op": "save of 4 new 4 KiB blocks (begin_save + copy + commit_save) into a 64 MiB arena: "
        "every block stored, and once it is full one evicted per block",
        "seconds_per_point": a.seconds,
        "cpus": os.cpu_count(),
        "rows": rows,
    }
    return write_result(a.out, doc)


if __name__ == "__main__":
    sys.exit(main())
