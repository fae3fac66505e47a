//! Property test of the SSD-tier bookkeeping: random saves, lookups with
//! staging (reads that succeed or fail), write-behind spills (that succeed or
//! fail), SSD-full drops, generation resets and retention hints (keep, done,
//! clear, deadlines passing), with the tiers apart or decided
//! as one capacity (`enable_ssd_tiers`: the SSD never holds more than its size,
//! counted exactly). After every step the ownership
//! invariants hold, a block whose staging failed is never visible again, and
//! `Ready` never hands out a slot twice within one lease.

mod common;

use std::collections::HashSet;

use orbitkv_core::{AcquireStep, BlockHash, CacheState, Fingerprint, NamespaceKey, SessionId};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Save {
        start: u8,
        len: usize,
    },
    Restore {
        start: u8,
        len: usize,
        fail_mask: u8,
    },
    Spill {
        n: usize,
        fail_mask: u8,
    },
    SsdFull {
        n: u8,
    },
    Bump,
    Hint {
        start: u8,
        len: usize,
        what: u8,
        ttl_ms: u64,
    },
    Tick {
        ms: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..12u8, 1..5usize).prop_map(|(start, len)| Op::Save { start, len }),
        4 => (0..12u8, 1..5usize, any::<u8>()).prop_map(|(start, len, fail_mask)| Op::Restore { start, len, fail_mask }),
        3 => (1..6usize, any::<u8>()).prop_map(|(n, fail_mask)| Op::Spill { n, fail_mask }),
        1 => (1..8u8).prop_map(|n| Op::SsdFull { n }),
        1 => Just(Op::Bump),
        2 => (0..12u8, 1..5usize, 0..3u8, 1..50u64).prop_map(|(start, len, what, ttl_ms)| Op::Hint { start, len, what, ttl_ms }),
        1 => (1..40u64).prop_map(|ms| Op::Tick { ms }),
    ]
}

fn hashes(start: u8, len: usize) -> Vec<BlockHash> {
    (0..len).map(|i| [start.wrapping_add(i as u8); 32]).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    #[test]
    fn ssd_tier_bookkeeping_holds(ops in proptest::collection::vec(op(), 1..150), min_hits in 0u32..2, eager in any::<bool>(), kind in 0..orbitkv_core::policy::PolicyKind::ALL.len(), ssd_blocks in prop_oneof![Just(0u64), 1..10u64], keep_blocks in 1..7u64) {
        let mut c = CacheState::with_policy(&[6 * 4096], orbitkv_core::policy::PolicyKind::ALL[kind]);
        let policy = if eager { orbitkv_core::SpillPolicy::Eager } else { orbitkv_core::SpillPolicy::Evict };
        // 0: the tiers apart (the store's drops only); else DRAM and an SSD of
        // that many blocks decided as one capacity.
        if ssd_blocks == 0 {
            c.enable_ssd_with(min_hits, policy);
        } else {
            c.enable_ssd_tiers(min_hits, policy, ssd_blocks * 4096);
        }
        c.set_retention_cap(keep_blocks * 4096);
        let mut now = 0u64;
        let presence = common::Recorder::install(&mut c);
        let key = NamespaceKey { fingerprint: Fingerprint([3; 32]), shard: 0, salt: [0; 32] };
        let (ns, _) = c.register_namespace(key, 4096).expect("ns");
        let s: SessionId = c.open_session();
        let mut lost: HashSet<BlockHash> = HashSet::new();
        for op in ops {
            match op {
                Op::Save { start, len } => {
                    let hs = hashes(start, len);
                    let (id, _) = c.begin_save(s, ns, &hs).expect("begin");
                    c.commit_save(s, id).expect("commit");
                    for h in &hs { lost.remove(h); }
                }
                Op::Restore { start, len, fail_mask } => {
                    let hs = hashes(start, len);
                    let r = c.lookup(s, ns, &hs).expect("lookup");
                    let Some(lease) = r.lease else { continue };
                    let mut bit = 0;
                    loop {
                        match c.acquire(s, lease) {
                            Ok(AcquireStep::Ready(slots)) => {
                                prop_assert_eq!(slots.len(), r.hit_blocks as usize);
                                let distinct: HashSet<_> = slots.iter().map(|x| (x.segment, x.offset)).collect();
                                prop_assert_eq!(distinct.len(), slots.len());
                                c.release(s, lease).expect("release");
                                break;
                            }
                            Ok(AcquireStep::Stage(jobs)) => {
                                for j in jobs {
                                    let ok = fail_mask >> (bit % 8) & 1 == 0;
                                    bit += 1;
                                    c.finish_stage(&j, ok);
                                    if !ok { lost.insert(j.key().hash); }
                                }
                            }
                            Ok(AcquireStep::Wait) => prop_assert!(false, "single session never waits on itself"),
                            Ok(AcquireStep::Lost { .. }) => break,
                            Err(orbitkv_core::CacheError::NoStagingSpace { .. }) => {
                                c.release(s, lease).expect("release");
                                break;
                            }
                            Err(e) => prop_assert!(false, "acquire: {e}"),
                        }
                    }
                }
                Op::Spill { n, fail_mask } => {
                    for (i, j) in c.spill_candidates(n).into_iter().enumerate() {
                        c.spill_done(&j, fail_mask >> (i % 8) & 1 == 0);
                    }
                }
                Op::SsdFull { n } => {
                    let proposed: Vec<_> = (0..n)
                        .filter_map(|i| c.tier_key(&orbitkv_core::BlockKey { ns, generation: c.generation_of(ns).unwrap_or(0), hash: [i; 32] }))
                        .collect();
                    let _ = c.ssd_droppable(&proposed);
                    let _ = c.ssd_make_room(usize::from(n));
                }
                Op::Bump => {
                    c.bump_generation(ns).expect("no leases are held between steps");
                    lost.clear();
                }
                Op::Hint { start, len, what, ttl_ms } => {
                    let what = match what {
                        0 => orbitkv_core::Retain::Keep { ttl_ms },
                        1 => orbitkv_core::Retain::Done,
                        _ => orbitkv_core::Retain::Clear,
                    };
                    let out = c.retain(s, ns, &hashes(start, len), what, now).expect("retain");
                    prop_assert!(out.applied + out.pending + out.refused <= len as u32);
                    let st = c.hint_stats().retention;
                    prop_assert!(st.kept_bytes <= st.cap_bytes, "kept {} above the cap {}", st.kept_bytes, st.cap_bytes);
                }
                Op::Tick { ms } => {
                    now += ms;
                    if c.hint_expiry_due(now) {
                        prop_assert!(c.expire_hints(now) > 0);
                    }
                    prop_assert!(!c.hint_expiry_due(now));
                }
            }
            for h in &lost {
                prop_assert!(!c.is_visible(ns, h), "a block that failed staging is visible again");
            }
            let _ = c.take_ssd_removals();
            c.check_invariants().map_err(TestCaseError::fail)?;
            c.check_tier_invariants().map_err(TestCaseError::fail)?;
            presence.check(&c).map_err(TestCaseError::fail)?;
            prop_assert_eq!(c.gauges().live_leases, 0);
        }
    }
}
