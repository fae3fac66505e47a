"""Peers side by side, in one run, on the same blocks: put/get GB/s per client and latency.

Systems (each one client, one operation in flight, one block per operation):
  memcpy      the limit: the block copied into a slot and back, in this process
  redis-c     Redis 7 on loopback driven by its own C client, `redis-benchmark -c 1
              -t set,get -d SIZE --csv` (its CSV gives rate and p50/p95/p99; it does not
              check the bytes it reads)
  redis-py    the same Redis through the `redis` Python client (SET/GET, bytes checked)
  mooncake    Mooncake Store (the `mooncake-transfer-engine-non-cuda` wheel) on loopback,
              TCP protocol: its master, a store process holding the memory
              (`mooncake_client`) and this process as a client with no segment of its
              own, `put_from`/`get_into` on registered buffers (its zero-copy path)
  mooncake-local  the same, but the memory segment is mounted by this client (the data
              lives in the client's own process; transfers still go through the engine)
  orbitkv     OrbitKV through its Python client: `save` (put) and `lookup` + `restore`
              + `release` (get) against a real `python -m orbitkv serve`
  orbitkv-mapped  the same Manager, the bytes copied by this process through the client's
              arena mapping (`begin_save`/`commit_save`, `acquire`; see OrbitKVMapped)

Every block has its own contents (slices of one random buffer at distinct offsets) and a
key of its own per repetition; every byte read back is compared (except by
redis-benchmark, which discards replies). Each repetition runs every size for every
system, interleaved, so that a machine shared with other work disturbs all systems
alike; medians over repetitions are reported. A system that cannot run here is
recorded with the exact reason (`status: "unavailable"`), never with a figure.

Peers are installed by hand (the test suite skips them, with the reason, when absent):
Debian packages redis-server, redis-tools and libibverbs1 (the Mooncake wheel links it
even for TCP); Python packages redis, mooncake-transfer-engine-non-cuda and matplotlib.

  python benches/peers.py --reps 7 --out bench-results/peers.json \\
      --png-gbps docs/peers-gbps.png --png-latency docs/peers-latency.png
"""

from __future__ import annotations

import abc
import argparse
import csv
import ctypes
import hashlib
import io
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

KiB, MiB = 1024, 1024 * 1024
ALL_SYSTEMS = ["memcpy", "redis-c", "redis-py", "mooncake", "mooncake-local", "orbitkv", "orbitkv-mapped"]
LATENCY_SIZE = MiB


class Unavailable(Exception):
    """The system cannot run on this machine; the message is the exact reason."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse_size(s: str) -> int:
    s = s.strip().upper()
    for suf, mul in (("KIB", KiB), ("MIB", MiB), ("K", KiB), ("M", MiB)):
        if s.endswith(suf):
            return int(s[: -len(suf)]) * mul
    return int(s)


def size_name(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB else f"{n // KiB} KiB"


def addr_of(buf: Any) -> int:
    return int(np.frombuffer(buf, dtype=np.uint8).ctypes.data)


def wait_for(pred: Any, what: str, proc: subprocess.Popen[bytes] | None, log: str | None, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = Path(log).read_text(errors="replace")[-2000:] if log and os.path.exists(log) else ""
            raise Unavailable(f"{what} exited with code {proc.returncode}: {tail.strip()}")
        if pred():
            return
        time.sleep(0.05)
    raise Unavailable(f"{what} did not come up within {timeout:.0f} s")


def spawn(args: list[str], log: str, cwd: str | None = None) -> subprocess.Popen[bytes]:
    """A server process writing its stdout and stderr to `log` (which `wait_for` shows if it exits)."""
    with open(log, "wb") as f:
        return subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, cwd=cwd)


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    from orbitkv.launch import stop_process

    stop_process(proc, timeout_s=20)


class Blocks:
    """Block i of a size: a slice of one random buffer starting at offset i * 4097 mod 1 MiB
    (4097 is odd, so offsets, hence contents, differ for every i below 2**20)."""

    def __init__(self, max_size: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.base = rng.integers(0, 256, size=max_size + MiB, dtype=np.uint8)
        self.view = memoryview(self.base.data).cast("B")
        self.addr = int(self.base.ctypes.data)

    def offset(self, i: int) -> int:
        return (i * 4097) % MiB

    def block(self, i: int, size: int) -> memoryview:
        o = self.offset(i)
        return self.view[o : o + size]

    def wrong_bytes(self, got: Any, i: int, size: int) -> int:
        a = np.frombuffer(got, dtype=np.uint8, count=size)
        o = self.offset(i)
        return int(np.count_nonzero(a != self.base[o : o + size]))


class Gets:
    """The timed gets of one point: each get's latency, and the bytes wrong or missing,
    checked outside the timing."""

    def __init__(self, blocks: Blocks, size: int) -> None:
        self.blocks, self.size = blocks, size
        self.lat: list[float] = []
        self.total = 0.0
        self.wrong = 0
        self.misses = 0

    def timed(self, ns: int) -> None:
        self.lat.append(ns / 1e3)
        self.total += ns / 1e9

    def check(self, i: int, got: Any | None) -> None:
        """`got`: the bytes read for block `i`, or None when the get missed."""
        if got is None:
            self.misses += 1
            self.wrong += self.size
        else:
            self.wrong += self.blocks.wrong_bytes(got, i, self.size)

    def run(self, n: int, get: Callable[[int], Any | None]) -> None:
        """Time `get(i)` for each of the `n` blocks, then check what it returned (the
        bytes read, or None on a miss) outside the timing."""
        for i in range(n):
            t = time.perf_counter_ns()
            got = get(i)
            self.timed(time.perf_counter_ns() - t)
            self.check(i, got)

    @property
    def timing(self) -> tuple[list[float], float]:
        return self.lat, self.total


class System(abc.ABC):
    name = ""

    def start(self, work: str, max_size: int, working_set: int) -> dict[str, Any]:
        return {}

    @abc.abstractmethod
    def run(self, blocks: Blocks, size: int, n: int, tag: str) -> dict[str, Any]:
        """Put then get `n` blocks of `size` bytes; timings and wrong-byte counts."""

    def stop(self) -> None:  # most systems hold nothing to stop
        return None


def timed_loop(n: int, op: Any) -> tuple[list[float], float]:
    lat = []
    t0 = time.perf_counter()
    for i in range(n):
        s = time.perf_counter_ns()
        op(i)
        lat.append((time.perf_counter_ns() - s) / 1e3)
    return lat, time.perf_counter() - t0


def point(
    size: int, n: int, put: tuple[list[float], float], get: tuple[list[float], float], wrong: int | None, **extra: Any
) -> dict[str, Any]:
    return {
        "ops": n,
        "put_gbps": n * size / put[1] / 1e9,
        "get_gbps": n * size / get[1] / 1e9,
        "put_lat_us": put[0],
        "get_lat_us": get[0],
        "wrong_bytes": wrong,
        **extra,
    }


class Memcpy(System):
    name = "memcpy"

    def start(self, work: str, max_size: int, working_set: int) -> dict[str, Any]:
        self.store = np.empty(working_set + max_size, dtype=np.uint8)
        self.dst = np.empty(max_size, dtype=np.uint8)
        self.store[:] = 1
        self.dst[:] = 1  # fault every page in before timing
        return {"how": "ctypes.memmove into a preallocated slot and back, single thread"}

    def run(self, blocks: Blocks, size: int, n: int, tag: str) -> dict[str, Any]:
        sa, da = int(self.store.ctypes.data), int(self.dst.ctypes.data)
        slots = len(self.store) // size
        if n > slots:
            raise ValueError(f"memcpy store holds {slots} blocks of {size}, {n} asked")
        put = timed_loop(n, lambda i: ctypes.memmove(sa + i * size, blocks.addr + blocks.offset(i), size))

        def get(i: int) -> Any:
            ctypes.memmove(da, sa + i * size, size)
            return self.dst

        g = Gets(blocks, size)
        g.run(n, get)
        return point(size, n, put, g.timing, g.wrong)


class RedisServer:
    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.version = ""

    def start(self, work: str) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise Unavailable("redis-server is not installed (Debian package redis-server)")
        self.version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip()
        d = tempfile.mkdtemp(prefix="redis-", dir=work)
        self.port = free_port()
        log = os.path.join(d, "redis.log")
        self.proc = spawn(
            [
                exe,
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                d,
                "--protected-mode",
                "yes",
                "--loglevel",
                "warning",
            ],
            log,
        )

        def up() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    return s.recv(16).startswith(b"+PONG")
            except OSError:
                return False

        wait_for(up, "redis-server", self.proc, log)

    def flush(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port), timeout=30) as s:
            s.sendall(b"FLUSHALL\r\n")
            s.recv(16)


REDIS = RedisServer()


class RedisC(System):
    name = "redis-c"

    def start(self, work: str, max_size: int, working_set: int) -> dict[str, Any]:
        exe = shutil.which("redis-benchmark")
        if exe is None:
            raise Unavailable("redis-benchmark is not installed (Debian package redis-tools)")
        self.exe = exe
        if REDIS.proc is None:
            REDIS.start(work)
        return {"server": REDIS.version, "client": "redis-benchmark -c 1 -P 1 --csv", "bytes_checked": False}

    def run(self, blocks: Blocks, size: int, n: int, tag: str) -> dict[str, Any]:
        r = subprocess.run(
            [
                self.exe,
                "-h",
                "127.0.0.1",
                "-p",
                str(REDIS.port),
                "-t",
                "set,get",
                "-d",
                str(size),
                "-n",
                str(n),
                "-c",
                "1",
                "-P",
                "1",
                "--csv",
                "--precision",
                "3",
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if r.returncode != 0:
            raise RuntimeError(f"redis-benchmark failed ({r.returncode}): {r.stderr.strip()[-500:]}")
        rows = {row["test"]: row for row in csv.DictReader(io.StringIO(r.stdout))}
        if "SET" not in rows or "GET" not in rows:
            raise RuntimeError(f"redis-benchmark printed no SET/GET rows: {r.stdout[-500:]}")
        REDIS.flush()
        out: dict[str, Any] = {"ops": n, "wrong_bytes": None}
        for op, test in (("put", "SET"), ("get", "GET")):
            row = rows[test]
            out[f"{op}_gbps"] = float(row["rps"]) * size / 1e9
            out[f"{op}_pct_us"] = {k: float(row[f"{k}_latency_ms"]) * 1e3 for k in ("min", "p50", "p95", "p99", "max")}
            out[f"{op}_pct_us"]["avg"] = float(row["avg_latency_ms"]) * 1e3
        return out


class RedisPy(System):
    name = "redis-py"

    def start(self, work: str, max_size: int, working_set: int) -> dict[str, Any]:
        try:
            import redis
        except ImportError as e:
            raise Unavailable(f"the redis Python client is not installed ({e})") from e
        if REDIS.proc is None:
            REDIS.start(work)
        self.r = redis.Redis(host="127.0.0.1", port=REDIS.port)
        return {"server": REDIS.version, "client": f"redis-py {redis.__version__}", "bytes_checked": True}

    def run(self, blocks: Blocks, size: int, n: int, tag: str) -> dict[str, Any]:
        keys = [f"{tag}:{i}" for i in range(n)]
        put = timed_loop(n, lambda i: self.r.set(keys[i], blocks.block(i, size)))

        def get(i: int) -> Any | None:
            got = self.r.get(keys[i])
            return None if got is None or len(got) != size else got

        g = Gets(blocks, size)
        g.run(n, get)
        self.r.flushall()
        return point(size, n, put, g.timing, g.wrong)

    def stop(self) -> None:
        if hasattr(self, "r"):
            self.r.close()


class Mooncake(System):
    name = "mooncake"
    local_segment = False

    def start(self, work: str, max_size: int, working_set: int) -> dict[str, Any]:
        os.environ.setdefault("GLOG_minloglevel", "2")  # the client logs every step at INFO otherwise
        try:
            from importlib.metadata import version

            from mooncake.store import MooncakeDistributedStore

            ver = version("mooncake-transfer-engine-non-cuda")
        except Exception as e:  # ImportError, or a missing shared library (OSError)
            raise Unavailable(f"import mooncake.store failed: {type(e).__name__}: {e}") from e
        import mooncake

        bindir = os.path.dirname(mooncake.__file__)
        self.d = tempfile.mkdtemp(prefix="mooncake-", dir=work)
        rpc, meta, metrics = free_port(), free_port(), free_port()
        mlog = os.path.join(self.d, "master.log")
        master = [
            os.path.join(bindir, "mooncake_master"),
            "--rpc_address=127.0.0.1",
            f"--rpc_port={rpc}",
            "--enable_http_metadata_server=true",
            "--http_metadata_server_host=127.0.0.1",
            f"--http_metadata_server_port={meta}",
            "--metrics_host=127.0.0.1",
            f"--metrics_port={metrics}",
        ]
        self.procs: list[subprocess.Popen[bytes]] = [spawn(master, mlog, cwd=self.d)]

        def listening(port: int) -> Any:
            def up() -> bool:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    return True
                except OSError:
                    return False

            return up

        wait_for(listening(rpc), "mooncake_master", self.procs[0], mlog)
        wait_for(listening(meta), "mooncake_master (metadata server)", self.procs[0], mlog)
        metadata = f"http://127.0.0.1:{meta}/metadata"
        segment = working_set + 2 * max_size + 64 * MiB
        if not self.local_segment:
            slog = os.path.join(self.d, "store.log")
            port = free_port()
            client = [
                os.path.join(bindir, "mooncake_client"),
                "--host=127.0.0.1",
                f"--port={port}",
                f"--global_segment_size={segment}",
                f"--master_server_address=127.0.0.1:{rpc}",
                f"--metadata_server={metadata}",
                "--protocol=tcp",
            ]
            self.procs.append(spawn(client, slog, cwd=self.d))
            wait_for(listening(port), "mooncake_client (store process)", self.procs[1], slog)
        self.store = MooncakeDistributedStore()
        rc = self.store.setup(
            "127.0.0.1",
            metadata,
            segment if self.local_segment else 0,
            2 * max_size + 16 * MiB,
            "tcp",
            "",
            f"127.0.0.1:{rpc}",
        )
        if rc != 0:
            raise Unavailable(f"MooncakeDistributedStore.setup returned {rc}")
        self.dst = np.zeros(max_size, dtype=np.uint8)
        self.registered = False
        return {
            "package": f"mooncake-transfer-engine-non-cuda {ver}",
            "protocol": "tcp",
            "segment": "mounted by this client" if self.local_segment else "in a separate mooncake_client process",
            "api": "put_from / get_into on registered buffers",
            "bytes_checked": True,
        }

    def run(self, blocks: Blocks, size: int, n: int, tag: str) -> dict[str, Any]:
        s = self.store
        if not self.registered:
            for a, ln in ((blocks.addr, len(blocks.base)), (int(self.dst.ctypes.data), len(self.dst))):
                rc = s.register_buffer(a, ln)
                if rc != 0:
                    raise RuntimeError(f"mooncake register_buffer returned {rc}")
            self.registered = True
        keys = [f"{tag}:{i}" for i in range(n)]
        fails = []

        def put(i: int) -> None:
            rc = s.put_from(keys[i], blocks.addr + blocks.offset(i), size)
            if rc != 0:
                fails.append(rc)

        p = timed_loop(n, put)
        if fails:
            raise RuntimeError(f"mooncake put_from failed {len(fails)} of {n} times (first code {fails[0]})")
        da = int(self.dst.ctypes.data)
        g = Gets(blocks, size)
        g.run(n, lambda i: self.dst if s.get_into(keys[i], da, size) == size else None)
        for k in keys:
            s.remove(k, True)
        return point(size, n, p, g.timing, g.wrong)

    def stop(self) -> None:
        try:
            if hasattr(self, "store"):
                self.store.close()
        finally:
            for p in reversed(getattr(self, "procs", [])):
                stop(p)
            if hasattr(self, "d"):
                shutil.rmtree(self.d, ignore_errors=True)


class MooncakeLocal(Mooncake):
    name = "mooncake-local"
    local_segment = True


class OrbitKV(System):
    name = "orbitkv"

    def start(self, work: str, max_size: int, working_set: int) -> dict[str, Any]:
        from orbitkv import _native
        from orbitkv.launch import serve_command

        self.nat = _native
        self.d = tempfile.mkdtemp(prefix="orbitkv-", dir=work)
        sock = os.path.join(self.d, "manager.sock")
        seg = max(256 * MiB, max_size)
        dram = -(-(working_set + 2 * max_size) // seg) * seg
        log = os.path.join(self.d, "manager.log")
        self.proc: subprocess.Popen[bytes] | None = spawn(
            serve_command(sock, "--dram-size", str(dram), "--segment-size", str(seg)), log
        )

        def up() -> bool:
            try:
                _native.Client(sock).close()
                return True
            except _native.ManagerUnavailable:
                return False

        wait_for(up, "orbitkv serve", self.proc, log)
        self.c = _native.Client(sock, timeout_ms=60000)
        self.dst = np.zeros(max_size, dtype=np.uint8)
        return {
            "version": _native.__version__,
            "dram_bytes": dram,
            "segment_bytes": seg,
            "api": "save (put); lookup + restore + release (get)",
            "bytes_checked": True,
        }

    def run(self, blocks: Blocks, size: int, n: int, tag: str) -> dict[str, Any]:
        from orbitkv.hashing import fingerprint

        c = self.c
        ns = c.register_namespace(fingerprint(bench="peers", block_bytes=size), size)
        evictions0 = int(c.stats().get("evictions_total", 0))
        hashes = [hashlib.sha256(f"{tag}:{i}".encode()).digest() for i in range(n)]
        refused = []

        def put(i: int) -> None:
            r = c.save(ns, [hashes[i]], blocks.block(i, size))
            if r.stored != 1:
                refused.append((i, r.stored, r.already_present, r.refused))

        p = timed_loop(n, put)
        if refused:
            raise RuntimeError(f"orbitkv save stored nothing for {len(refused)} of {n} blocks: {refused[:3]}")
        dst = memoryview(self.dst.data).cast("B")[:size]
        g = Gets(blocks, size)
        phases: dict[str, list[float]] = {"lookup": [], "restore": [], "release": []}
        for i in range(n):
            t = time.perf_counter_ns()
            lease = c.lookup(ns, [hashes[i]])
            t1 = time.perf_counter_ns()
            hit = lease.hit_blocks
            if hit:
                c.restore(lease, dst)
            t2 = time.perf_counter_ns()
            c.release(lease)
            t3 = time.perf_counter_ns()
            phases["lookup"].append((t1 - t) / 1e3)
            phases["restore"].append((t2 - t1) / 1e3)
            phases["release"].append((t3 - t2) / 1e3)
            g.timed(t3 - t)
            g.check(i, self.dst if hit == 1 else None)
        evictions = int(c.stats().get("evictions_total", 0)) - evictions0
        # Frees this point's blocks (the Manager frees a reset generation's blocks), so the
        # next point never evicts and the arena needs to hold one point only.
        c.reset_generation(ns)
        return point(
            size,
            n,
            p,
            g.timing,
            g.wrong,
            misses=g.misses,
            evictions=evictions,
            get_phase_p50_us={k: statistics.median(v) for k, v in phases.items()},
        )

    def stop(self) -> None:
        try:
            if hasattr(self, "c"):
                self.c.close()
        finally:
            stop(getattr(self, "proc", None))
            if hasattr(self, "d"):
                shutil.rmtree(self.d, ignore_errors=True)


class OrbitKVMapped(OrbitKV):
    """The same Manager and protocol, but the bytes copied by this process through the
    public arena mapping (`begin_save` + memmove into the slot + `commit_save`; `lookup` +
    `acquire` + memmove out of the slot + `release`), the path GPU copy engines use. Shows
    what `save`/`restore` cost beyond the protocol round trips and one memcpy."""

    name = "orbitkv-mapped"

    def start(self, work: str, max_size: int, working_set: int) -> dict[str, Any]:
        info = super().start(work, max_size, working_set)
        info["api"] = (
            "begin_save + memmove into the slot + commit_save (put); lookup + acquire + memmove "
            "out of the slot + release (get)"
        )
        return info

    def run(self, blocks: Blocks, size: int, n: int, tag: str) -> dict[str, Any]:
        from orbitkv.hashing import fingerprint

        c = self.c
        ns = c.register_namespace(fingerprint(bench="peers-mapped", block_bytes=size), size)
        evictions0 = int(c.stats().get("evictions_total", 0))
        hashes = [hashlib.sha256(f"{tag}:{i}".encode()).digest() for i in range(n)]
        seg_addr: dict[int, int] = {}

        def addr(seg: int) -> int:
            if seg not in seg_addr:
                seg_addr[seg] = c.segment_address(seg)[0]
            return seg_addr[seg]

        refused = []

        def put(i: int) -> None:
            pending = c.begin_save(ns, [hashes[i]])
            slot = pending.slots[0]
            if slot is None:
                c.abort_save(pending)
                refused.append(i)
                return
            ctypes.memmove(addr(slot[0]) + slot[1], blocks.addr + blocks.offset(i), size)
            c.commit_save(pending)

        p = timed_loop(n, put)
        if refused:
            raise RuntimeError(f"orbitkv begin_save allocated nothing for {len(refused)} of {n} blocks")
        da = int(self.dst.ctypes.data)

        def get(i: int) -> Any | None:
            lease = c.lookup(ns, [hashes[i]])
            hit = lease.hit_blocks
            if hit:
                ((seg, off),) = c.acquire(lease)
                ctypes.memmove(da, addr(seg) + off, size)
            c.release(lease)
            return self.dst if hit == 1 else None

        g = Gets(blocks, size)
        g.run(n, get)
        evictions = int(c.stats().get("evictions_total", 0)) - evictions0
        c.reset_generation(ns)
        return point(size, n, p, g.timing, g.wrong, misses=g.misses, evictions=evictions)


CLASSES: dict[str, type[System]] = {
    c.name: c for c in (Memcpy, RedisC, RedisPy, Mooncake, MooncakeLocal, OrbitKV, OrbitKVMapped)
}


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def summarise(points: list[dict[str, Any]], size: int) -> dict[str, Any]:
    out: dict[str, Any] = {"ops_per_rep": points[0]["ops"], "reps": len(points)}
    for op in ("put", "get"):
        g = [p[f"{op}_gbps"] for p in points]
        out[f"{op}_gbps_reps"] = g
        out[f"{op}_gbps"] = statistics.median(g)
        if f"{op}_lat_us" in points[0]:
            lat = [x for p in points for x in p[f"{op}_lat_us"]]
            out[f"{op}_lat_us"] = {
                "p50": pct(lat, 0.5),
                "p90": pct(lat, 0.9),
                "p99": pct(lat, 0.99),
                "min": min(lat),
                "max": max(lat),
            }
        else:  # redis-benchmark: percentiles per rep, the median of each over reps
            keys = points[0][f"{op}_pct_us"].keys()
            out[f"{op}_lat_us"] = {k: statistics.median(p[f"{op}_pct_us"][k] for p in points) for k in keys}
    for op in ("put", "get"):  # robust to preemption on a shared machine: one block / median latency
        out[f"{op}_gbps_at_p50"] = size / out[f"{op}_lat_us"]["p50"] / 1e3
    w = [p["wrong_bytes"] for p in points]
    out["wrong_bytes"] = None if any(x is None for x in w) else sum(w)
    for k in ("misses", "evictions"):
        if k in points[0]:
            out[k] = sum(p[k] for p in points)
    if "get_phase_p50_us" in points[0]:  # median over reps of each rep's median
        out["get_phase_p50_us"] = {
            k: statistics.median(p["get_phase_p50_us"][k] for p in points) for k in points[0]["get_phase_p50_us"]
        }
    return out


def _pyplot() -> Any:
    """matplotlib's pyplot, drawing to files only (the Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save_figure(fig: Any, doc: dict[str, Any], path: str) -> None:
    """`fig` under the machine's summary, written to `path` as PNG."""
    fig.suptitle(doc["machine"]["summary"], fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def plot_gbps(doc: dict[str, Any], path: str) -> None:
    fig, axes = _pyplot().subplots(2, 2, figsize=(12, 9))
    cells = [
        (axes[r][c], op, metric, ylabel)
        for r, (metric, ylabel) in enumerate(
            (("gbps", "GB/s: bytes / time of all ops (median of reps)"), ("gbps_at_p50", "GB/s: block / p50 latency"))
        )
        for c, op in enumerate(("put", "get"))
    ]
    for ax, op, metric, ylabel in cells:
        title = f"{op} ({'save' if op == 'put' else 'restore'}), one client"
        for name, s in doc["systems"].items():
            if s["status"] != "ok":
                continue
            sizes = [int(k) for k in s["points"]]
            ax.plot(
                sizes,
                [s["points"][str(z)][f"{op}_{metric}"] for z in sizes],
                marker="o",
                linestyle="--" if name == "memcpy" else "-",
                label=name,
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(doc["sizes"], [size_name(z) for z in doc["sizes"]])
        ax.set_xlabel("block size")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    _save_figure(fig, doc, path)


def plot_latency(doc: dict[str, Any], path: str) -> None:
    fig, axes = _pyplot().subplots(1, 2, figsize=(12, 4.5))
    key = str(LATENCY_SIZE)
    for ax, op in ((axes[0], "put"), (axes[1], "get")):
        for name, s in doc["systems"].items():
            if s["status"] != "ok" or key not in s["points"]:
                continue
            samples = doc["latency_samples_us"].get(name, {}).get(op)
            if samples:
                xs = sorted(samples)
                ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=name)
            else:  # redis-benchmark reports percentiles only
                p = s["points"][key][f"{op}_lat_us"]
                ax.plot(
                    [p["min"], p["p50"], p["p95"], p["p99"], p["max"]],
                    [0, 0.5, 0.95, 0.99, 1.0],
                    "s:",
                    label=f"{name} (min/p50/p95/p99/max)",
                )
        ax.set_xscale("log")
        ax.set_xlabel("latency per operation (µs)")
        ax.set_ylabel("fraction of operations")
        ax.set_title(f"{op} latency CDF, {size_name(LATENCY_SIZE)} blocks, one client")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    _save_figure(fig, doc, path)


def markdown(doc: dict[str, Any]) -> str:
    """The table for docs/performance.md: per system and size, GB/s (median of reps, total
    bytes / total time) and p50 / p99 latency, put then get."""
    lines = [
        "| system | block | put GB/s | put p50 / p99 µs | get GB/s | get p50 / p99 µs |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in doc["systems"].items():
        if s["status"] != "ok":
            lines.append(f"| {name} | all | unavailable: {s['reason']} | | | |")
            continue
        for z in doc["sizes"]:
            p = s["points"][str(z)]
            cells = []
            for op in ("put", "get"):
                lat = p[f"{op}_lat_us"]
                cells += [f"{p[f'{op}_gbps']:.2f}", f"{lat['p50']:.0f} / {lat['p99']:.0f}"]
            lines.append(f"| {name} | {size_name(z)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_views(doc: dict[str, Any], a: argparse.Namespace) -> None:
    """The Markdown table and the plots of `doc` that the command line asks for."""
    if a.markdown:
        Path(a.markdown).write_text(markdown(doc))
    if a.png_gbps:
        plot_gbps(doc, a.png_gbps)
    if a.png_latency:
        plot_latency(doc, a.png_latency)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", default=",".join(ALL_SYSTEMS), help=f"comma-separated subset of {ALL_SYSTEMS}")
    ap.add_argument("--sizes", default="64KiB,256KiB,1MiB,4MiB,16MiB")
    ap.add_argument("--reps", type=int, default=3, help="repetitions, each running every size and system")
    ap.add_argument("--warmup", type=int, default=1, help="untimed repetitions first (not reported)")
    ap.add_argument("--bytes-per-point", default="128MiB", help="data put and got per (system, size, rep)")
    ap.add_argument("--min-ops", type=int, default=16)
    ap.add_argument("--max-ops", type=int, default=1000)
    ap.add_argument("--quick", action="store_true", help="tiny run for tests: 64KiB,1MiB, 4 MiB per point, 1 rep")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--out", default="bench-results/peers.json")
    ap.add_argument("--png-gbps", default=None)
    ap.add_argument("--png-latency", default=None)
    ap.add_argument("--markdown", default=None, help="also write the table as Markdown here")
    ap.add_argument("--replot", default=None, help="only redraw the plots / table from this JSON")
    a = ap.parse_args()
    if a.replot:
        write_views(json.loads(Path(a.replot).read_text()), a)
        return 0
    if a.quick:
        a.sizes, a.reps, a.warmup, a.bytes_per_point, a.min_ops = "64KiB,1MiB", 1, 0, "4MiB", 4
    systems = [s for s in a.systems.split(",") if s]
    for s in systems:
        if s not in CLASSES:
            ap.error(f"unknown system {s!r}; known: {ALL_SYSTEMS}")
    sizes = [parse_size(z) for z in a.sizes.split(",")]
    per_point = parse_size(a.bytes_per_point)
    ops = {z: max(a.min_ops, min(a.max_ops, per_point // z)) for z in sizes}
    max_size = max(sizes)
    working_set = max(ops[z] * z for z in sizes)
    work = a.workdir or ("/var/tmp" if os.path.isdir("/var/tmp") else tempfile.gettempdir())
    blocks = Blocks(max_size, a.seed)
    cpus = os.cpu_count() or 0
    summary = (
        f"{platform.machine()}, {cpus} CPUs, {platform.system()} {platform.release()}, one client, "
        f"median of {a.reps} interleaved reps"
    )
    doc: dict[str, Any] = {
        "bench": "peers",
        "machine": {"cpus": cpus, "summary": summary, "python": platform.python_version()},
        "sizes": sizes,
        "reps": a.reps,
        "warmup_reps": a.warmup,
        "ops": {str(z): ops[z] for z in sizes},
        "systems": {},
        "latency_samples_us": {},
    }
    live: dict[str, System] = {}
    raw: dict[str, dict[int, list[dict[str, Any]]]] = {}
    try:
        for name in systems:
            sysobj = CLASSES[name]()
            try:
                info = sysobj.start(work, max_size, working_set)
            except Unavailable as e:
                doc["systems"][name] = {"status": "unavailable", "reason": str(e)}
                print(f"{name}: unavailable: {e}", file=sys.stderr)
                sysobj.stop()
                continue
            live[name] = sysobj
            raw[name] = {z: [] for z in sizes}
            doc["systems"][name] = {"status": "ok", "info": info}
        for rep in range(-a.warmup, a.reps):  # rep < 0: warm-up (first touch of every buffer), not kept
            for z in sizes:
                for name, sysobj in live.items():
                    r = sysobj.run(blocks, z, ops[z], f"r{rep}-s{z}")
                    if rep >= 0:
                        raw[name][z].append(r)
                    elif r["wrong_bytes"]:
                        raise SystemExit(f"peers: {name} returned {r['wrong_bytes']} wrong bytes in the warm-up")
                    print(
                        f"rep {rep} {size_name(z):>7} {name:>15}: put {r['put_gbps']:7.3f} GB/s  "
                        f"get {r['get_gbps']:7.3f} GB/s  wrong bytes {r['wrong_bytes']}",
                        flush=True,
                    )
    finally:
        # Every system and Redis are stopped even when one stop fails; the first failure is raised.
        failures: list[BaseException] = []
        for stopper in [sysobj.stop for sysobj in live.values()] + [lambda: stop(REDIS.proc)]:
            try:
                stopper()
            except BaseException as e:  # re-raised below, once the rest are stopped
                failures.append(e)
        if failures:
            raise failures[0]
    for name in live:
        doc["systems"][name]["points"] = {str(z): summarise(raw[name][z], z) for z in sizes}
        if LATENCY_SIZE in sizes and "put_lat_us" in raw[name][LATENCY_SIZE][0]:
            doc["latency_samples_us"][name] = {
                op: [x for p in raw[name][LATENCY_SIZE] for x in p[f"{op}_lat_us"]] for op in ("put", "get")
            }
    key = str(LATENCY_SIZE)

    def g(name: str, metric: str) -> float | None:
        s = doc["systems"].get(name, {})
        return s["points"][key][metric] if s.get("status") == "ok" and key in s["points"] else None

    ratios: dict[str, Any] = {}
    for ours, peers in (
        ("orbitkv-mapped", ("redis-c", "mooncake", "memcpy")),
        ("orbitkv", ("redis-c", "redis-py", "mooncake", "mooncake-local", "memcpy")),
    ):
        for peer in peers:
            for op in ("put", "get"):
                for metric, label in ((f"{op}_gbps", ""), (f"{op}_gbps_at_p50", " (p50 latency)")):
                    o, p = g(ours, metric), g(peer, metric)
                    if o is not None and p:
                        ratios[f"{ours}/{peer} {op} @1MiB{label}"] = o / p
    doc["ratios"] = ratios
    wrong = [s["points"][str(z)]["wrong_bytes"] for s in doc["systems"].values() if s["status"] == "ok" for z in sizes]
    doc["wrong_bytes"] = sum(w for w in wrong if w is not None)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {a.out} ({doc['wrong_bytes']} wrong bytes)")
    for k, v in ratios.items():
        print(f"  {k}: {v:.2f}x")
    write_views(doc, a)
    return 1 if doc["wrong_bytes"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
