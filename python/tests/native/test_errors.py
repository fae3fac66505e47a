"""Clear errors for bad input; faults and resets through the native client."""

from __future__ import annotations

import time

import pytest

from orbitkv import _native

pytestmark = pytest.mark.native
BB = 4096
FP = b"\x0e" * 32


def test_bad_arguments_are_value_errors(manager) -> None:  # type: ignore[no-untyped-def]
    c = manager.client()
    with pytest.raises(ValueError, match="fingerprint must be exactly 32 bytes"):
        c.register_namespace(b"short", BB)
    with pytest.raises(ValueError, match="block_bytes must be between"):
        c.register_namespace(b"\x01" * 32, 0)
    ns = c.register_namespace(b"\x01" * 32, BB)
    with pytest.raises(ValueError, match="already registered with block_bytes=4096"):
        c.register_namespace(b"\x01" * 32, 8192)
    with pytest.raises(ValueError, match="block hash must be exactly 32 bytes"):
        c.lookup(ns, [b"\x00" * 31])
    with pytest.raises(ValueError, match=r"expected 4096 bytes .* got 100"):
        c.save(ns, [b"\x02" * 32], b"x" * 100)
    with pytest.raises(ValueError, match=r"buffer 0 size mismatch: expected 4096 bytes .* got 100"):
        c.save(ns, [b"\x02" * 32], [b"x" * 100])
    c.save(ns, [b"\x02" * 32, b"\x03" * 32], bytes(2 * BB))
    lease = c.lookup(ns, [b"\x02" * 32, b"\x03" * 32])
    with pytest.raises(TypeError, match="read-only"):
        c.restore(lease, bytes(2 * BB))
    shared = bytearray(BB)
    with pytest.raises(ValueError, match="overlap"):
        c.restore(lease, [shared, shared])
    other = manager.client()
    with pytest.raises(ValueError, match="another client"):
        other.release(lease)
    c.release(lease)


def test_manager_unavailable_and_bad_token(tmp_path, manager_factory) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(_native.ManagerUnavailable, match="is `orbitkv serve` running"):
        _native.Client(str(tmp_path / "nothing.sock"))
    tok = tmp_path / "tok"
    tok.write_text("a-very-secret-token-0123\n")
    tok.chmod(0o600)  # the Manager refuses a token file others may read
    m = manager_factory("--token-file", str(tok))
    with pytest.raises(_native.AuthError, match="wrong or missing token"):
        _native.Client(m.socket)
    with _native.Client(m.socket, token="a-very-secret-token-0123") as c:
        assert c.stats()["auth_refused_total"] == 1


def test_reset_generation_busy_then_cold_then_reuse(manager) -> None:  # type: ignore[no-untyped-def]
    c = manager.client()
    ns = c.register_namespace(b"\x07" * 32, BB)
    hs = [b"\x11" * 32]
    c.save(ns, hs, b"\x05" * BB)
    lease = c.lookup(ns, hs)
    with pytest.raises(_native.Busy, match="1 lease"):
        c.reset_generation(ns)
    c.release(lease)
    assert c.reset_generation(ns) == 1
    assert c.lookup(ns, hs).hit_blocks == 0
    c.save(ns, hs, b"\x06" * BB)
    lease = c.lookup(ns, hs)
    buf = bytearray(BB)
    c.restore(lease, buf)
    assert bytes(buf) == b"\x06" * BB


def test_injected_restore_failure(manager) -> None:  # type: ignore[no-untyped-def]
    c = manager.client()
    ns = c.register_namespace(b"\x08" * 32, BB)
    hs = [b"\x12" * 32]
    c.save(ns, hs, b"\x05" * BB)
    c.inject_faults(restore_failures=1)
    lease = c.lookup(ns, hs)
    with pytest.raises(_native.RestoreFailed, match="injected fault"):
        c.restore(lease, bytearray(BB))
    assert lease.released, "the Manager retired the lease with the failure"
    assert manager.stats()["live_leases"] == 0
    lease = c.lookup(ns, hs)
    assert c.restore(lease, bytearray(BB)) == BB


def test_injected_commit_failure_aborts_the_save(manager) -> None:  # type: ignore[no-untyped-def]
    c = manager.client()
    ns = c.register_namespace(b"\x09" * 32, BB)
    hs = [b"\x13" * 32, b"\x14" * 32]
    c.inject_faults(commit_failures=1)
    with pytest.raises(_native.SaveFailed, match="nothing became visible"):
        c.save(ns, hs, bytes(2 * BB))
    assert c.lookup(ns, hs).hit_blocks == 0
    st = manager.stats()
    assert st["dram_pending_save_bytes"] == 0 and st["blocks_aborted_total"] == 2
    assert c.save(ns, hs, bytes(2 * BB)).stored == 2, "the next save goes through"


def test_release_without_waiting(manager) -> None:  # type: ignore[no-untyped-def]
    """`release(lease, wait=False)` sends one message and reads no reply: the
    client's next request sees it released; repeats are no-ops; a lease the
    Manager no longer knows is counted there, never raised into later calls."""
    c = manager.client()
    ns = c.register_namespace(FP, BB)
    hs = [bytes([i]) * 32 for i in range(3)]
    c.save(ns, hs, [bytes([i]) * BB for i in range(3)])
    leases = [c.lookup(ns, hs) for _ in range(2)]
    assert c.stats()["live_leases"] == 2
    c.release(leases[0], wait=False)
    assert leases[0].released
    c.release(leases[0], wait=False)  # a no-op: nothing sent
    c.release(leases[0])
    st = c.stats()
    assert (st["live_leases"], st["quiet_releases_total"], st["quiet_release_failures_total"]) == (1, 1, 0)
    with pytest.raises(ValueError):
        manager.client().release(leases[1], wait=False)  # another client's lease: refused before sending
    c.close()  # the Manager released leases[1] with the session
    d = manager.client()
    ns = d.register_namespace(FP, BB)
    with d.lookup(ns, hs) as lease:
        assert lease.hit_blocks == 3
    assert d.stats()["live_leases"] == 0


def test_release_delay_setting(manager, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`ORBITKV_RELEASE_DELAY_US` (0-100000) bounds how long `release_later`
    waits for a request to carry the release: another session sees the lease
    held until then, and released after it; 0 sends at once; a bad value is
    refused at connect, naming it. Another client's lease is refused before
    anything is queued, and a repeat is a no-op."""
    monkeypatch.setenv("ORBITKV_RELEASE_DELAY_US", "100001")
    with pytest.raises(ValueError, match="ORBITKV_RELEASE_DELAY_US"):
        manager.client()
    monkeypatch.setenv("ORBITKV_RELEASE_DELAY_US", "0")
    watcher = manager.client()
    hs = [bytes([8, i]) * 16 for i in range(2)]
    for delay_us in (100_000, 0):
        monkeypatch.setenv("ORBITKV_RELEASE_DELAY_US", str(delay_us))
        c = manager.client()
        ns = c.register_namespace(FP, BB)
        c.save(ns, hs, [bytes(BB)] * 2)
        other = c.lookup(ns, hs)
        with pytest.raises(ValueError):
            watcher.release_later(other)  # another client's lease: refused, nothing queued
        c.release(other)
        lease = c.lookup(ns, hs)
        t0 = time.monotonic()
        c.release_later(lease)
        assert lease.released
        c.release_later(lease)  # a no-op
        if delay_us:
            # Nothing else sent on `c`: held until the flusher sends it.
            assert watcher.stats()["live_leases"] == 1
        while watcher.stats()["live_leases"] != 0:
            assert time.monotonic() - t0 < 5, "the release never arrived"
            time.sleep(0.001)
        if delay_us:
            assert time.monotonic() - t0 >= delay_us / 1e6 * 0.9
        c.close()


def test_client_spin_setting(manager, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`ORBITKV_CLIENT_SPIN_US` (0-1000) makes calls poll for their reply before
    sleeping: the same answers; a bad value is refused at connect, naming it."""
    monkeypatch.setenv("ORBITKV_CLIENT_SPIN_US", "1001")
    with pytest.raises(ValueError, match="ORBITKV_CLIENT_SPIN_US"):
        manager.client()
    monkeypatch.setenv("ORBITKV_CLIENT_SPIN_US", "200")
    c = manager.client()
    ns = c.register_namespace(FP, BB)
    hs = [bytes([9, i]) * 16 for i in range(4)]
    data = [bytes([i + 1]) * BB for i in range(4)]
    assert c.save(ns, hs, data).stored == 4
    for _ in range(50):
        lease = c.lookup(ns, hs)
        out = bytearray(4 * BB)
        assert c.restore(lease, out) == 4 * BB and bytes(out) == b"".join(data)
        c.release(lease, wait=False)
    assert c.stats()["live_leases"] == 0
