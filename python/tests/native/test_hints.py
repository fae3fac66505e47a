"""Retention hints against a real Manager: a kept chain outlives a flood that evicts the
same chain unhinted, byte-exact; a keep on blocks saved later applies when they commit;
its deadline ends it; done blocks leave first; the cap refuses another namespace's keep
without touching the first's; bad hints and a Manager with hints off are refused with
their reason; the counters reach `/metrics` names and `orbitkv status`."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

pytestmark = pytest.mark.native
_native = pytest.importorskip("orbitkv._native")

FP = b"h" * 32
BLOCK = 64 << 10


def chain(tag: int, n: int) -> list[bytes]:
    return [bytes([tag, i]) + bytes(30) for i in range(n)]


def restore(c: Any, ns: Any, hs: list[bytes]) -> bytes | None:
    """The blocks' bytes if every one is a hit."""
    with c.lookup(ns, hs) as lease:
        if lease.hit_blocks < len(hs):
            return None
        out = bytearray(len(hs) * BLOCK)
        c.restore(lease, out)
        return bytes(out)


def save_two_chains(c: Any, ns: Any, first: int, second: int, n: int) -> tuple[list[bytes], list[bytes], bytes]:
    """Chains tagged `first` then `second`, `n` blocks each, saved in that order; the first one's bytes."""
    a, b = chain(first, n), chain(second, n)
    data = os.urandom(n * BLOCK)
    c.save(ns, a, data)
    c.save(ns, b, os.urandom(n * BLOCK))
    return a, b, data


def flood(c: Any, ns: Any, blocks: int, tag: int = 200) -> None:
    """Save `blocks` new blocks, 8 per chain."""
    for i in range(blocks // 8):
        c.save(ns, [bytes([tag, i, j]) + bytes(29) for j in range(8)], os.urandom(8 * BLOCK))


def test_a_kept_chain_outlives_a_flood_byte_exact_and_its_deadline_ends_it(manager_factory: Any) -> None:
    # 32 blocks of DRAM; hints may keep 80 % of it (the default share). LRU: once the keep
    # has expired the chain is an ordinary block for a flood (`duel`'s S3-FIFO would keep
    # it as a block referenced again, which is what the expiry tells the policy).
    m = manager_factory("--dram-size", "2MiB", "--segment-size", "2MiB", "--cache-policy", "lru")
    with m.client() as c:
        ns = c.register_namespace(FP, BLOCK)
        kept, plain, data = save_two_chains(c, ns, 1, 2, 4)
        assert c.retain(ns, kept, keep_for_s=2.0) == (4, 0, 0)
        flood(c, ns, 96)
        assert restore(c, ns, kept) == data
        assert restore(c, ns, plain) is None
        st = c.stats()
        assert st["hint_kept_blocks"] == 4 and st["hint_kept_bytes"] == 4 * BLOCK
        assert st["hint_cap_bytes"] == int(0.8 * 32 * BLOCK) and st["hint_requests_total"] == 1

        # The deadline passes (the Manager's reaper releases it within 50 ms): a flood takes it.
        time.sleep(2.3)
        assert c.stats()["hint_expired_blocks_total"] == 4
        flood(c, ns, 96, tag=100)
        assert restore(c, ns, kept) is None


def test_a_keep_on_blocks_saved_later_applies_when_they_commit(manager: Any) -> None:
    with manager.client() as c:
        ns = c.register_namespace(FP, BLOCK)
        hs = chain(3, 4)
        assert c.retain(ns, hs, keep_for_s=60) == (0, 4, 0)
        assert c.stats()["hint_pending_blocks"] == 4
        c.save(ns, hs, os.urandom(4 * BLOCK))
        st = c.stats()
        assert st["hint_pending_blocks"] == 0 and st["hint_pending_applied_total"] == 4
        assert st["hint_kept_blocks"] == 4


def test_done_blocks_leave_before_older_unhinted_ones(manager_factory: Any) -> None:
    m = manager_factory("--dram-size", "1MiB", "--segment-size", "1MiB", "--cache-policy", "lru")
    with m.client() as c:
        ns = c.register_namespace(FP, BLOCK)
        old, new, old_data = save_two_chains(c, ns, 4, 5, 6)
        assert c.retain(ns, new, done=True) == (6, 0, 0)
        c.save(ns, chain(6, 6), os.urandom(6 * BLOCK))  # 18 of 16 blocks: two must go
        assert restore(c, ns, old) == old_data
        with c.lookup(ns, new) as lease:
            assert lease.hit_blocks == 4, "the done chain's two deepest blocks leave first"
        assert c.stats()["hint_done_evicted_total"] == 2


def test_the_cap_refuses_another_namespace_and_never_takes_the_first_ones_blocks(manager_factory: Any) -> None:
    m = manager_factory("--dram-size", "2MiB", "--segment-size", "2MiB", "--retain-share", "0.125")
    with m.client() as c:
        a = c.register_namespace(FP, BLOCK, salt=b"tenant-a")
        b = c.register_namespace(FP, BLOCK, salt=b"tenant-b")
        ha, hb = chain(7, 4), chain(8, 4)
        c.save(a, ha, os.urandom(4 * BLOCK))
        c.save(b, hb, os.urandom(4 * BLOCK))
        assert c.retain(a, ha, keep_for_s=600) == (4, 0, 0)  # the cap: 4 blocks
        assert c.retain(b, hb, keep_for_s=1) == (0, 0, 4)
        assert c.stats()["hint_kept_blocks"] == 4
        assert c.stats()["hint_refused_blocks_total"] == 4


def test_bad_hints_are_refused_with_their_reason(manager_factory: Any) -> None:
    m = manager_factory()
    with m.client() as c:
        ns = c.register_namespace(FP, BLOCK)
        hs = chain(9, 2)
        for kwargs in ({}, {"keep_for_s": 5, "done": True}, {"done": True, "clear": True}):
            with pytest.raises(ValueError, match="exactly one of"):
                c.retain(ns, hs, **kwargs)
        for bad in (0.0, -1.0, 86_401.0, float("nan")):
            with pytest.raises(ValueError, match="24 hours"):
                c.retain(ns, hs, keep_for_s=bad)
        with pytest.raises(ValueError, match="32 bytes"):
            c.retain(ns, [b"short"], done=True)
    off = manager_factory("--retain-share", "0")
    with off.client() as c:
        ns = c.register_namespace(FP, BLOCK)
        with pytest.raises(ValueError, match="retain-share"):
            c.retain(ns, chain(9, 2), keep_for_s=5)
        assert c.stats()["hint_cap_bytes"] == 0
