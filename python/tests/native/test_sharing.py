"""Real client processes share blocks through one real Manager process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from orbitkv.hashing import chain_hashes, chain_root, fingerprint

pytestmark = pytest.mark.native

BB = 32 * 1024
FP = fingerprint(model="test", block_bytes=BB)


def expected(h: bytes) -> bytes:
    return h * (BB // 32)


def run_child(code: str, socket: str) -> str:
    script = textwrap.dedent(code)
    out = subprocess.run([sys.executable, "-c", script, socket], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_two_processes_cold_partial_full_byte_exact(manager) -> None:  # type: ignore[no-untyped-def]
    root = chain_root(FP)
    hashes = chain_hashes(list(range(16 * 10)), 16, root)  # 10 blocks
    c = manager.client()
    ns = c.register_namespace(FP, BB)
    # Cold miss.
    lease = c.lookup(ns, hashes)
    assert lease.hit_blocks == 0 and lease.released

    # Another process saves the first 6 blocks.
    out = run_child(
        f"""
        import sys
        from orbitkv import _native
        from orbitkv.hashing import chain_hashes, chain_root
        fp = bytes.fromhex("{FP.hex()}")
        hs = chain_hashes(list(range(160)), 16, chain_root(fp))[:6]
        with _native.Client(sys.argv[1]) as c:
            ns = c.register_namespace(fp, {BB})
            r = c.save(ns, hs, [h * ({BB} // 32) for h in hs])
            print(r.stored, r.already_present, r.refused, r.bytes_copied)
        """,
        manager.socket,
    )
    assert out.split() == ["6", "0", "0", str(6 * BB)]

    # Partial hit in this process, into one numpy buffer.
    lease = c.lookup(ns, hashes)
    assert lease.hit_blocks == 6
    dst = np.zeros(10 * BB, dtype=np.uint8)
    assert c.restore(lease, dst[: 6 * BB]) == 6 * BB  # exactly the hit
    c.release(lease)
    c.release(lease)  # idempotent
    for i in range(6):
        assert dst[i * BB : (i + 1) * BB].tobytes() == expected(hashes[i])
    assert not dst[6 * BB :].any(), "bytes past the hit are untouched"

    # Save the rest from here (a float16 array viewed as bytes), full hit in a third process.
    rest = [np.frombuffer(expected(h), dtype=np.float16).copy() for h in hashes[6:]]
    r = c.save(ns, hashes[6:], rest)
    assert (r.stored, r.already_present) == (4, 0)
    out = run_child(
        f"""
        import sys
        from orbitkv import _native
        from orbitkv.hashing import chain_hashes, chain_root
        fp = bytes.fromhex("{FP.hex()}")
        hs = chain_hashes(list(range(160)), 16, chain_root(fp))
        with _native.Client(sys.argv[1]) as c:
            ns = c.register_namespace(fp, {BB})
            lease = c.lookup(ns, hs)
            bufs = [bytearray({BB}) for _ in hs]
            n = c.restore(lease, bufs)
            c.release(lease)
            ok = all(bytes(b) == h * ({BB} // 32) for b, h in zip(bufs, hs))
            print(lease.hit_blocks, n, ok)
        """,
        manager.socket,
    )
    assert out.split() == ["10", str(10 * BB), "True"]
    c.close()
    st = manager.stats()
    assert st["live_leases"] == 0 and st["live_saves"] == 0
    assert st["blocks_committed_total"] == 10


def test_restore_subranges_and_two_step_save(manager) -> None:  # type: ignore[no-untyped-def]
    c = manager.client()
    ns = c.register_namespace(FP, BB)
    hs = [bytes([i]) * 32 for i in range(1, 5)]
    p = c.begin_save(ns, hs)
    assert p.statuses == ["allocated"] * 4 and all(s is not None for s in p.slots)
    other = manager.client()
    assert other.lookup(ns, hs).hit_blocks == 0, "uncommitted blocks are invisible"
    c.abort_save(p)
    c.abort_save(p)  # idempotent
    with pytest.raises(ValueError, match="already committed or aborted"):
        c.commit_save(p)
    assert c.save(ns, hs, b"".join(expected(h) for h in hs)).stored == 4
    lease = other.lookup(ns, hs)
    part = bytearray(2 * BB)
    assert other.restore(lease, part, start=1, count=2) == 2 * BB
    assert bytes(part) == expected(hs[1]) + expected(hs[2])
    with pytest.raises(ValueError, match="outside the 4 hit"):
        other.restore(lease, part, start=3, count=2)
    other.release(lease)
    with pytest.raises(ValueError, match="already released"):
        other.restore(lease, part)


def test_salts_shards_and_fingerprints_never_share(manager) -> None:  # type: ignore[no-untyped-def]
    c = manager.client()
    hs = [bytes([9]) * 32]
    base = c.register_namespace(FP, BB)
    c.save(ns := base, hs, expected(hs[0]))
    assert c.lookup(ns, hs).hit_blocks == 1
    for other in (
        c.register_namespace(FP, BB, salt=b"tenant-a"),
        c.register_namespace(FP, BB, salt=b"tenant-b"),
        c.register_namespace(FP, BB, shard=1),
        c.register_namespace(fingerprint(model="other"), BB),
    ):
        assert other.id != base.id
        assert c.lookup(other, hs).hit_blocks == 0
    # Salts are length-tagged: b"a" and b"a\0" are different domains.
    assert c.register_namespace(FP, BB, salt=b"a").id != c.register_namespace(FP, BB, salt=b"a\0").id
