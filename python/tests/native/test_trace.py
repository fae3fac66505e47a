"""`orbitkv trace` against a real Manager: nothing is recorded until a trace is armed;
armed, each lookup is recorded with its hits and the block it stopped at and why
(absent, evicted, being saved by another session, present under another salt),
its lease's restore and release with the lease's lifetime, generation resets; the
filters by namespace and process; the bounded ring; the CLI's lines."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = pytest.mark.native
_native = pytest.importorskip("orbitkv._native")

FP = b"t" * 32
OTHER = b"o" * 32
BLOCK = 4096


def hashes(tag: bytes, n: int) -> list[bytes]:
    return [tag + bytes([i]) * (32 - len(tag)) for i in range(n)]


def events(tracer: Any, cursor: int, *kinds: str) -> tuple[list[dict[str, Any]], int]:
    """The events after `cursor` (only those of `kinds`, when given) and the next cursor."""
    r = tracer.trace(5000, cursor=cursor)
    return [e for e in r["events"] if not kinds or e["event"] in kinds], int(r["next"])


@contextlib.contextmanager
def armed(m: Any, window_ms: int) -> Iterator[tuple[Any, Any, Any, int]]:
    """(client, tracer, namespace, cursor): a client of Manager `m` with namespace FP
    registered, then a tracer client (no arena) that armed a trace for `window_ms`."""
    with m.client() as c, m.client(map_arena=False) as tracer:
        ns = c.register_namespace(FP, BLOCK)
        yield c, tracer, ns, int(tracer.trace(window_ms)["next"])


def test_nothing_is_recorded_until_armed_then_each_stop_is_explained(manager: Any) -> None:
    with manager.client() as c, manager.client(map_arena=False) as tracer:
        ns = c.register_namespace(FP, BLOCK)
        chain = hashes(b"a", 6)
        c.save(ns, chain[:4], os.urandom(4 * BLOCK))
        with c.lookup(ns, chain):
            pass  # before any trace: not recorded
        first = tracer.trace(5000)  # arm; from now on
        assert first["events"] == [] and first["armed"] is True and first["missed"] == 0
        cursor = int(first["next"])

        # 1. a partial hit: stopped at block 4, absent; then its restore and release
        lease = c.lookup(ns, chain)
        c.acquire(lease)
        time.sleep(0.01)
        c.release(lease)
        got, cursor = events(tracer, cursor)
        assert [e["event"] for e in got] == ["lookup", "acquire", "release"]
        lk, aq, rl = got
        assert lk["namespace"] == FP.hex() and lk["asked"] == 6 and lk["hit"] == 4 and lk["pid"] == os.getpid()
        assert lk["stop"] == {"block": 4, "hash": chain[4].hex(), "reason": "absent"}
        assert aq["lease"] == rl["lease"] == lk["lease"] and aq["blocks"] == 4
        assert rl["held_us"] >= 10_000 and rl["quiet"] is False
        assert [e["seq"] for e in got] == sorted(e["seq"] for e in got) and all("time" in e for e in got)

        # 2. block 4 allocated by an open save of another session: "being saved"
        with manager.client() as saver:
            pending = saver.begin_save(saver.register_namespace(FP, BLOCK), chain[4:5])
            with c.lookup(ns, chain):
                pass
            got, cursor = events(tracer, cursor, "lookup")
            stop = got[0]["stop"]
            assert stop["reason"] == "being saved" and stop["saving_session"] == saver.session_id
            saver.abort_save(pending)

        # 3. the block under another salt only: "other salt"
        salted = c.register_namespace(FP, BLOCK, salt=b"tenant-b")
        c.save(salted, chain[4:5], os.urandom(BLOCK))
        with c.lookup(ns, chain):
            pass
        got, cursor = events(tracer, cursor, "lookup")
        assert got[0]["stop"]["reason"] == "other salt" and got[0]["salted"] is False

        # 4. a full hit has no stop; a quiet release is recorded as one
        c.save(ns, chain[4:], os.urandom(2 * BLOCK))
        lease = c.lookup(ns, chain)
        c.release(lease, wait=False)
        with c.lookup(ns, chain[:1]):
            pass  # the quiet release is handled before this request
        got, cursor = events(tracer, cursor, "lookup", "release")
        full, quiet = got[0], got[1]
        assert full["hit"] == 6 and "stop" not in full
        assert quiet["event"] == "release" and quiet["quiet"] is True and quiet["lease"] == full["lease"]

        # 5. a generation reset, and the lookup after it (the chain's blocks are purged)
        assert c.reset_generation(ns) == 1
        with c.lookup(ns, chain):
            pass
        got, cursor = events(tracer, cursor)
        reset = next(e for e in got if e["event"] == "reset")
        after = [e for e in got if e["event"] == "lookup"][-1]
        assert reset["generation"] == 1 and reset["namespace"] == FP.hex()
        assert after["generation"] == 1 and after["hit"] == 0 and after["stop"]["reason"] == "absent"

        # stopped: nothing more is recorded
        tracer.trace(0, cursor=cursor)
        with c.lookup(ns, chain):
            pass
        r = tracer.trace(0, cursor=cursor)
        assert r["events"] == [] and r["armed"] is False


def test_a_block_that_left_the_cache_while_armed_is_reported_evicted(manager_factory: Any) -> None:
    m = manager_factory("--dram-size", "1MiB")  # 256 blocks of 4 KiB
    with armed(m, 60_000) as (c, tracer, ns, cursor):
        first = hashes(b"e", 1)
        c.save(ns, first, os.urandom(BLOCK))
        for i in range(8):  # 4x the arena of other blocks, never hit: the first is evicted
            batch = [bytes([i]) + j.to_bytes(2, "little") + b"x" * 29 for j in range(128)]
            c.save(ns, batch, os.urandom(128 * BLOCK))
        with c.lookup(ns, first + hashes(b"never", 1)):
            pass
        with c.lookup(ns, hashes(b"never", 1)):
            pass
        got, _ = events(tracer, cursor)
        evicted, never = (e["stop"] for e in got if e["event"] == "lookup")
        assert evicted["block"] == 0 and evicted["reason"] == "evicted" and evicted["left_us_ago"] > 0
        assert never["reason"] == "absent"  # never saved: not in the record of blocks that left
        tracer.trace(0)


def test_filters_keep_one_namespace_and_one_process(manager: Any) -> None:
    with manager.client() as c, manager.client(map_arena=False) as tracer:
        a, b = c.register_namespace(FP, BLOCK), c.register_namespace(OTHER, BLOCK)
        cursor = int(tracer.trace(5000, fingerprint=FP)["next"])
        for ns in (a, b, a):
            with c.lookup(ns, hashes(b"f", 2)):
                pass
        got, cursor = events(tracer, cursor)
        assert [e["namespace"] for e in got] == [FP.hex(), FP.hex()]
        r = tracer.trace(5000, pid=os.getpid() + 1, cursor=cursor)
        with c.lookup(a, hashes(b"f", 2)):
            pass
        assert tracer.trace(5000, cursor=int(r["next"]))["events"] == []
        with pytest.raises(ValueError, match="fingerprint"):
            tracer.trace(5000, fingerprint=b"short")
        with pytest.raises(ValueError, match="exceeds 3600000"):
            tracer.trace(3_600_001)


def test_the_ring_is_bounded_and_a_slow_reader_is_told_what_it_missed(manager: Any) -> None:
    with armed(manager, 60_000) as (c, tracer, ns, cursor):
        for _ in range(4096 + 100):
            c.release(c.lookup(ns, hashes(b"r", 1)))  # a miss: lookup events only
        r = tracer.trace(60_000, cursor=cursor)
        assert r["missed"] == 100 and len(r["events"]) == 512 and r["more"] is True
        seen = len(r["events"])
        while r["more"]:
            r = tracer.trace(60_000, cursor=int(r["next"]))
            seen += len(r["events"])
        assert seen == 4096
        tracer.trace(0)


def test_the_cli_prints_a_line_per_event(manager: Any) -> None:
    with manager.client() as c:
        ns = c.register_namespace(FP, BLOCK)
        chain = hashes(b"c", 3)
        c.save(ns, chain[:2], os.urandom(2 * BLOCK))
        cli = subprocess.Popen(
            [sys.executable, "-m", "orbitkv", "trace", "--socket", manager.socket, "--seconds", "3",
             "--namespace", FP.hex()[:12]],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(1.0)  # armed by its first poll
        stop = threading.Event()

        def load() -> None:
            while not stop.is_set():
                lease = c.lookup(ns, chain)
                c.acquire(lease)
                c.release(lease)
                time.sleep(0.2)

        t = threading.Thread(target=load)
        t.start()
        out, err = cli.communicate(timeout=30)
        stop.set()
        t.join()
    assert cli.returncode == 0, err
    lines = out.splitlines()
    lookup = [ln for ln in lines if " lookup " in ln]
    assert lookup, out
    assert f"ns {FP.hex()[:16]} gen 0 3 blocks: 2 hit" in lookup[0]
    assert f"stopped at block 2 ({chain[2].hex()[:16]}): absent" in lookup[0]
    assert any(" acquire " in ln and ": 2 blocks," in ln for ln in lines)
    assert any(" release " in ln and " ms" in ln for ln in lines)
    assert "events" in err


def test_the_cli_refuses_bad_input() -> None:
    for args, message in (
        (["--namespace", "xyz"], "must be the namespace fingerprint in hex"),
        (["--seconds", "0"], "--seconds 0 must be above 0"),
    ):
        r = subprocess.run([sys.executable, "-m", "orbitkv", "trace", *args], capture_output=True, text=True)
        assert r.returncode == 2 and message in r.stderr, r.stderr


def test_a_miss_filled_from_a_peer_is_recorded_before_its_lookup(tmp_path: Any) -> None:
    import socket

    from orbitkv.launch import start_serve, stop_process

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "a").mkdir(mode=0o700)
    (tmp_path / "b").mkdir(mode=0o700)
    sa, sb = tmp_path / "a" / "m.sock", tmp_path / "b" / "m.sock"
    a = start_serve(sa, "--dram-size", "32MiB", "--peer-listen", f"127.0.0.1:{port}")
    b = start_serve(sb, "--dram-size", "32MiB", "--peer", f"127.0.0.1:{port}")
    try:
        chain = hashes(b"p", 3)
        with _native.Client(str(sa)) as ca:
            ca.save(ca.register_namespace(FP, BLOCK), chain[:2], os.urandom(2 * BLOCK))
        with _native.Client(str(sb)) as cb, _native.Client(str(sb), map_arena=False) as tracer:
            ns = cb.register_namespace(FP, BLOCK)
            cursor = int(tracer.trace(5000)["next"])
            with cb.lookup(ns, chain) as lease:
                assert lease.hit_blocks == 2
            got, _ = events(tracer, cursor)
        fill, lookup = got[0], got[1]
        assert fill["event"] == "fill" and fill["missing"] == 3 and fill["from_peers"] == 2
        assert fill["from_remote"] == 0 and fill["namespace"] == FP.hex()
        assert lookup["event"] == "lookup" and lookup["hit"] == 2 and lookup["stop"]["reason"] == "absent"
    finally:
        stop_process(b)
        stop_process(a)


def test_a_tp_group_lookup_names_the_shard_that_lacks_the_block(manager_factory: Any) -> None:
    from orbitkv.tracecmd import describe

    m = manager_factory("--enable-query-control")
    chain = hashes(b"tp", 4)
    ranks = []
    for shard, n in enumerate([4, 2]):
        c = m.client()
        ns = c.register_namespace(FP, BLOCK, shard=shard)
        c.save(ns, chain[:n], os.urandom(n * BLOCK))
        ranks.append((c, ns))
    with m.client(map_arena=False) as sched, m.client(map_arena=False) as tracer:
        cursor = int(tracer.trace(5000)["next"])
        shards = [sched.register_namespace(FP, BLOCK, shard=r) for r in range(2)]
        tp = sched.lookup_tp(shards, chain)
        c, ns = ranks[0]
        with c.redeem_tp(tp.token, ns) as lease:
            c.acquire(lease)
        sched.release_tp(tp)
        got, _ = events(tracer, cursor)
    for c, _ in ranks:
        c.close()
    kinds = [e["event"] for e in got]
    assert kinds[:4] == ["lookup_tp", "redeem", "acquire", "release"], kinds
    tpl, redeem = got[0], got[1]
    assert tpl["shards"] == 2 and tpl["asked"] == 4 and tpl["hit"] == 2
    assert tpl["stop"]["block"] == 2 and tpl["stop"]["shard"] == 1 and tpl["stop"]["reason"] == "absent"
    assert redeem["hit"] == 2 and got[3]["lease"] == redeem["lease"]
    assert "TP over 2 shards, 4 blocks: 2 in every shard; stopped at block 2: shard 1 absent" in describe(tpl)


def test_saves_are_traced_with_what_admission_refused(manager_factory: Any) -> None:
    from orbitkv.tracecmd import describe

    m = manager_factory("--dram-size", "1MiB")  # 256 blocks of 4 KiB
    with armed(m, 5000) as (c, tracer, ns, cursor):
        full = hashes(b"s", 256)
        c.save(ns, full, os.urandom(256 * BLOCK))
        with c.lookup(ns, full):  # every block pinned: nothing can be evicted
            r = c.save(ns, hashes(b"z", 1), os.urandom(BLOCK))
            assert r.refused == 1
            pending = c.begin_save(ns, full[:1])  # present already
            c.abort_save(pending)
        got, _ = events(tracer, cursor)
    saves = [e for e in got if e["event"] in ("save", "commit", "abort")]
    first, commit = saves[0], saves[1]
    assert first["allocated"] == 256 and first["refused"] == 0 and commit["committed"] == 256
    assert commit["save"] == first["save"] and commit["after_begin_us"] >= 0
    refused = saves[2]
    assert refused["event"] == "save" and refused["refused"] == 1 and refused["allocated"] == 0
    assert "1 refused (no room: the arena is full of pinned blocks)" in describe(refused)
    present, abort = [e for e in saves[3:] if e["event"] in ("save", "abort")][-2:]
    assert present["present"] == 1 and abort["event"] == "abort" and abort["save"] == present["save"]
