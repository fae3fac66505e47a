//! Property test: drive `CacheState` with random operations from several
//! sessions and compare against a simple model of what must and may be visible.
//!
//! The model cannot predict which block eviction picks, so it checks bounds:
//! - every block pinned by a live lease is visible (leased blocks never evicted);
//! - every visible block was committed in the current generation (nothing
//!   aborted, uncommitted or purged is ever visible);
//! - lookups return a prefix of visible blocks, and the block after the prefix
//!   is not visible;
//! - arena accounting and ownership invariants hold after every step.

mod common;

use std::collections::HashSet;

use orbitkv_core::{
    AcquireStep, BlockHash, CacheError, CacheState, Fingerprint, LeaseId, NamespaceKey, SaveId, SaveStatus,
    SessionEnd, SessionId,
};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Lookup { sess: usize, len: usize, start: u8 },
    Release { pick: usize },
    Acquire { pick: usize },
    BeginSave { sess: usize, len: usize, start: u8 },
    Commit { pick: usize },
    Abort { pick: usize },
    End { sess: usize, how: u8 },
    Gone { sess: usize },
    Bump,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3usize, 1..6usize, 0..4u8).prop_map(|(sess, len, start)| Op::Lookup { sess, len, start }),
        3 => any::<usize>().prop_map(|pick| Op::Release { pick }),
        2 => any::<usize>().prop_map(|pick| Op::Acquire { pick }),
        4 => (0..3usize, 1..6usize, 0..4u8).prop_map(|(sess, len, start)| Op::BeginSave { sess, len, start }),
        3 => any::<usize>().prop_map(|pick| Op::Commit { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Abort { pick }),
        1 => (0..3usize, 0..3u8).prop_map(|(sess, how)| Op::End { sess, how }),
        1 => (0..3usize).prop_map(|sess| Op::Gone { sess }),
        1 => Just(Op::Bump),
    ]
}

fn chain(start: u8, len: usize) -> Vec<BlockHash> {
    // Hashes of a few chains that share prefixes: chain `start` block i.
    (0..len)
        .map(|i| {
            let mut h = [0u8; 32];
            h[0] = if i < 2 { 0 } else { start }; // first two blocks are shared
            h[1] = i as u8;
            h
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    #[test]
    fn cache_state_matches_model(ops in proptest::collection::vec(op(), 1..120), kind in 0..orbitkv_core::policy::PolicyKind::ALL.len()) {
        // 12 slots of 4 KiB: small enough that eviction and refusal happen. Every
        // selectable policy must keep the same lease, pin and visibility rules.
        let mut c = CacheState::with_policy(&[8 * 4096, 4 * 4096], orbitkv_core::policy::PolicyKind::ALL[kind]);
        let presence = common::Recorder::install(&mut c);
        let key = NamespaceKey { fingerprint: Fingerprint([7; 32]), shard: 0, salt: [0; 32] };
        let (ns, _) = c.register_namespace(key, 4096).expect("register");
        let mut sessions: Vec<SessionId> = (0..3).map(|_| c.open_session()).collect();
        let mut quarantined: HashSet<SessionId> = HashSet::new();
        // (owner, lease, pinned hashes, acquired: source addresses handed out)
        let mut leases: Vec<(SessionId, LeaseId, Vec<BlockHash>, bool)> = Vec::new();
        let mut saves: Vec<(SessionId, SaveId, Vec<BlockHash>)> = Vec::new();
        // Blocks committed in the current generation: the only ones that may be visible.
        let mut may_be_visible: HashSet<BlockHash> = HashSet::new();

        for op in ops {
            match op {
                Op::Lookup { sess, len, start } => {
                    let s = sessions[sess];
                    let hashes = chain(start, len);
                    match c.lookup(s, ns, &hashes) {
                        Ok(r) => {
                            let n = r.hit_blocks as usize;
                            for h in &hashes[..n] { prop_assert!(may_be_visible.contains(h)); }
                            if n < hashes.len() { prop_assert!(!c.is_visible(ns, &hashes[n])); }
                            if let Some(l) = r.lease { leases.push((s, l, hashes[..n].to_vec(), false)); }
                            else { prop_assert_eq!(n, 0); }
                        }
                        Err(CacheError::SessionClosed(_)) => prop_assert!(quarantined.contains(&s)),
                        Err(e) => prop_assert!(false, "lookup failed: {e}"),
                    }
                }
                Op::Release { pick } => {
                    if leases.is_empty() { continue; }
                    let (s, l, _, acq) = leases.swap_remove(pick % leases.len());
                    if quarantined.contains(&s) { leases.push((s, l, vec![], acq)); continue; }
                    c.release(s, l).expect("release own lease");
                    prop_assert!(c.release(s, l).is_err(), "double release must fail");
                }
                Op::Acquire { pick } => {
                    if leases.is_empty() { continue; }
                    let i = pick % leases.len();
                    let s = leases[i].0;
                    if quarantined.contains(&s) { continue; }
                    match c.acquire(s, leases[i].1) {
                        // DRAM only: a pinned block is resident, so sources are ready at once.
                        Ok(AcquireStep::Ready(slots)) => {
                            prop_assert_eq!(slots.len(), leases[i].2.len());
                            leases[i].3 = true;
                        }
                        other => prop_assert!(false, "acquire without an SSD tier: {other:?}"),
                    }
                }
                Op::BeginSave { sess, len, start } => {
                    let s = sessions[sess];
                    let hashes = chain(start, len);
                    match c.begin_save(s, ns, &hashes) {
                        Ok((id, st)) => {
                            prop_assert_eq!(st.len(), hashes.len());
                            for (h, status) in hashes.iter().zip(&st) {
                                if let SaveStatus::Allocated(_) = status {
                                    prop_assert!(!c.is_visible(ns, h), "allocated slots are invisible");
                                }
                            }
                            let alloc: Vec<BlockHash> = hashes.iter().zip(&st)
                                .filter(|(_, s)| matches!(s, SaveStatus::Allocated(_)))
                                .map(|(h, _)| *h).collect();
                            saves.push((s, id, alloc));
                        }
                        Err(CacheError::SessionClosed(_)) => prop_assert!(quarantined.contains(&s)),
                        Err(e) => prop_assert!(false, "begin_save failed: {e}"),
                    }
                }
                Op::Commit { pick } => {
                    if saves.is_empty() { continue; }
                    let (s, id, hashes) = saves.swap_remove(pick % saves.len());
                    if quarantined.contains(&s) { saves.push((s, id, hashes)); continue; }
                    c.commit_save(s, id).expect("commit own save");
                    for h in hashes { prop_assert!(c.is_visible(ns, &h)); may_be_visible.insert(h); }
                }
                Op::Abort { pick } => {
                    if saves.is_empty() { continue; }
                    let (s, id, hashes) = saves.swap_remove(pick % saves.len());
                    if quarantined.contains(&s) { saves.push((s, id, hashes)); continue; }
                    c.abort_save(s, id).expect("abort own save");
                    for h in hashes {
                        if !may_be_visible.contains(&h) { prop_assert!(!c.is_visible(ns, &h)); }
                    }
                }
                Op::End { sess, how } => {
                    let s = sessions[sess];
                    let how = [SessionEnd::Clean, SessionEnd::ProcessGone, SessionEnd::Vanished][how as usize % 3];
                    c.end_session(s, how).expect("end");
                    if how == SessionEnd::Vanished && !quarantined.contains(&s) {
                        // Never-acquired leases handed out no address: released at once.
                        leases.retain(|x| x.0 != s || x.3);
                    }
                    let holds = leases.iter().any(|x| x.0 == s) || saves.iter().any(|x| x.0 == s);
                    if how == SessionEnd::Vanished && (holds || quarantined.contains(&s)) {
                        quarantined.insert(s);
                        prop_assert!(c.is_quarantined(s));
                    } else {
                        leases.retain(|x| x.0 != s);
                        saves.retain(|x| x.0 != s);
                        quarantined.remove(&s);
                        sessions[sess] = c.open_session();
                    }
                }
                Op::Gone { sess } => {
                    let s = sessions[sess];
                    if !quarantined.contains(&s) { continue; }
                    c.process_gone(s).expect("gone");
                    leases.retain(|x| x.0 != s);
                    saves.retain(|x| x.0 != s);
                    quarantined.remove(&s);
                    sessions[sess] = c.open_session();
                }
                Op::Bump => {
                    match c.bump_generation(ns) {
                        Ok(_) => {
                            prop_assert!(leases.is_empty() && saves.is_empty());
                            may_be_visible.clear();
                        }
                        Err(CacheError::Busy { .. }) => prop_assert!(!leases.is_empty() || !saves.is_empty()),
                        Err(e) => prop_assert!(false, "bump failed: {e}"),
                    }
                }
            }
            // Leased blocks are never evicted.
            for (_, _, hs, _) in &leases {
                for h in hs { prop_assert!(c.is_visible(ns, h), "leased block evicted"); }
            }
            c.check_invariants().map_err(TestCaseError::fail)?;
            presence.check(&c).map_err(TestCaseError::fail)?;
        }
        // Ending every session (cleanly or with proof) frees every hold.
        for s in sessions {
            c.end_session(s, SessionEnd::ProcessGone).expect("end");
        }
        let g = c.gauges();
        prop_assert_eq!(g.live_leases, 0);
        prop_assert_eq!(g.live_saves, 0);
        prop_assert_eq!(g.pending_save_bytes, 0);
        c.check_invariants().map_err(TestCaseError::fail)?;
    }
}
