//! Admission to a remote tier by reuse (`--remote-admit-hits N`): a block becomes due
//! for the remote tier when a lookup counts its `N`-th hit, exactly once while it stays
//! resident (the hit count is the one [`Entry::hit`](super::entries) keeps; the lookup
//! that moves it to `N` is the only one that sees `N`). Due blocks wait here until the
//! Manager takes them ([`CacheState::take_remote_due`]) and queues them for its writer.
//! With `N` = 0 nothing is ever due here: the Manager writes every committed block.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use super::CacheState;
use crate::keys::BlockKey;

/// Most due blocks held for the Manager; beyond it new ones are dropped (counted), as
/// the Manager's own write queue does when it is full.
const MAX_DUE: usize = 65_536;

#[derive(Debug, Default)]
pub(super) struct RemoteAdmission {
    /// The hit that makes a block due; 0: off.
    hits: u32,
    due: Mutex<Vec<BlockKey>>,
    /// Whether `due` may hold anything (read without the lock by every lookup).
    any: AtomicBool,
}

impl RemoteAdmission {
    /// Does the hit that moved a block's count to `hits` make it due?
    pub(super) fn due_at(&self, hits: u32) -> bool {
        self.hits != 0 && hits == self.hits
    }

    /// Record `keys` as due; returns how many were dropped for want of room.
    pub(super) fn push(&self, keys: &[BlockKey]) -> usize {
        if keys.is_empty() {
            return 0;
        }
        let mut due = self.due.lock().unwrap_or_else(|p| p.into_inner());
        let room = MAX_DUE.saturating_sub(due.len()).min(keys.len());
        due.extend_from_slice(&keys[..room]);
        self.any.store(true, Ordering::Release);
        keys.len() - room
    }
}

impl CacheState {
    /// Make blocks due for the remote tier at their `hits`-th hit (0: never; see the
    /// module documentation).
    pub fn set_remote_admit_hits(&mut self, hits: u32) {
        self.remote.hits = hits;
    }

    /// The hit count at which blocks become due for the remote tier (0: off).
    pub fn remote_admit_hits(&self) -> u32 {
        self.remote.hits
    }

    /// Every block due for the remote tier since the last call, in the order their
    /// hits made them due. Cheap when none is: one atomic load.
    pub fn take_remote_due(&self) -> Vec<BlockKey> {
        if !self.remote.any.load(Ordering::Acquire) {
            return Vec::new();
        }
        let mut due = self.remote.due.lock().unwrap_or_else(|p| p.into_inner());
        self.remote.any.store(false, Ordering::Release);
        std::mem::take(&mut *due)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::keys::{Fingerprint, NamespaceKey, NsId, SessionId};

    const BLOCK: u64 = 4096;

    fn cache(admit: u32) -> (CacheState, SessionId, NsId) {
        let mut c = CacheState::new(&[64 * BLOCK]);
        c.set_remote_admit_hits(admit);
        let s = c.open_session();
        let key = NamespaceKey {
            fingerprint: Fingerprint([9; 32]),
            shard: 0,
            salt: [0; 32],
        };
        let (ns, _) = c.register_namespace(key, BLOCK).expect("ns");
        let hs: Vec<[u8; 32]> = (0..3).map(|i| [i; 32]).collect();
        let (id, _) = c.begin_save(s, ns, &hs).expect("begin");
        c.commit_save(s, id).expect("commit");
        (c, s, ns)
    }

    fn hit(c: &mut CacheState, s: SessionId, ns: NsId, n: u8) {
        let hs: Vec<[u8; 32]> = (0..n).map(|i| [i; 32]).collect();
        let r = c.lookup(s, ns, &hs).expect("lookup");
        assert_eq!(r.hit_blocks, u32::from(n));
        c.release(s, r.lease.expect("lease")).expect("release");
    }

    fn hashes(due: &[BlockKey]) -> Vec<u8> {
        due.iter().map(|k| k.hash[0]).collect()
    }

    #[test]
    fn pinning_a_block_to_copy_it_out_is_not_a_hit() {
        // The remote writer's read: no lookup or hit counted, nothing made due.
        let (mut c, s, ns) = cache(1);
        let before = c.counters();
        let hs: Vec<[u8; 32]> = (0..4).map(|i| [i; 32]).collect();
        let r = c.pin_for_copy(s, ns, &hs).expect("pin");
        assert_eq!(r.hit_blocks, 3, "the leading run of visible blocks");
        c.release(s, r.lease.expect("lease")).expect("release");
        let after = c.counters();
        assert_eq!(
            (after.lookups, after.hit_blocks),
            (before.lookups, before.hit_blocks)
        );
        assert!(c.take_remote_due().is_empty(), "a copy made no block due");
        hit(&mut c, s, ns, 3);
        assert_eq!(hashes(&c.take_remote_due()), vec![0, 1, 2], "a lookup's hit does");
    }

    #[test]
    fn a_block_is_due_once_at_its_nth_hit() {
        let (mut c, s, ns) = cache(2);
        assert!(c.take_remote_due().is_empty(), "committed, never hit: not due");
        hit(&mut c, s, ns, 3);
        assert!(c.take_remote_due().is_empty(), "one hit of two");
        hit(&mut c, s, ns, 2);
        assert_eq!(
            hashes(&c.take_remote_due()),
            [0, 1],
            "the second hit of blocks 0 and 1"
        );
        hit(&mut c, s, ns, 3);
        assert_eq!(
            hashes(&c.take_remote_due()),
            [2],
            "block 2's second hit; 0 and 1 not again"
        );
        hit(&mut c, s, ns, 3);
        assert!(c.take_remote_due().is_empty());
        assert_eq!(c.counters().remote_due_dropped, 0);
    }

    #[test]
    fn off_nothing_is_ever_due() {
        let (mut c, s, ns) = cache(0);
        for _ in 0..4 {
            hit(&mut c, s, ns, 3);
        }
        assert!(c.take_remote_due().is_empty());
    }

    #[test]
    fn concurrent_lookups_under_the_shared_lock_make_each_block_due_exactly_once() {
        let (c, _, ns) = cache(5);
        let c = Arc::new(std::sync::RwLock::new(c));
        let sessions: Vec<SessionId> = (0..4).map(|_| c.write().expect("lock").open_session()).collect();
        std::thread::scope(|sc| {
            for &s in &sessions {
                let c = Arc::clone(&c);
                sc.spawn(move || {
                    for _ in 0..50 {
                        let g = c.read().expect("lock");
                        let r = g
                            .lookup_shared(s, ns, &[[0; 32], [1; 32], [2; 32]])
                            .expect("lookup");
                        assert_eq!(r.hit_blocks, 3);
                        let released = g.try_release_shared(s, r.lease.expect("lease")).expect("release");
                        assert!(released, "nothing doomed: released on the shared side");
                    }
                });
            }
        });
        let mut due = hashes(&c.read().expect("lock").take_remote_due());
        due.sort_unstable();
        assert_eq!(due, [0, 1, 2], "200 hits each, due once each");
    }
}
