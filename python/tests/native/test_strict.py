"""Client API strictness (issue 7): exact buffer sizes, argument errors that are not
session failures, one salt encoding, context-managed leases and saves, and the
slot-addressed page copies of the client."""

from __future__ import annotations

import ctypes
import hashlib
import os
import socket
import struct

import numpy as np
import pytest

from orbitkv import _native

pytestmark = pytest.mark.native
BB = 4096
FP = b"\x21" * 32


def _hashes(tag: int, n: int) -> list[bytes]:
    return [hashlib.sha256(bytes([tag, i])).digest() for i in range(n)]


def _blocks(n: int, seed: int = 1) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n * BB, dtype=np.uint8).tobytes()


def test_save_with_a_buffer_one_byte_too_large_is_refused_and_stores_nothing(manager) -> None:  # type: ignore[no-untyped-def]
    c = manager.client()
    ns = c.register_namespace(FP, BB)
    hs = _hashes(1, 2)
    with pytest.raises(ValueError, match=rf"expected {2 * BB} bytes .* got {2 * BB + 1}"):
        c.save(ns, hs, _blocks(2) + b"\x00")
    with pytest.raises(ValueError, match=r"expected 2 buffers .* got 3"):
        c.save(ns, hs, [bytes(BB)] * 3)
    with pytest.raises(ValueError, match=rf"buffer 1 size mismatch: expected {BB} bytes .* got {BB + 1}"):
        c.save(ns, hs, [bytes(BB), bytes(BB + 1)])
    with c.lookup(ns, hs) as lease:
        assert lease.hit_blocks == 0  # nothing of a refused save is visible


def test_restore_into_a_larger_buffer_or_extra_buffers_is_refused(manager) -> None:  # type: ignore[no-untyped-def]
    c = manager.client()
    ns = c.register_namespace(FP, BB)
    hs = _hashes(2, 4)
    data = _blocks(4, seed=2)
    assert c.save(ns, hs, data).stored == 4
    lease = c.lookup(ns, hs)
    assert lease.hit_blocks == 4
    with pytest.raises(ValueError, match=rf"expected {4 * BB} bytes .* got {4 * BB + 1}"):
        c.restore(lease, bytearray(4 * BB + 1))
    with pytest.raises(ValueError, match=r"expected 4 buffers .* got 5"):
        c.restore(lease, [bytearray(BB) for _ in range(5)])
    with pytest.raises(ValueError, match=r"expected 2 buffers .* got 4"):
        c.restore(lease, [bytearray(BB) for _ in range(4)], start=2)
    out = bytearray(4 * BB)
    assert c.restore(lease, out) == 4 * BB  # the session is intact: exact sizes work
    assert bytes(out) == data
    c.release(lease)


def test_zero_timeout_and_unknown_segment_are_argument_errors(manager) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="timeout must be positive"):
        manager.client(timeout_ms=0)
    c = manager.client()
    known = {seg for seg, _ in c.segments()}
    missing = max(known) + 1
    with pytest.raises(ValueError, match=rf"no arena segment {missing}") as info:
        c.segment_address(missing)
    assert not isinstance(info.value, _native.ProtocolError)
    ns = c.register_namespace(FP, BB)  # the session is still usable
    assert c.save(ns, _hashes(3, 1), bytes(BB)).stored == 1


def _frame(sock: socket.socket, kind: int, req: int, body: bytes) -> tuple[int, bytes]:
    """One raw request/reply on the wire (16-byte header, little-endian body)."""
    sock.sendall(b"OKV\x01" + struct.pack("<HHII", _native.PROTOCOL_VERSION, kind, len(body), req) + body)

    def read(n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = sock.recv(n - len(out))
            assert chunk, "Manager closed the connection"
            out += chunk
        return out

    head = read(16)
    _, rkind, rlen, _ = struct.unpack("<HHII", head[4:])
    return rkind, read(rlen)


def _wire_namespace(path: str, fp: bytes, salt32: bytes) -> int:
    """Register with an exact 32-byte wire salt over a raw control-only session."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(path)
        kind, _ = _frame(s, 0x01, 1, struct.pack("<III", os.getpid(), 1, 0))  # Hello, control-only
        assert kind == 0x81
        kind, body = _frame(s, 0x02, 2, fp + struct.pack("<I", 0) + salt32 + struct.pack("<Q", BB))
        assert kind == 0x82, body
        return int(struct.unpack("<I", body[:4])[0])


def test_one_salt_encoding_for_every_caller(manager) -> None:  # type: ignore[no-untyped-def]
    """The binding passes the raw salt to the Rust client, which applies the one
    encoding (`namespace_salt`, also checked on the wire for the Rust client in
    crates/orbitkv-manager/tests/client_api.rs): a Python caller with salt S lands in
    the namespace whose wire salt is namespace_salt(S), as a Rust caller does."""
    salt = b"tenant-a"
    enc = _native.namespace_salt(salt)
    assert enc == hashlib.sha256(b"orbitkv-namespace-salt-v1\0" + salt).digest()
    assert _native.namespace_salt(b"") == bytes(32)
    c = manager.client()
    a = c.register_namespace(FP, BB, salt=salt)
    assert _wire_namespace(manager.socket, FP, enc) == a.id
    assert _wire_namespace(manager.socket, FP, bytes(32)) == c.register_namespace(FP, BB).id
    assert manager.client().register_namespace(FP, BB, salt=salt).id == a.id
    # Any length is accepted, and salts that a length tag would confuse stay apart.
    ids = {c.register_namespace(FP, BB, salt=s).id for s in (b"", b"a", b"a\0", b"x" * 33, b"x" * 1000, bytes(32))}
    assert len(ids) == 6 and a.id not in ids


def test_context_managers_release_leases_and_abort_uncommitted_saves(manager) -> None:  # type: ignore[no-untyped-def]
    c = manager.client()
    ns = c.register_namespace(FP, BB)
    hs = _hashes(4, 2)
    # An uncommitted save is aborted on exit, also when the block raises.
    with pytest.raises(RuntimeError, match="boom"):
        with c.begin_save(ns, hs) as pending:
            assert pending.statuses == ["allocated", "allocated"]
            raise RuntimeError("boom")
    assert pending.done
    with c.lookup(ns, hs) as miss:
        assert miss.hit_blocks == 0
    # A committed one stays committed; exit is then a no-op.
    with c.begin_save(ns, hs) as pending:
        c.commit_save(pending)
    with c.lookup(ns, hs) as lease:
        assert lease.hit_blocks == 2 and manager.stats()["live_leases"] == 1
    assert lease.released and manager.stats()["live_leases"] == 0
    c.release(lease)  # releasing again is safe
    # Release inside the block, then exit: no error, nothing released twice.
    with c.lookup(ns, hs) as lease:
        c.release(lease)
    assert manager.stats()["live_leases"] == 0


def _strided_kv(blocks: int) -> tuple[np.ndarray, _native.PageLayout]:
    """Two layers; layer 0 dense per block, layer 1 [H=2, N=4, C=8] stored N-major
    with a gap, so its page is not one dense run."""
    h, n, cb = 2, 4, 8
    layer0 = BB // 2
    l1_stride = 2 * h * n * cb  # padded: half of each block's span is a gap
    region = blocks * layer0 + blocks * l1_stride
    assert layer0 + h * n * cb == BB // 2 + 64
    pages = [
        (0, layer0, (1, 1, layer0 // 64, 64), (layer0, layer0, 64, 1)),
        (blocks * layer0, l1_stride, (1, h, n, cb), (l1_stride, cb, 2 * h * cb, 1)),
    ]
    layout = _native.PageLayout(pages, blocks, region)
    kv = np.random.default_rng(9).integers(0, 256, region, dtype=np.uint8)
    return kv, layout


def test_page_gather_scatter_roundtrips_through_the_arena(manager) -> None:  # type: ignore[no-untyped-def]
    kv, layout = _strided_kv(6)
    bb = layout.block_bytes
    c = manager.client()
    ns = c.register_namespace(b"\x22" * 32, bb)
    hs = _hashes(5, 3)
    with c.begin_save(ns, hs) as pending:
        assert c.save_pages(pending, layout, kv, [4, 1, 5]) == 3 * bb
        c.commit_save(pending)
    dst = np.zeros_like(kv)
    with c.lookup(ns, hs) as lease:
        assert c.restore_pages(lease, layout, dst, [0, 2, 3]) == 3 * bb
    # Every restored block equals its source block page by page, and nothing else moved.
    staged = bytearray(3 * bb)
    with c.lookup(ns, hs) as lease:
        c.restore(lease, staged)
    expect = np.zeros_like(kv)
    for src_b, dst_b in ((4, 0), (1, 2), (5, 3)):
        for base, stride, shape, strides in (
            (0, BB // 2, (BB // 2,), (1,)),
            (6 * (BB // 2), 128, (2, 4, 8), (8, 32, 1)),
        ):
            view = np.lib.stride_tricks.as_strided(kv[base + src_b * stride :], shape=shape, strides=strides)
            out = np.lib.stride_tricks.as_strided(expect[base + dst_b * stride :], shape=shape, strides=strides)
            out[...] = view
    assert np.array_equal(dst, expect)
    # The cached bytes are the logical concatenation of the pages (the GPU oracle).
    first = kv[4 * (BB // 2) : 5 * (BB // 2)].tobytes()
    assert bytes(staged[: BB // 2]) == first


def test_page_copies_are_bounds_checked_on_both_sides(manager) -> None:  # type: ignore[no-untyped-def]
    kv, layout = _strided_kv(6)
    c = manager.client()
    ns = c.register_namespace(b"\x23" * 32, layout.block_bytes)
    hs = _hashes(6, 1)
    with pytest.raises(ValueError, match="past the"):
        _native.PageLayout([(0, 100, (1, 1, 1, 100), (100, 100, 100, 1))], 3, 299)
    with c.begin_save(ns, hs) as pending:
        with pytest.raises(ValueError, match=r"block id 6 outside \[0, 6\)"):
            c.save_pages(pending, layout, kv, [6])
        with pytest.raises(ValueError, match=r"expected 1, got 2"):
            c.save_pages(pending, layout, kv, [0, 1])
        with pytest.raises(ValueError, match=r"expected \d+, got \d+"):
            c.save_pages(pending, layout, kv[:-1], [0])  # region smaller than the layout
    # A destination inside the arena itself is refused (it would alias the source).
    addr, size = c.segment_address(c.segments()[0][0])
    in_arena = (ctypes.c_uint8 * layout.region_bytes).from_address(addr)
    c.save(ns, hs, bytes(layout.block_bytes))
    with c.lookup(ns, hs) as lease:
        with pytest.raises(ValueError, match="overlaps this client's arena"):
            c.restore_pages(lease, layout, in_arena, [0])
        with pytest.raises(ValueError, match="overlaps this client's arena"):
            c.restore(lease, (ctypes.c_uint8 * layout.block_bytes).from_address(addr + size - layout.block_bytes))


def test_page_copies_refused_after_close(manager) -> None:  # type: ignore[no-untyped-def]
    kv, layout = _strided_kv(2)
    c = manager.client()
    ns = c.register_namespace(b"\x24" * 32, layout.block_bytes)
    pending = c.begin_save(ns, _hashes(7, 1))
    c.close()
    with pytest.raises(_native.ManagerUnavailable):
        c.save_pages(pending, layout, kv, [0])
