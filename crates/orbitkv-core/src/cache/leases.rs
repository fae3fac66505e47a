//! Leases: the whole pin lifecycle — `lookup` grants (pins the hit),
//! `acquire` hands out source slots (staging SSD-only blocks first),
//! `release` retires — and [`CacheState::end_lease`] /
//! [`CacheState::try_release_shared`], the only places a lease ends. Calls down
//! into `tiers` (staging, doomed blocks), `entries` and `registry`, never up.
//!
//! The common case of each step also runs with `&self` (the Manager's shared
//! lock; see `concurrent.rs`): [`CacheState::lookup_shared`],
//! [`CacheState::try_acquire_shared`] (every block in DRAM) and
//! [`CacheState::try_release_shared`] (nothing doomed, no TP part). The `&mut`
//! methods run that same code first and fall back to the exclusive path, so
//! every test of the `&mut` API also runs the shared path.

mod records;

use std::sync::atomic::Ordering;

use super::concurrent::{DRAIN_AT, HotCounters, Touch};
use super::entries::Entry;
use super::jobs::LeasedSlot;
use super::{AcquireStep, BlockRef, CacheError, CacheState};
use crate::keys::{BlockHash, BlockKey, LeaseId, NsId, SessionId};
pub(in crate::cache) use records::{LeaseRecord, LeaseTable, TpLeaseRecord};
pub use records::{LeaseState, TpPart, TpToken};

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

impl LookupResult {
    /// Nothing hit, nothing pinned.
    fn miss(generation: u64) -> Self {
        LookupResult {
            lease: None,
            hit_blocks: 0,
            ssd_blocks: Vec::new(),
            generation,
        }
    }
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
        let r = self.lookup_shared(s, ns, hashes);
        self.apply_touches();
        r
    }

    /// [`Self::lookup`] under a shared lock: the pins, the lease and the
    /// counters change at once; the policy sees the hit at the next
    /// [`Self::apply_touches`], which the holder of the exclusive lock must
    /// call before anything else.
    pub fn lookup_shared(
        &self,
        s: SessionId,
        ns: NsId,
        hashes: &[BlockHash],
    ) -> Result<LookupResult, CacheError> {
        self.session(s)?;
        let generation = self.generation_of(ns)?;
        HotCounters::add(&self.hot.lookups, 1);
        HotCounters::add(&self.hot.lookup_blocks, hashes.len() as u64);
        // One pass: each hit block is found, pinned and counted once.
        let mut keys = Vec::new();
        let mut refs = Vec::new();
        let mut ssd_blocks = Vec::new();
        let mut spill = Vec::new();
        for key in BlockKey::chain(ns, generation, hashes) {
            match self.index.get_ref(&key) {
                Some((r, e)) if !e.doomed => {
                    if e.dram_slot().is_none() {
                        ssd_blocks.push(keys.len() as u32);
                    }
                    self.pin_hit(&key, e, &mut spill);
                    keys.push(key);
                    refs.push(r);
                }
                _ => break,
            }
        }
        let hit_blocks = keys.len() as u32;
        HotCounters::add(&self.hot.hit_blocks, u64::from(hit_blocks));
        HotCounters::add(&self.hot.ssd_hit_blocks, ssd_blocks.len() as u64);
        if keys.is_empty() {
            return Ok(LookupResult::miss(generation));
        }
        let id = self.record_lease(s, ns, keys, refs, None, spill);
        Ok(LookupResult {
            lease: Some(id),
            hit_blocks,
            ssd_blocks,
            generation,
        })
    }

    /// Indices (ascending) of `keys` with no DRAM copy now (read from SSD on acquire).
    pub(super) fn ssd_only(&self, keys: &[BlockKey]) -> Vec<u32> {
        (0..keys.len() as u32)
            .filter(|&i| {
                self.index
                    .get(&keys[i as usize])
                    .is_some_and(|e| e.dram_slot().is_none())
            })
            .collect()
    }

    /// Pin `keys` (visible blocks) under a new `Granted` lease of session `s`
    /// (live: checked by the caller), and log the touch for the policy.
    pub(super) fn grant_lease(
        &self,
        s: SessionId,
        ns: NsId,
        keys: Vec<BlockKey>,
        tp: Option<TpToken>,
    ) -> LeaseId {
        let mut spill = Vec::new();
        let mut refs = Vec::with_capacity(keys.len());
        for k in &keys {
            if let Some((r, e)) = self.index.get_ref(k) {
                self.pin_hit(k, e, &mut spill);
                refs.push(r);
            }
        }
        self.record_lease(s, ns, keys, refs, tp, spill)
    }

    /// Pin one hit block and count the hit (`spill`: the block just became
    /// due for an eager spill; a block that just became due for the remote
    /// tier is recorded there).
    fn pin_hit(&self, k: &BlockKey, e: &Entry, spill: &mut Vec<BlockKey>) {
        e.pin();
        let hits = e.hit();
        if self.due_on_hit(e, hits) {
            spill.push(*k);
        }
        if self.remote.due_at(hits) && self.remote.push(std::slice::from_ref(k)) > 0 {
            HotCounters::add(&self.hot.remote_due_dropped, 1);
        }
    }

    /// The lease over `keys`, pinned by the caller, and its touch for the
    /// policy (`refs`: the keys' index references, as the policy knows them).
    fn record_lease(
        &self,
        s: SessionId,
        ns: NsId,
        keys: Vec<BlockKey>,
        refs: Vec<BlockRef>,
        tp: Option<TpToken>,
        spill: Vec<BlockKey>,
    ) -> LeaseId {
        let id = LeaseId(self.next());
        let touch = Touch {
            seq: id.0,
            chain: refs,
            spill,
        };
        if !self.touches.push(s, touch) {
            HotCounters::add(&self.hot.policy_touches_dropped, 1);
        }
        self.insert_lease(id, s, ns, keys, tp);
        id
    }

    /// Record lease `id` of session `s` over `keys` (pinned by the caller).
    fn insert_lease(&self, id: LeaseId, s: SessionId, ns: NsId, keys: Vec<BlockKey>, tp: Option<TpToken>) {
        self.leases.insert(
            id,
            LeaseRecord {
                session: s,
                ns,
                keys,
                state: LeaseState::Granted,
                tp,
            },
        );
        if let Some(info) = self.sessions.get(&s) {
            info.leases.add(id);
        }
        HotCounters::add(&self.hot.leases_granted, 1);
    }

    /// Pin the leading run of `hashes` visible in `ns` under a lease of session `s`, to
    /// copy the blocks out for the Manager itself (the remote tier's write-behind). Reading
    /// a block to copy it is not a reuse: no lookup or hit is counted, the policy is not
    /// touched, and no SSD spill or remote admission is made due.
    pub fn pin_for_copy(
        &mut self,
        s: SessionId,
        ns: NsId,
        hashes: &[BlockHash],
    ) -> Result<LookupResult, CacheError> {
        self.apply_touches();
        self.session(s)?;
        let generation = self.generation_of(ns)?;
        let mut keys = Vec::new();
        for key in BlockKey::chain(ns, generation, hashes) {
            match self.index.get(&key) {
                Some(e) if !e.doomed => {
                    e.pin();
                    keys.push(key);
                }
                _ => break,
            }
        }
        let hit_blocks = keys.len() as u32;
        if keys.is_empty() {
            return Ok(LookupResult::miss(generation));
        }
        let ssd_blocks = self.ssd_only(&keys);
        let id = LeaseId(self.next());
        self.insert_lease(id, s, ns, keys, None);
        Ok(LookupResult {
            lease: Some(id),
            hit_blocks,
            ssd_blocks,
            generation,
        })
    }

    /// Replay the touches of leases granted under the shared lock, in grant
    /// order. The exclusive lock holder calls this before anything else; the
    /// `&mut` methods that grant leases call it themselves.
    pub fn apply_touches(&mut self) {
        for k in self.policy.replay(&mut self.touches) {
            self.queue_spill_on_hit(k);
        }
    }

    /// The same from the shared side, when [`DRAIN_AT`] chains or more wait
    /// (`force`: any) and no other replay is running; `true` when it ran.
    pub fn apply_touches_shared(&self, force: bool) -> bool {
        let pending = self.touches.pending();
        if pending == 0 || (!force && pending < DRAIN_AT) {
            return false;
        }
        self.policy.replay_shared(&self.touches)
    }

    /// Touches logged and not yet replayed.
    pub fn touches_pending(&self) -> usize {
        self.touches.pending()
    }

    /// The lease, if `s` is live and owns it.
    fn owned_lease(&mut self, s: SessionId, l: LeaseId) -> Result<&mut LeaseRecord, CacheError> {
        self.live_session(s)?;
        let lease = self.leases.get_mut(l).ok_or(CacheError::UnknownLease(l))?;
        if lease.session != s {
            return Err(CacheError::NotOwner {
                what: "lease",
                id: l.0,
            });
        }
        Ok(lease)
    }

    pub fn lease_state(&self, l: LeaseId) -> Option<LeaseState> {
        self.leases.with(l, |x| x.state)
    }

    /// Hand out the source slots of a lease, staging SSD-only blocks first.
    /// Once `Ready` is returned, copies may be in flight until `release`.
    pub fn acquire(&mut self, s: SessionId, l: LeaseId) -> Result<AcquireStep, CacheError> {
        if let Some(slots) = self.try_acquire_shared(s, l)? {
            return Ok(AcquireStep::Ready(slots));
        }
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
            keys.iter()
                .filter_map(|k| self.index.get(k)?.dram_slot())
                .map(LeasedSlot::new)
                .collect(),
        ))
    }

    /// [`Self::acquire`] when every block of the lease is visible and in DRAM
    /// (`Some(slots)`, the lease now `Acquired`); `None`, with nothing
    /// changed, when staging or a lost block needs the exclusive path.
    pub fn try_acquire_shared(
        &self,
        s: SessionId,
        l: LeaseId,
    ) -> Result<Option<Vec<LeasedSlot>>, CacheError> {
        self.session(s)?;
        self.leases
            .with(l, |lease| {
                if lease.session != s {
                    return Err(CacheError::NotOwner {
                        what: "lease",
                        id: l.0,
                    });
                }
                let slots: Option<Vec<LeasedSlot>> = lease
                    .keys
                    .iter()
                    .map(|k| {
                        self.index
                            .get(k)
                            .filter(|e| !e.doomed)
                            .and_then(|e| e.dram_slot())
                            .map(LeasedSlot::new)
                    })
                    .collect();
                if slots.is_some() {
                    lease.state = LeaseState::Acquired;
                }
                Ok(slots)
            })
            .ok_or(CacheError::UnknownLease(l))?
    }

    /// The client reports that every copy out of this lease has drained:
    /// the sources are retired (unpinned).
    pub fn release(&mut self, s: SessionId, l: LeaseId) -> Result<(), CacheError> {
        if self.try_release_shared(s, l)? {
            return Ok(());
        }
        self.owned_lease(s, l)?;
        self.end_lease(l);
        Ok(())
    }

    /// [`Self::release`] when ending the lease frees nothing: no block of it
    /// is doomed (a doomed block is reaped when its last pin goes) and it is
    /// no TP lease's part. `Ok(false)`, with nothing changed, otherwise.
    pub fn try_release_shared(&self, s: SessionId, l: LeaseId) -> Result<bool, CacheError> {
        let info = self.session(s)?;
        let mut entries: Vec<&Entry> = Vec::new();
        let taken = self.leases.take_if(l, CacheError::UnknownLease(l), |lease| {
            if lease.session != s {
                return Err(CacheError::NotOwner {
                    what: "lease",
                    id: l.0,
                });
            }
            if lease.tp.is_some() {
                return Ok(false);
            }
            for k in &lease.keys {
                match self.index.get(k) {
                    Some(e) if !e.doomed => entries.push(e),
                    _ => return Ok(false),
                }
            }
            Ok(true)
        })?;
        if taken.is_none() {
            return Ok(false);
        }
        for e in entries {
            e.unpin();
        }
        info.leases.drop_lease(l);
        HotCounters::add(&self.hot.leases_retired, 1);
        Ok(true)
    }

    /// The only place (with [`Self::try_release_shared`]) a lease ends: unpin
    /// its blocks (reaping those doomed meanwhile) and forget it in its
    /// session. Callers: `release` (the client drained), `acquire` (a block
    /// was lost), `end_session` (granted leases of a vanished session; every
    /// lease of an ended session).
    pub(super) fn end_lease(&mut self, l: LeaseId) {
        let Some(lease) = self.leases.remove(l) else {
            return;
        };
        for k in &lease.keys {
            if let Some(e) = self.index.get(k) {
                e.unpin();
            }
            self.reap_if_doomed(*k);
        }
        if let Some(info) = self.sessions.get_mut(&lease.session) {
            info.leases.get_mut().remove(&l);
        }
        self.hot.leases_retired.fetch_add(1, Ordering::Relaxed);
        // One shard's part of a TP lease: that rank is done (once: the part is
        // found by its lease id, which ends only here). The TP lease ends with
        // its last part.
        if let Some(token) = lease.tp
            && let Some(tp) = self.tp.get_mut(&token)
            && tp.part_ended(l)
        {
            self.tp.remove(&token);
            self.counters.tp_leases_completed += 1;
        }
    }
}
