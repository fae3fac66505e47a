"""What placement costs (issue 12): the price of asking a peer on a local miss
(this build's rule: ask peers in rendezvous order of the first missing block,
no inventory) beside the price of keeping an inventory in etcd (one etcd write
per saved block), measured in one run on loopback.

    python benches/peer_placement.py [--out bench-results/peer_placement.json] [--n 300]

Rows: lookup miss on a Manager with no peers; lookup miss on a Manager with one
peer that does not hold the block (one peer round trip); with three peers, a miss
and a hit held by one of them, asked one at a time (`--peer-fill-parallel 1`, the
rule before parallel asks) and probed at once (the default), same run, same build;
one etcd v3 put through
the JSON gateway (what an inventory would add per saved block) and one range read
of a key (what an inventory lookup would add per miss). Needs `orbitkv` installed
and the `etcd` binary (Debian etcd-server) for the etcd rows.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from orbitkv import _native
from orbitkv.hashing import fingerprint
from orbitkv.launch import serve_command

BB = 64 * 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait(pred: object, what: str) -> None:
    t0 = time.time()
    while time.time() - t0 < 20:
        try:
            if pred():  # type: ignore[operator]
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


def serve(sock: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(serve_command(sock, "--dram-size", "16MiB", *args))


def miss_us(sock: str, n: int) -> list[float]:
    wait(lambda: os.path.exists(sock) and _native.Client(sock).close() is None, sock)
    fp = fingerprint(model="placement", block_bytes=BB)
    out = []
    with _native.Client(sock) as c:
        ns = c.register_namespace(fp, BB)
        for i in range(n):
            h = i.to_bytes(8, "little") * 4
            t0 = time.perf_counter()
            lease = c.lookup(ns, [h])
            out.append((time.perf_counter() - t0) * 1e6)
            assert lease.hit_blocks == 0
    return out


def hit_us(sock: str, holder: str, first: int, n: int) -> list[float]:
    """Save `n` fresh blocks on `holder`, then restore each once through `sock`
    (every sample is a peer fill of one block)."""
    fp = fingerprint(model="placement", block_bytes=BB)
    hs = [(first + i).to_bytes(8, "little") * 4 for i in range(n)]
    with _native.Client(holder) as c:
        ns = c.register_namespace(fp, BB)
        for h in hs:
            c.save(ns, [h], [bytes([h[0]]) * BB])
    out = []
    with _native.Client(sock) as c:
        ns = c.register_namespace(fp, BB)
        for h in hs:
            t0 = time.perf_counter()
            lease = c.lookup(ns, [h])
            out.append((time.perf_counter() - t0) * 1e6)
            assert lease.hit_blocks == 1, "filled from a peer"
            c.release(lease)
    return out


def etcd_us(port: int, n: int) -> tuple[list[float], list[float]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    puts, gets = [], []
    for i in range(n):
        key = base64.b64encode(f"/orbitkv/inventory/{i:064x}".encode()).decode()
        val = base64.b64encode(b"127.0.0.1:7470").decode()
        for path, body, sink in (
            ("/v3/kv/put", {"key": key, "value": val}, puts),
            ("/v3/kv/range", {"key": key}, gets),
        ):
            t0 = time.perf_counter()
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            sink.append((time.perf_counter() - t0) * 1e6)
            assert r.status == 200
    return puts, gets


def summary(v: list[float]) -> dict[str, float]:
    v = sorted(v)
    return {"median_us": statistics.median(v), "p99_us": v[int(len(v) * 0.99) - 1], "n": len(v)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench-results/peer_placement.json")
    ap.add_argument("--n", type=int, default=300)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="orbitkv-placement-")
    procs: list[subprocess.Popen[bytes]] = []
    rows: dict[str, object] = {}
    try:
        pa = free_port()
        procs.append(serve(f"{tmp}/alone.sock"))
        procs.append(serve(f"{tmp}/a.sock", "--peer-listen", f"127.0.0.1:{pa}"))
        wait(lambda: socket.create_connection(("127.0.0.1", pa), timeout=1).close() is None, "peer port")
        procs.append(serve(f"{tmp}/b.sock", "--peer", f"127.0.0.1:{pa}"))
        rows["miss_no_peers"] = summary(miss_us(f"{tmp}/alone.sock", a.n))
        rows["miss_one_peer_asked"] = summary(miss_us(f"{tmp}/b.sock", a.n))
        # Three peers: one at a time (the rule before parallel asks) vs probed at once.
        ports = [free_port() for _ in range(3)]
        for i, p in enumerate(ports):
            procs.append(serve(f"{tmp}/p{i}.sock", "--peer-listen", f"127.0.0.1:{p}"))
        for p in ports:
            wait(lambda p=p: socket.create_connection(("127.0.0.1", p), timeout=1).close() is None, "peer port")
        peers = [x for p in ports for x in ("--peer", f"127.0.0.1:{p}")]
        procs.append(serve(f"{tmp}/seq.sock", *peers, "--peer-fill-parallel", "1"))
        procs.append(serve(f"{tmp}/par.sock", *peers))
        rows["miss_three_peers_one_at_a_time"] = summary(miss_us(f"{tmp}/seq.sock", a.n))
        rows["miss_three_peers_probed_at_once"] = summary(miss_us(f"{tmp}/par.sock", a.n))
        # At most 100 fills per rule: both sets stay in the holder's 16 MiB arena.
        holder, nh = f"{tmp}/p2.sock", min(a.n, 100)
        rows["hit_on_one_of_three_one_at_a_time"] = summary(hit_us(f"{tmp}/seq.sock", holder, 10**6, nh))
        rows["hit_on_one_of_three_probed_at_once"] = summary(hit_us(f"{tmp}/par.sock", holder, 2 * 10**6, nh))
        etcd = shutil.which("etcd")
        if etcd:
            cp, pp = free_port(), free_port()
            cu, pu = f"http://127.0.0.1:{cp}", f"http://127.0.0.1:{pp}"
            procs.append(
                subprocess.Popen(
                    [
                        etcd,
                        "--name",
                        "b",
                        "--data-dir",
                        f"{tmp}/etcd",
                        "--listen-client-urls",
                        cu,
                        "--advertise-client-urls",
                        cu,
                        "--listen-peer-urls",
                        pu,
                        "--initial-advertise-peer-urls",
                        pu,
                        "--initial-cluster",
                        f"b={pu}",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            wait(lambda: socket.create_connection(("127.0.0.1", cp), timeout=1).close() is None, "etcd")
            puts, gets = etcd_us(cp, a.n)
            rows["etcd_put_per_saved_block"] = summary(puts)
            rows["etcd_range_per_miss"] = summary(gets)
        else:
            rows["etcd_note"] = "skipped: no etcd binary (Debian etcd-server)"
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=20)
        shutil.rmtree(tmp, ignore_errors=True)
    doc = {"bench": "peer_placement", "what": __doc__.split("\n\n")[0], "rows": rows}
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=2)
    print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
