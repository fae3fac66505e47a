"""Killed and vanished clients: nothing partial becomes visible, and no slot a
live process may still touch is reused."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import time

import pytest
from orbitkv_testing import eventually, spawn_client

from orbitkv import _native

pytestmark = pytest.mark.native
BB = 64 * 1024
FP = b"\x21" * 32


def spawn_in_namespace(code: str, socket: str, *, vanish: bool = False) -> subprocess.Popen[str]:
    """`spawn_client` of `code` run after the child connected (`c`) and registered the
    namespace FP (`ns`); `os`, `sys` and `time` imported."""
    prologue = f"""
        import os, sys, time
        from orbitkv import _native
        c = _native.Client(sys.argv[1])
        ns = c.register_namespace({FP!r}, {BB})
    """
    return spawn_client(textwrap.dedent(prologue) + textwrap.dedent(code), socket, vanish=vanish)


def content(hs: list[bytes]) -> bytes:
    """The bytes saved for blocks `hs`: each block its hash, repeated."""
    return b"".join(h * (BB // 32) for h in hs)


def client_with_blocks(manager, first: int, n: int):  # type: ignore[no-untyped-def]
    """A client of `manager`, its namespace FP and the hashes of the `n` blocks, tagged
    `first` on, that it saved there (`content`)."""
    c = manager.client()
    ns = c.register_namespace(FP, BB)
    hs = [bytes([first + i]) * 32 for i in range(n)]
    c.save(ns, hs, content(hs))
    return c, ns, hs


def spawn_acquirer(manager, hs: list[bytes], then: str = "", *, vanish: bool = False) -> subprocess.Popen[str]:  # type: ignore[no-untyped-def]
    """A child client that looked blocks `hs` up and acquired them (copies may now be in
    flight), then ran `then`."""
    code = f"""
        lease = c.lookup(ns, {hs!r})
        slots = c.acquire(lease)
        {then}
    """
    return spawn_in_namespace(code, manager.socket, vanish=vanish)


def kill(child: subprocess.Popen[str]) -> None:
    """SIGKILL a spawned client and reap it."""
    child.send_signal(signal.SIGKILL)
    child.wait()


def test_sigkill_mid_save_leaves_nothing_visible_and_frees_slots(manager) -> None:  # type: ignore[no-untyped-def]
    child = spawn_in_namespace(
        """
        p = c.begin_save(ns, [bytes([i]) * 32 for i in range(1, 9)])
        assert p.statuses == ["allocated"] * 8
        """,
        manager.socket,
    )
    assert manager.stats()["dram_pending_save_bytes"] == 8 * BB
    kill(child)
    c = manager.client()
    ns = c.register_namespace(FP, BB)
    assert c.lookup(ns, [bytes([i]) * 32 for i in range(1, 9)]).hit_blocks == 0
    eventually(lambda: manager.stats()["dram_pending_save_bytes"] == 0, "slots reclaimed after the process is gone")
    st = manager.stats()
    assert st["blocks_aborted_total"] == 8 and st["blocks_committed_total"] == 0


def test_dropped_connection_of_a_live_process_keeps_its_holds(manager) -> None:  # type: ignore[no-untyped-def]
    c, ns, hs = client_with_blocks(manager, 40, 4)
    # the child also begins a save; then its connection vanishes while the process lives on
    child = spawn_acquirer(manager, hs, 'p = c.begin_save(ns, [b"\\x77" * 32])', vanish=True)
    eventually(lambda: manager.stats()["quarantined_sessions"] == 1, "session quarantined")
    time.sleep(0.5)
    st = manager.stats()
    assert st["quarantined_sessions"] == 1, "held while the process lives"
    assert st["dram_pinned_blocks"] == 4
    assert st["quarantined_bytes"] == BB
    # Fill the arena several times over: the quarantined blocks must survive.
    for r in range(4):
        more = [bytes([100 + r]) + i.to_bytes(2, "little") + b"\x00" * 29 for i in range(256)]
        c.save(ns, more, bytes(len(more) * BB))
    lease = c.lookup(ns, hs)
    assert lease.hit_blocks == 4
    buf = bytearray(4 * BB)
    c.restore(lease, buf)
    c.release(lease)
    assert bytes(buf) == content(hs)
    kill(child)
    eventually(lambda: manager.stats()["quarantined_sessions"] == 0, "released once the process is gone")
    st = manager.stats()
    assert st["dram_pinned_blocks"] == 0 and st["dram_pending_save_bytes"] == 0


def test_sigkill_mid_restore_keeps_blocks_pinned_until_the_process_is_gone(manager) -> None:  # type: ignore[no-untyped-def]
    _c, _ns, hs = client_with_blocks(manager, 60, 2)
    child = spawn_acquirer(manager, hs)
    os.kill(child.pid, signal.SIGSTOP)  # frozen mid-copy: alive, connected
    time.sleep(0.3)
    assert manager.stats()["dram_pinned_blocks"] == 2
    kill(child)
    eventually(lambda: manager.stats()["dram_pinned_blocks"] == 0, "pins released after exit")
    assert manager.stats()["live_leases"] == 0
    with _native.Client(manager.socket) as again:
        assert again.lookup(again.register_namespace(FP, BB), hs).hit_blocks == 2
