//! Leases: the whole pin lifecycle — `lookup` grants (pins the hit),
//! `acquire` hands out source slots (staging SSD-only blocks first),
//! `release` retires — and [`CacheState::end_lease`], the only place a lease
//! ends. Calls down into `tiers` (staging, doomed blocks), `entries` and
//! `registry`, never up.

use super::{AcquireStep, CacheError, CacheState};
use crate::keys::{BlockHash, BlockKey, LeaseId, NsId, SessionId};

/// Lifecycle of a lease as the Manager can observe it (contract L2). The
/// client-side facts (enqueue, per-layer readiness) are tracked by the client;
/// the Manager sees "sources handed out" and "drained → retired".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// Hit blocks pinned; no copy may have started yet.
    Granted,
    /// Source locations handed to the client: copies may be in flight.
    Acquired,
}

#[derive(Debug, Clone)]
pub struct LookupResult {
    pub lease: Option<LeaseId>,
    pub hit_blocks: u32,
    /// Indices (ascending, `< hit_blocks`) of the hit blocks with no DRAM copy
    /// at lookup time: `acquire` reads them from SSD. The lease pins the other
    /// hit blocks in DRAM until it is released.
    pub ssd_blocks: Vec<u32>,
    pub generation: u64,
}

#[derive(Debug, Clone)]
pub(super) struct Lease {
    pub(super) session: SessionId,
    pub(super) ns: NsId,
    pub(super) keys: Vec<BlockKey>,
    pub(super) state: LeaseState,
}

impl CacheState {
    /// Longest contiguous prefix of `hashes` that is visible, pinned under a
    /// new lease (none when the hit is empty).
    pub fn lookup(
        &mut self,
        s: SessionId,
        ns: NsId,
        hashes: &[BlockHash],
    ) -> Result<LookupResult, CacheError> {
        self.live_session(s)?;
        let generation = self.generation_of(ns)?;
        self.counters.lookups += 1;
        self.counters.lookup_blocks += hashes.len() as u64;
        let mut keys = Vec::new();
        for h in hashes {
            let key = BlockKey {
                ns,
                generation,
                hash: *h,
            };
            match self.index.get_mut(&key) {
                Some(e) if !e.doomed => {
                    e.pins += 1;
                    e.hits = e.hits.saturating_add(1);
                    keys.push(key);
                }
                _ => break,
            }
        }
        self.policy.touch_chain(&keys);
        for k in &keys {
            self.note_hit(*k);
        }
        let hit_blocks = keys.len() as u32;
        let ssd_blocks: Vec<u32> = (0..hit_blocks)
            .filter(|&i| {
                self.index
                    .get(&keys[i as usize])
                    .is_some_and(|e| e.slot.is_none())
            })
            .collect();
        self.counters.hit_blocks += u64::from(hit_blocks);
        self.counters.ssd_hit_blocks += ssd_blocks.len() as u64;
        if keys.is_empty() {
            return Ok(LookupResult {
                lease: None,
                hit_blocks: 0,
                ssd_blocks: Vec::new(),
                generation,
            });
        }
        let id = LeaseId(self.next());
        self.leases.insert(
            id,
            Lease {
                session: s,
                ns,
                keys,
                state: LeaseState::Granted,
            },
        );
        if let Some(info) = self.sessions.get_mut(&s) {
            info.leases.insert(id);
        }
        self.counters.leases_granted += 1;
        Ok(LookupResult {
            lease: Some(id),
            hit_blocks,
            ssd_blocks,
            generation,
        })
    }

    /// The lease, if `s` is live and owns it.
    fn owned_lease(&mut self, s: SessionId, l: LeaseId) -> Result<&mut Lease, CacheError> {
        self.live_session(s)?;
        let lease = self.leases.get_mut(&l).ok_or(CacheError::UnknownLease(l))?;
        if lease.session != s {
            return Err(CacheError::NotOwner {
                what: "lease",
                id: l.0,
            });
        }
        Ok(lease)
    }

    pub fn lease_state(&self, l: LeaseId) -> Option<LeaseState> {
        self.leases.get(&l).map(|x| x.state)
    }

    /// Hand out the source slots of a lease, staging SSD-only blocks first.
    /// Once `Ready` is returned, copies may be in flight until `release`.
    pub fn acquire(&mut self, s: SessionId, l: LeaseId) -> Result<AcquireStep, CacheError> {
        let keys = self.owned_lease(s, l)?.keys.clone();
        let lost = keys
            .iter()
            .filter(|k| self.index.get(k).is_none_or(|e| e.doomed))
            .count();
        if lost > 0 {
            self.end_lease(l);
            return Ok(AcquireStep::Lost { blocks: lost });
        }
        if self.any_staging(&keys) {
            return Ok(AcquireStep::Wait);
        }
        let jobs = self.stage_jobs(&keys)?;
        if !jobs.is_empty() {
            return Ok(AcquireStep::Stage(jobs));
        }
        self.owned_lease(s, l)?.state = LeaseState::Acquired;
        Ok(AcquireStep::Ready(
            keys.iter().filter_map(|k| self.index.get(k)?.slot).collect(),
        ))
    }

    /// The client reports that every copy out of this lease has drained:
    /// the sources are retired (unpinned).
    pub fn release(&mut self, s: SessionId, l: LeaseId) -> Result<(), CacheError> {
        self.owned_lease(s, l)?;
        self.end_lease(l);
        Ok(())
    }

    /// The only place a lease ends: unpin its blocks (reaping those doomed
    /// meanwhile) and forget it in its session. Callers: `release` (the client
    /// drained), `acquire` (a block was lost), `end_session` (granted leases of
    /// a vanished session; every lease of an ended session).
    pub(super) fn end_lease(&mut self, l: LeaseId) {
        let Some(lease) = self.leases.remove(&l) else {
            return;
        };
        for k in &lease.keys {
            if let Some(e) = self.index.get_mut(k) {
                e.pins = e.pins.saturating_sub(1);
            }
            self.reap_if_doomed(*k);
        }
        if let Some(info) = self.sessions.get_mut(&lease.session) {
            info.leases.remove(&l);
        }
        self.counters.leases_retired += 1;
    }
}
