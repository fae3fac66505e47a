"""SSD tier through real Manager processes: spill and stage byte-exact in both
I/O modes, restart recovery, corruption (bit flip, truncation) never served,
namespace and generation mismatches rejected, clear configuration errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from orbitkv_testing import eventually

from orbitkv import _native

pytestmark = pytest.mark.native
BB = 64 * 1024
FP = b"\x41" * 32


def hashes(tag: int, n: int) -> list[bytes]:
    return [bytes([tag]) + i.to_bytes(2, "little") + bytes(29) for i in range(n)]


def content(h: bytes) -> bytes:
    return h * (BB // 32)


def ssd_manager(
    factory,
    ssd: Path,
    *extra: str,
    dram: str = "4MiB",
    segment: str = "1MiB",  # type: ignore[no-untyped-def]
    policy: str = "eager",
):
    return factory(
        "--dram-size",
        dram,
        "--segment-size",
        segment,
        "--ssd-dir",
        str(ssd),
        "--ssd-capacity",
        "64MiB",
        "--ssd-admit-hits",
        "0",
        "--ssd-write-policy",
        policy,
        *extra,
    )


def fill_and_spill(m, c, ns, tag: int, n: int) -> list[bytes]:  # type: ignore[no-untyped-def]
    hs = hashes(tag, n)
    assert c.save(ns, hs, [content(h) for h in hs]).stored == n
    target = m.stats()["blocks_committed_total"]
    eventually(lambda: m.stats()["ssd_spilled_blocks_total"] >= target, "write-behind spilled every block")
    return hs


def connect(m):  # type: ignore[no-untyped-def]
    """A new client of `m` and the test namespace registered through it."""
    c = m.client()
    return c, c.register_namespace(FP, BB)


def sigkill(m) -> None:  # type: ignore[no-untyped-def]
    m.proc.send_signal(signal.SIGKILL)
    m.proc.wait()


def spill_then_restart(manager_factory, ssd: Path, tag: int, n: int):  # type: ignore[no-untyped-def]
    """Fill and spill `n` blocks into an SSD Manager on `ssd`, SIGKILL it and start a new
    one on the same SSD; returns the new Manager and the blocks' hashes."""
    m = ssd_manager(manager_factory, ssd)
    c, ns = connect(m)
    hs = fill_and_spill(m, c, ns, tag, n)
    c.close()
    sigkill(m)
    return ssd_manager(manager_factory, ssd), hs


def restore_checked(c, lease, hs: list[bytes], expect_bytes: int | None = None) -> None:  # type: ignore[no-untyped-def]
    """Restore all of `lease` (the blocks `hs`), release it, and check every block's bytes;
    with `expect_bytes`, also what `restore` reports having copied."""
    out = [bytearray(BB) for _ in hs]
    copied = c.restore(lease, out)
    if expect_bytes is not None:
        assert copied == expect_bytes
    c.release(lease)
    assert all(bytes(o) == content(h) for o, h in zip(out, hs, strict=True))


def restore_each(c, ns, hs: list[bytes]) -> tuple[int, int, int]:  # type: ignore[no-untyped-def]
    """Restore block by block; returns (exact, failed, missing). Never tolerates wrong bytes."""
    exact = failed = missing = 0
    for h in hs:
        lease = c.lookup(ns, [h])
        if lease.hit_blocks == 0:
            missing += 1
            continue
        buf = bytearray(BB)
        try:
            c.restore(lease, buf)
        except _native.RestoreFailed as e:
            assert "integrity" in str(e)
            failed += 1
            assert c.lookup(ns, [h]).hit_blocks == 0, "a corrupt block is a miss from then on"
            continue
        c.release(lease)
        assert bytes(buf) == content(h), "wrong bytes served"
        exact += 1
    return exact, failed, missing


@pytest.mark.parametrize("mode", ["direct", "kernel"])
def test_spill_evict_and_stage_back_byte_exact(manager_factory, tmp_path, mode) -> None:  # type: ignore[no-untyped-def]
    m = ssd_manager(manager_factory, tmp_path / "ssd", "--ssd-mode", mode)
    c, ns = connect(m)
    first = fill_and_spill(m, c, ns, 1, 32)
    fill_and_spill(m, c, ns, 2, 64)  # 6 MiB through a 4 MiB arena: the first blocks are demoted to SSD
    st = m.stats()
    assert st["ssd_only_blocks"] >= 32 - 4 and st["ssd"]["mode"] == mode
    lease = c.lookup(ns, first)
    assert lease.hit_blocks == 32, "SSD-only blocks stay visible"
    restore_checked(c, lease, first, expect_bytes=32 * BB)
    st = m.stats()
    assert st["ssd_staged_blocks_total"] >= 28 and st["ssd_checksum_failures_total"] == 0
    assert st["live_leases"] == 0 and st["dram_pinned_blocks"] == 0


def test_restart_recovers_and_serves_the_warm_cache(manager_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    m2, hs = spill_then_restart(manager_factory, tmp_path / "ssd", 3, 24)
    assert m2.stats()["ssd_dormant_blocks"] == 24
    c2, ns2 = connect(m2)
    assert restore_each(c2, ns2, hs) == (24, 0, 0)
    st = m2.stats()
    assert st["ssd_adopted_blocks_total"] == 24 and st["ssd_staged_blocks_total"] == 24


def test_lookup_reports_which_hit_blocks_come_from_ssd(manager_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`Lease.ssd_blocks`: indices of the hit blocks only the SSD tier held at lookup
    time, exactly those `acquire` stages back; DRAM hits are not listed."""
    m = ssd_manager(manager_factory, tmp_path / "ssd")
    c, ns = connect(m)
    first = fill_and_spill(m, c, ns, 5, 32)
    second = fill_and_spill(m, c, ns, 6, 64)  # 6 MiB through a 4 MiB arena: `first` is demoted
    assert m.stats()["ssd_only_blocks"] >= 28
    miss = c.lookup(ns, [hashes(7, 1)[0]])
    assert (miss.hit_blocks, miss.ssd_blocks) == (0, [])
    lease = c.lookup(ns, first)
    ssd = lease.ssd_blocks
    assert lease.hit_blocks == 32 and 28 <= len(ssd) <= 32
    assert ssd == sorted(set(ssd)) and all(0 <= i < 32 for i in ssd)
    staged = m.stats()["ssd_staged_blocks_total"]
    restore_checked(c, lease, first, expect_bytes=32 * BB)
    st = m.stats()
    assert st["ssd_staged_blocks_total"] - staged == len(ssd)
    assert st["ssd_hit_blocks_total"] == len(ssd), "the metric counts the same SSD hits"
    # Staged back into DRAM: the same blocks are DRAM hits now.
    again = c.lookup(ns, first)
    assert (again.hit_blocks, again.ssd_blocks) == (32, [])
    c.release(again)
    # A mixed prefix: DRAM blocks and SSD-only blocks of `second`, each reported at
    # its own index (staging `first` back demoted the oldest blocks of `second`).
    mixed = first[:2] + second
    lease = c.lookup(ns, mixed)
    assert lease.hit_blocks == len(mixed)
    assert 0 not in lease.ssd_blocks and 1 not in lease.ssd_blocks, "`first` is in DRAM now"
    assert m.stats()["ssd_only_blocks"] == len(lease.ssd_blocks)
    c.release(lease)


def test_restart_reports_every_recovered_hit_as_ssd(manager_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    m2, hs = spill_then_restart(manager_factory, tmp_path / "ssd", 8, 16)
    c2, ns2 = connect(m2)
    lease = c2.lookup(ns2, hs)
    assert (lease.hit_blocks, lease.ssd_blocks) == (16, list(range(16))), "after a restart only SSD holds them"
    restore_checked(c2, lease, hs)
    again = c2.lookup(ns2, hs)
    assert (again.hit_blocks, again.ssd_blocks) == (16, [])
    c2.release(again)


def _sigkill_mid_spill(manager_factory, ssd: Path) -> list[bytes]:  # type: ignore[no-untyped-def]
    """Save a lot, SIGKILL while write-behind is still going; return what was saved."""
    m = ssd_manager(manager_factory, ssd, dram="16MiB", segment="4MiB")
    c, ns = connect(m)
    hs = hashes(4, 200)
    for i in range(0, 200, 20):
        c.save(ns, hs[i : i + 20], [content(h) for h in hs[i : i + 20]])
    eventually(lambda: m.stats()["ssd_spilled_blocks_total"] >= 40, "some blocks spilled")
    sigkill(m)  # possibly mid-spill
    return hs


def test_sigkill_mid_spill_then_bit_flip_is_never_served(manager_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    ssd = tmp_path / "ssd"
    hs = _sigkill_mid_spill(manager_factory, ssd)
    data = ssd / "data.okv"
    with open(data, "r+b") as f:  # flip one payload bit of the first extent (after its 4 KiB header)
        f.seek(4096 + 1000)
        b = f.read(1)
        f.seek(4096 + 1000)
        f.write(bytes([b[0] ^ 0x10]))
    m = ssd_manager(manager_factory, ssd, dram="16MiB", segment="4MiB")
    c, ns = connect(m)
    exact, failed, missing = restore_each(c, ns, hs)
    assert failed == 1, (exact, failed, missing)
    assert exact >= 39 and exact + failed + missing == 200
    assert m.stats()["ssd_checksum_failures_total"] == 1


def test_sigkill_then_torn_header_is_dropped_by_the_background_check(manager_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Start-up trusts the journal; the header check after it drops a block whose header
    is torn, and the cache forgets it (a miss, never a failed or wrong read). A torn
    payload passes the header check and fails its own read: a miss from then on."""
    ssd = tmp_path / "ssd"
    hs = _sigkill_mid_spill(manager_factory, ssd)
    ext = 4096 + BB
    with open(ssd / "data.okv", "r+b") as f:
        f.seek(64)  # inside the first extent's header (key bytes)
        f.write(b"\xee" * 8)
        f.seek(ext + 4096 + BB - 512)  # the last 512 payload bytes of the second extent
        f.write(b"\xee" * 512)
    m = ssd_manager(manager_factory, ssd, dram="16MiB", segment="4MiB")

    def checked() -> bool:
        st = m.stats()
        return (
            st["ssd_header_check_blocks"] >= 40
            and st["ssd_header_checked_blocks"] == st["ssd_header_check_blocks"]
            and st["ssd_header_check_dropped_total"] == 1
            # the cache forgot it too: every dormant block still has its copy
            and st["ssd_dormant_blocks"] == st["ssd_blocks"]
        )

    eventually(checked, "the header check dropped the torn header and the cache forgot it")
    c, ns = connect(m)
    exact, failed, missing = restore_each(c, ns, hs)
    assert failed == 1, (exact, failed, missing)  # the torn payload, caught by its read
    assert exact >= 38 and exact + failed + missing == 200
    st = m.stats()
    assert st["ssd_checksum_failures_total"] == 1
    assert st["ssd_header_failures_total"] == 0, "the torn header was read: not forgotten by the cache"


def test_truncated_data_file_loses_only_the_cut_blocks(manager_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    ssd = tmp_path / "ssd"
    hs = _sigkill_mid_spill(manager_factory, ssd)
    data = ssd / "data.okv"
    os.truncate(data, 20 * (BB + 4096) + 1234)  # cut inside the 21st extent
    m = ssd_manager(manager_factory, ssd, dram="16MiB", segment="4MiB")
    c, ns = connect(m)
    exact, failed, missing = restore_each(c, ns, hs)
    assert exact <= 20 and exact + failed + missing == 200
    assert exact >= 1


def test_namespace_size_mismatch_and_reset_generation_are_rejected_after_restart(manager_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    ssd = tmp_path / "ssd"
    m = ssd_manager(manager_factory, ssd)
    c, ns = connect(m)
    other = c.register_namespace(b"\x42" * 32, BB)
    hs = fill_and_spill(m, c, ns, 5, 8)
    hs_other = hashes(6, 8)
    c.save(other, hs_other, [content(h) for h in hs_other])
    eventually(lambda: m.stats()["ssd_spilled_blocks_total"] >= 16, "spilled")
    assert c.reset_generation(ns) == 1  # persisted before the reply
    sigkill(m)
    m2 = ssd_manager(manager_factory, ssd)
    c2, ns2 = connect(m2)
    assert ns2.generation == 1, "the reset survives the restart"
    assert c2.lookup(ns2, hs).hit_blocks == 0, "blocks of the reset generation are never served"
    # Same fingerprint as `other` but a different block size: nothing adopted.
    wrong = c2.register_namespace(b"\x42" * 32, 2 * BB)
    assert c2.lookup(wrong, hs_other).hit_blocks == 0
    assert m2.stats()["ssd_rejected_blocks_total"] >= 8


def test_concurrent_resets_persist_the_last_generation(manager_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Resets from several sessions at once: the file is written in bump order (the
    cache lock is not held across its fsync), so after a SIGKILL the Manager comes
    back at the last generation any reply reported, never an earlier one."""
    import threading

    ssd = tmp_path / "ssd"
    m = ssd_manager(manager_factory, ssd)
    seen: list[int] = []
    errors: list[BaseException] = []

    def resets() -> None:
        try:
            c = m.client()
            ns = c.register_namespace(FP, BB)
            for _ in range(10):
                seen.append(c.reset_generation(ns))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=resets) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sorted(seen) == list(range(1, 41)), "each reset got its own generation"
    sigkill(m)
    m2 = ssd_manager(manager_factory, ssd)
    assert m2.client().register_namespace(FP, BB).generation == 40


def serve(tmp_path: Path, *args: str, **kw) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    """Run `python -m orbitkv serve` on a socket in `tmp_path` with `args`, capturing its output."""
    cmd = [sys.executable, "-m", "orbitkv", "serve", "--socket", str(tmp_path / "s.sock"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def test_tmpfs_with_direct_mode_is_a_clear_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm tmpfs on this machine")
    d = Path("/dev/shm") / f"orbitkv-test-{os.getpid()}"
    r = serve(
        tmp_path,
        "--dram-size",
        "4MiB",
        "--ssd-dir",
        str(d),
        "--ssd-capacity",
        "16MiB",
        "--metrics-addr",
        "off",
        timeout=60,
    )
    assert r.returncode == 1
    assert str(d) in r.stderr and "kernel" in r.stderr, r.stderr
    r = serve(tmp_path, "--ssd-dir", str(tmp_path), "--ssd-mode", "sideways")
    assert r.returncode == 2 and "direct or kernel" in r.stderr


def test_concurrent_restores_of_the_same_ssd_blocks(manager_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import threading

    m = ssd_manager(manager_factory, tmp_path / "ssd")
    c, ns = connect(m)
    first = fill_and_spill(m, c, ns, 7, 16)  # 3 readers x 1 MiB staged fit the 4 MiB arena
    fill_and_spill(m, c, ns, 8, 64)  # demote the first set
    assert m.stats()["ssd_only_blocks"] >= 12
    errors: list[str] = []

    def reader() -> None:
        cl = m.client()
        nsl = cl.register_namespace(FP, BB)
        for _ in range(3):
            lease = cl.lookup(nsl, first)
            out = bytearray(lease.hit_blocks * BB)
            cl.restore(lease, out)
            cl.release(lease)
            for i in range(lease.hit_blocks):
                if bytes(out[i * BB : (i + 1) * BB]) != content(first[i]):
                    errors.append(f"block {i} differs")
        cl.close()

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    st = m.stats()
    assert st["live_leases"] == 0 and st["ssd_stage_failures_total"] == 0 and st["ssd_staged_blocks_total"] >= 12


def test_evict_policy_demotes_instead_of_dropping(manager_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    m = ssd_manager(manager_factory, tmp_path / "ssd", policy="evict")
    c, ns = connect(m)
    assert m.stats()["ssd"]["write_policy"] == "evict"
    first = hashes(9, 32)
    c.save(ns, first, [content(h) for h in first])  # 2 MiB of a 4 MiB arena: no pressure
    assert m.stats()["ssd_spilled_blocks_total"] == 0, "nothing is written while DRAM has room"
    # Push 8 MiB more through, in small steps so the worker keeps ahead of eviction.
    for i in range(16):
        more = hashes(10 + i, 8)
        c.save(ns, more, [content(h) for h in more])
        time.sleep(0.05)  # the worker spills every 10 ms when below the low-water mark
    st = m.stats()
    assert st["ssd_spilled_blocks_total"] > 0 and st["ssd_demotions_total"] > 0
    exact, failed, missing = restore_each(c, ns, first)
    assert failed == 0 and exact > 0, (exact, failed, missing)
