//! Retention hints: what keep, done and clear do to eviction, deadlines,
//! hints on blocks not committed yet, the cap and who may displace whom, and
//! the refusals.

use orbitkv_core::policy::PolicyKind;
use orbitkv_core::{BlockHash, CacheError, CacheState, Fingerprint, NamespaceKey, NsId, Retain, SessionId};

const B: u64 = 4096;

fn h(i: u32) -> BlockHash {
    let mut x = [0u8; 32];
    x[..4].copy_from_slice(&i.to_le_bytes());
    x
}

fn chain(from: u32, n: u32) -> Vec<BlockHash> {
    (from..from + n).map(h).collect()
}

/// A cache of `blocks` DRAM blocks, one session, namespaces `salts`.
fn cache(
    kind: PolicyKind,
    blocks: u64,
    keep_blocks: u64,
    salts: &[u8],
) -> (CacheState, SessionId, Vec<NsId>) {
    let mut c = CacheState::with_policy_seed(&[blocks * B], kind, Some(1));
    c.set_retention_cap(keep_blocks * B);
    let s = c.open_session();
    let nss = salts
        .iter()
        .map(|salt| {
            let key = NamespaceKey {
                fingerprint: Fingerprint([9; 32]),
                shard: 0,
                salt: [*salt; 32],
            };
            c.register_namespace(key, B).expect("ns").0
        })
        .collect();
    (c, s, nss)
}

/// [`cache`] with one namespace (salt 0).
fn cache_one(kind: PolicyKind, blocks: u64, keep_blocks: u64) -> (CacheState, SessionId, NsId) {
    let (c, s, nss) = cache(kind, blocks, keep_blocks, &[0]);
    (c, s, nss[0])
}

fn save(c: &mut CacheState, s: SessionId, ns: NsId, hs: &[BlockHash]) {
    let (id, _) = c.begin_save(s, ns, hs).expect("begin");
    c.commit_save(s, id).expect("commit");
    c.check_invariants().expect("invariants");
}

fn visible(c: &CacheState, ns: NsId, hs: &[BlockHash]) -> usize {
    hs.iter().filter(|x| c.is_visible(ns, x)).count()
}

/// Save 4-block chains from `from` on until `blocks` blocks were written.
fn flood(c: &mut CacheState, s: SessionId, ns: NsId, from: u32, blocks: u32) {
    for i in (0..blocks).step_by(4) {
        save(c, s, ns, &chain(from + i, 4));
    }
}

#[test]
fn a_kept_chain_outlives_a_flood_that_evicts_the_same_chain_unhinted() {
    for kind in PolicyKind::ALL {
        let (mut c, s, ns) = cache_one(kind, 16, 8);
        let (kept, plain) = (chain(1000, 4), chain(2000, 4));
        save(&mut c, s, ns, &kept);
        save(&mut c, s, ns, &plain);
        let out = c
            .retain(s, ns, &kept, Retain::Keep { ttl_ms: 1_000 }, 0)
            .expect("retain");
        assert_eq!((out.applied, out.pending, out.refused), (4, 0, 0), "{kind}");
        flood(&mut c, s, ns, 0, 64);
        assert_eq!(visible(&c, ns, &kept), 4, "{kind}: the kept chain left");
        assert_eq!(visible(&c, ns, &plain), 0, "{kind}: the unhinted chain stayed");
        let st = c.hint_stats().retention;
        assert_eq!(
            (st.kept_blocks, st.kept_bytes, st.kept_total),
            (4, 4 * B, 4),
            "{kind}"
        );

        // Its deadline passes: it is an ordinary block again (the policy's own
        // rules decide: a frequency-aware one remembers it was expected back).
        assert!(!c.hint_expiry_due(999));
        assert!(c.hint_expiry_due(1_000));
        assert_eq!(c.expire_hints(1_000), 4);
        c.check_invariants().expect("invariants");
        let st = c.hint_stats().retention;
        assert_eq!(
            (st.kept_blocks, st.kept_bytes, st.expired_total),
            (0, 0, 4),
            "{kind}"
        );
        assert!(!c.hint_expiry_due(u64::MAX));
    }
}

#[test]
fn an_expired_keep_protects_nothing() {
    let (mut c, s, ns) = cache_one(PolicyKind::Lru, 16, 8);
    let kept = chain(1000, 4);
    save(&mut c, s, ns, &kept);
    c.retain(s, ns, &kept, Retain::Keep { ttl_ms: 1_000 }, 0)
        .expect("retain");
    flood(&mut c, s, ns, 0, 64);
    assert_eq!(visible(&c, ns, &kept), 4);
    c.expire_hints(1_000);
    flood(&mut c, s, ns, 0x10000, 64);
    assert_eq!(visible(&c, ns, &kept), 0, "an expired keep still protects");
}

#[test]
fn done_blocks_leave_first_deepest_first_and_a_hit_revives_them() {
    let (mut c, s, ns) = cache_one(PolicyKind::Lru, 8, 4);
    let (a, b) = (chain(100, 4), chain(200, 4));
    save(&mut c, s, ns, &a);
    save(&mut c, s, ns, &b);
    // `b` is the most recent; done makes it leave before `a`, tail first.
    assert_eq!(c.retain(s, ns, &b, Retain::Done, 0).expect("done").applied, 4);
    save(&mut c, s, ns, &chain(300, 1));
    assert_eq!(
        visible(&c, ns, &b[..3]),
        3,
        "the prefix of a done chain went before its tail"
    );
    assert!(!c.is_visible(ns, &b[3]));
    assert_eq!(visible(&c, ns, &a), 4, "an unhinted block left before a done one");

    // A hit on done blocks returns them to the policy as hits: `a` now goes first.
    let r = c.lookup(s, ns, &b[..3]).expect("lookup");
    c.release(s, r.lease.expect("hit")).expect("release");
    save(&mut c, s, ns, &chain(400, 3));
    assert_eq!(visible(&c, ns, &b[..3]), 3);
    assert_eq!(visible(&c, ns, &a), 1);
    assert_eq!(c.hint_stats().retention.done_revived_total, 3);
    c.check_invariants().expect("invariants");
}

#[test]
fn a_hint_on_blocks_not_committed_yet_applies_when_they_commit() {
    let (mut c, s, ns) = cache_one(PolicyKind::Duel, 16, 8);
    let late = chain(500, 4);
    save(&mut c, s, ns, &late[..2]);
    let out = c
        .retain(s, ns, &late, Retain::Keep { ttl_ms: 10_000 }, 0)
        .expect("retain");
    assert_eq!((out.applied, out.pending), (2, 2));
    assert_eq!(c.hint_stats().pending_blocks, 2);
    save(&mut c, s, ns, &late[2..]);
    let st = c.hint_stats();
    assert_eq!(
        (
            st.pending_blocks,
            st.pending_applied_total,
            st.retention.kept_blocks
        ),
        (0, 2, 4)
    );
    flood(&mut c, s, ns, 0, 64);
    assert_eq!(visible(&c, ns, &late), 4);
    // A pending hint whose deadline passes before its block commits is dropped.
    c.retain(s, ns, &chain(600, 1), Retain::Keep { ttl_ms: 5 }, 0)
        .expect("retain");
    c.expire_hints(20_000);
    let st = c.hint_stats();
    assert_eq!((st.pending_blocks, st.pending_dropped_total), (0, 1));
}

#[test]
fn the_cap_is_shared_but_a_keep_displaces_only_its_own_namespace() {
    let (mut c, s, nss) = cache(PolicyKind::Lru, 16, 4, &[1, 2]);
    let (x, y) = (nss[0], nss[1]);
    let (x_late, x_soon, y_any) = (chain(10, 4), chain(20, 2), chain(30, 2));
    save(&mut c, s, x, &x_late);
    save(&mut c, s, x, &x_soon);
    save(&mut c, s, y, &y_any);
    let out = c
        .retain(s, x, &x_late, Retain::Keep { ttl_ms: 9_000 }, 0)
        .expect("retain");
    assert_eq!((out.applied, out.refused), (4, 0));
    // The other namespace finds the cap full and takes nothing of x's.
    let out = c
        .retain(s, y, &y_any, Retain::Keep { ttl_ms: 1_000 }, 0)
        .expect("retain");
    assert_eq!((out.applied, out.refused), (0, 2));
    assert_eq!(c.hint_stats().retention.kept_blocks, 4);
    // x's own keep due sooner displaces x's blocks expected back last.
    let out = c
        .retain(s, x, &x_soon, Retain::Keep { ttl_ms: 1_000 }, 0)
        .expect("retain");
    assert_eq!((out.applied, out.refused), (2, 0));
    let st = c.hint_stats().retention;
    assert_eq!((st.kept_blocks, st.displaced_total), (4, 2));
    // A keep due later than everything kept finds nothing to displace.
    let out = c
        .retain(s, x, &chain(40, 1), Retain::Keep { ttl_ms: 9_500 }, 0)
        .expect("retain");
    assert_eq!(out.refused, 0, "not visible yet: pending, not refused");
    save(&mut c, s, x, &chain(40, 1));
    assert_eq!(c.hint_stats().retention.refused_total, 3);
    c.check_invariants().expect("invariants");
}

#[test]
fn a_leased_block_is_never_evicted_whatever_the_hints_say() {
    let (mut c, s, ns) = cache_one(PolicyKind::Lru, 4, 4);
    let a = chain(1, 4);
    save(&mut c, s, ns, &a);
    let r = c.lookup(s, ns, &a).expect("lookup");
    let lease = r.lease.expect("hit");
    c.retain(s, ns, &a, Retain::Done, 0).expect("done");
    // Every block is pinned: a save finds no room rather than evicting one.
    let (id, _) = c.begin_save(s, ns, &chain(50, 1)).expect("begin");
    c.commit_save(s, id).expect("commit");
    assert!(!c.is_visible(ns, &h(50)));
    assert_eq!(visible(&c, ns, &a), 4);
    c.release(s, lease).expect("release");
    save(&mut c, s, ns, &chain(60, 1));
    assert!(c.is_visible(ns, &h(60)));
    assert!(
        !c.is_visible(ns, &a[3]),
        "the done chain's deepest block leaves first"
    );
    c.check_invariants().expect("invariants");
}

#[test]
fn bad_hints_and_hints_to_a_manager_without_them_are_refused() {
    let (mut c, s, ns) = cache_one(PolicyKind::Duel, 8, 4);
    for ttl_ms in [0, orbitkv_core::MAX_RETAIN_TTL_MS + 1] {
        let e = c
            .retain(s, ns, &chain(1, 1), Retain::Keep { ttl_ms }, 0)
            .expect_err("ttl");
        assert!(matches!(e, CacheError::BadHint(_)), "{e}");
        assert!(e.to_string().contains("24 hours"), "{e}");
    }
    let e = c
        .retain(s, NsId(77), &chain(1, 1), Retain::Done, 0)
        .expect_err("ns");
    assert_eq!(e, CacheError::UnknownNamespace(NsId(77)));
    c.set_retention_cap(0);
    let e = c.retain(s, ns, &chain(1, 1), Retain::Done, 0).expect_err("off");
    assert_eq!(e, CacheError::RetentionOff);
    assert!(e.to_string().contains("--retain-share"), "{e}");
    assert_eq!(c.hint_stats().requests_total, 0);
}

#[test]
fn clear_returns_kept_blocks_to_the_policy() {
    let (mut c, s, ns) = cache_one(PolicyKind::Lru, 16, 8);
    let a = chain(1, 4);
    save(&mut c, s, ns, &a);
    c.retain(s, ns, &a, Retain::Keep { ttl_ms: 60_000 }, 0)
        .expect("keep");
    assert_eq!(c.retain(s, ns, &a, Retain::Clear, 0).expect("clear").applied, 4);
    assert_eq!(c.hint_stats().retention.kept_blocks, 0);
    c.check_invariants().expect("invariants");
    flood(&mut c, s, ns, 1000, 64);
    assert_eq!(visible(&c, ns, &a), 0);
}
