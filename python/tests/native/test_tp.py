"""The Python TP lease API (contract T1) against a real Manager with
`--enable-query-control`: `lookup_tp` from a control-only client, each rank's
`redeem_tp` giving an ordinary `Lease` of its own client, `release_tp`."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.native
BB = 4096
FP = b"\x44" * 32


def test_tp_lease_round_trip(manager_factory) -> None:  # type: ignore[no-untyped-def]
    from orbitkv import _native

    m = manager_factory("--enable-query-control")
    hashes = [bytes([i]) * 32 for i in range(4)]
    ranks = []
    for r, n in enumerate([4, 3]):
        c = m.client()
        ns = c.register_namespace(FP, BB, shard=r)
        blocks = [bytes([r * 16 + i]) * BB for i in range(n)]
        c.save(ns, hashes[:n], blocks)
        ranks.append((c, ns, blocks))
    sched = m.client(map_arena=False)
    shards = [sched.register_namespace(FP, BB, shard=r) for r in range(2)]
    tp = sched.lookup_tp(shards, hashes)
    assert isinstance(tp, _native.TpLease) and tp.hit_blocks == 3 and len(tp.token) == 16
    assert tp.token.hex() not in repr(tp)  # a capability is never printed
    for c, ns, blocks in ranks:
        with c.redeem_tp(tp.token, ns) as lease:
            assert lease.hit_blocks == 3 and lease.session == c.session_id
            out = [bytearray(BB) for _ in range(3)]
            c.restore(lease, out)
            assert [bytes(b) for b in out] == blocks[:3]
            with pytest.raises(ValueError, match="redeemed already"):
                c.redeem_tp(tp.token, ns)  # once per shard
    assert m.stats()["live_tp_leases"] == 0  # every rank reported: it ended
    with pytest.raises(_native.OrbitKVError, match="not_found"):
        ranks[0][0].redeem_tp(tp.token, ranks[0][1])
    assert sched.release_tp(tp) is False  # nothing left to end, no error
    with pytest.raises(ValueError, match="16 bytes"):
        ranks[0][0].redeem_tp(b"short", ranks[0][1])
    miss = sched.lookup_tp(shards, [b"\x77" * 32])
    assert (miss.hit_blocks, miss.token, miss.released) == (0, bytes(16), True)


def test_tp_lookup_needs_query_control(manager_factory) -> None:  # type: ignore[no-untyped-def]
    m = manager_factory()
    sched = m.client(map_arena=False)
    shards = [sched.register_namespace(FP, BB, shard=r) for r in range(2)]
    with pytest.raises(ValueError, match="--enable-query-control"):
        sched.lookup_tp(shards, [b"\x01" * 32])
