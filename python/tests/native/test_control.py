"""Control-only clients (`map_arena=False`): lookups and leases, no arena in the
process, every copy or address hand-out refused, and leases released the moment
the connection drops."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from orbitkv_testing import eventually, spawn_client

pytestmark = pytest.mark.native
BB = 64 * 1024
FP = b"\x33" * 32


def arena_mappings_of_a_fresh_process(socket: str, map_arena: bool) -> list[str]:
    """Lines of /proc/self/maps naming the Manager's arena, in a process that only
    connected (so no other client of this test process can be counted)."""
    code = f"""
        import sys
        from orbitkv import _native
        c = _native.Client(sys.argv[1], map_arena={map_arena!r})
        assert c.control_only is {not map_arena!r}
        with open("/proc/self/maps") as f:
            print("\\n".join(line.strip() for line in f if "orbitkv-arena" in line))
        c.close()
        """
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), socket], capture_output=True, text=True, check=True
    )
    return [line for line in out.stdout.splitlines() if line]


def test_control_only_process_maps_no_arena(manager) -> None:  # type: ignore[no-untyped-def]
    assert len(arena_mappings_of_a_fresh_process(manager.socket, map_arena=True)) == 4  # 64 MiB / 16 MiB
    assert arena_mappings_of_a_fresh_process(manager.socket, map_arena=False) == []


def test_control_only_client_runs_the_protocol_and_refuses_copies(manager) -> None:  # type: ignore[no-untyped-def]
    hs = [bytes([i]) * 32 for i in range(1, 5)]
    data = [bytes([i]) * BB for i in range(1, 5)]
    with manager.client() as mapped, manager.client(map_arena=False) as control:
        assert not mapped.control_only and control.control_only
        assert control.segments() == mapped.segments()
        ns_m = mapped.register_namespace(FP, BB)
        ns_c = control.register_namespace(FP, BB)
        mapped.save(ns_m, hs[:2], data[:2])

        # Lookups and leases work: a scheduler sees hits and releases them.
        lease = control.lookup(ns_c, hs)
        assert lease.hit_blocks == 2
        # The Manager hands a control-only session no arena address.
        with pytest.raises(ValueError, match="control-only"):
            control.acquire(lease)
        with pytest.raises(ValueError, match="control-only"):
            control.begin_save(ns_c, hs[2:])
        control.release(lease)
        assert manager.stats()["live_leases"] == 0

        # Copies are refused up front, and leave nothing behind.
        with pytest.raises(ValueError, match="control-only"):
            control.save(ns_c, hs[2:], data[2:])
        lease = control.lookup(ns_c, hs[:2])
        with pytest.raises(ValueError, match="control-only"):
            control.restore(lease, bytearray(2 * BB))
        control.release(lease)  # refused before acquire: a plain release retires it
        with pytest.raises(ValueError, match="control-only"):
            control.segment_address(control.segments()[0][0])
        st = manager.stats()
        assert st["dram_pending_save_bytes"] == 0 and st["live_leases"] == 0
        assert mapped.lookup(ns_m, hs).hit_blocks == 2, "the refused save made nothing visible"


def test_control_only_leases_are_released_when_the_connection_drops(manager) -> None:  # type: ignore[no-untyped-def]
    hs = [bytes([9]) * 32]
    with manager.client() as mapped:
        mapped.save(mapped.register_namespace(FP, BB), hs, bytes(BB))
    child = spawn_client(
        f"""
        import sys
        from orbitkv import _native
        c = _native.Client(sys.argv[1], map_arena=False)
        lease = c.lookup(c.register_namespace({FP!r}, {BB}), {hs!r})
        assert lease.hit_blocks == 1
        """,
        manager.socket,
        vanish=True,  # the connection vanishes; the process lives on
    )
    try:
        # `sessions` counts the stats call's own session.
        eventually(lambda: manager.stats()["sessions"] == 1, "the control session ended")
        st = manager.stats()
        assert child.poll() is None, "the process is still alive"
        assert st["live_leases"] == 0 and st["dram_pinned_blocks"] == 0
        assert st["quarantined_sessions"] == 0, "no address was handed out: nothing to quarantine"
    finally:
        child.kill()
        child.wait()
