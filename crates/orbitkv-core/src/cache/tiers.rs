//! Tier moves of [`CacheState`], still without I/O: the tiers' state
//! ([`TierState`]) and turning the SSD on; staging SSD-only blocks back into
//! DRAM for a lease; *doomed* blocks (corrupt or purged: invisible at once,
//! reaped once unpinned and idle). The Manager's workers do the reads and
//! writes and report back through `spill_done` / `finish_stage`. Calls down
//! into `entries` and `registry` only; the lease that asked for a stage is
//! `leases`' business.
//!
//! The rest of the SSD tier's side lives in sibling files, on the same
//! [`TierState`]: `spill.rs` (which blocks are copied to SSD, and when),
//! `ssd_capacity.rs` (the SSD bytes the tiers count, making room, dropping
//! copies, and the outbox of SSD copies the Manager must delete) and
//! `adopt.rs` (blocks recovered from disk at start).
//!
//! Who deletes an SSD copy? Only the Manager, and only keys taken from
//! [`CacheState::take_ssd_removals`] or granted by [`CacheState::ssd_droppable`].

use std::collections::{HashMap, HashSet, VecDeque};

use super::entries::{Busy, SlotFree};
use super::{BlockRef, CacheError, CacheState};
use crate::keys::{BlockHash, BlockKey, NamespaceKey, TierKey};

pub use super::jobs::{LeasedSlot, SaveSlot, SpillJob, StageJob};
pub use super::spill::SpillPolicy;
use super::spill::SpillWalk;

/// What `acquire` needs next.
#[derive(Debug, Clone)]
pub enum AcquireStep {
    /// Every block is in DRAM: copy from these slots.
    Ready(Vec<LeasedSlot>),
    /// Read these SSD copies, report with `finish_stage`, then acquire again.
    Stage(Vec<StageJob>),
    /// Another lease is staging one of these blocks: wait, then acquire again.
    Wait,
    /// A block was found corrupt (or purged) meanwhile; the lease was retired.
    Lost { blocks: usize },
}

#[derive(Debug, Default)]
pub(super) struct TierState {
    pub(super) enabled: bool,
    pub(super) policy: SpillPolicy,
    pub(super) min_hits: u32,
    /// SSD bytes the tiers may hold (0: not told; the store's own limit rules).
    pub(super) ssd_capacity: u64,
    /// SSD bytes held or being written by indexed blocks.
    pub(super) ssd_used: u64,
    pub(super) spill_queue: VecDeque<BlockKey>,
    /// `evict` policy: when the spill queue was last planned, as the cache's
    /// change count then (`spill_stamp`) and how many blocks the plan listed.
    pub(super) last_plan: Option<(u64, u64)>,
    /// `evict` policy: the walk of DRAM's cold end under way, one step per call.
    pub(super) walk: Option<SpillWalk>,
    /// Blocks staged back into DRAM whose SSD copy was kept (newest last):
    /// the first copies to go when the SSD needs room, as DRAM holds them.
    pub(super) staged_copies: Vec<BlockKey>,
    /// Recovered SSD blocks whose namespace has not registered yet:
    /// namespace → (generation, hash, block bytes).
    pub(super) dormant: HashMap<NamespaceKey, Vec<(u64, BlockHash, u64)>>,
    pub(super) removals: Vec<TierKey>,
    /// Spill jobs handed out and not yet reported (`spill_done`): their DRAM
    /// slots cannot be evicted until then.
    pub(super) spilling: usize,
}

impl TierState {
    /// Approximate heap bytes of its queues and lists.
    pub(super) fn queue_bytes(&self) -> u64 {
        use crate::map::{table_bytes, vec_bytes};
        vec_bytes::<BlockKey>(self.spill_queue.capacity() + self.staged_copies.capacity())
            + vec_bytes::<TierKey>(self.removals.capacity())
            + table_bytes::<NamespaceKey, Vec<(u64, BlockHash, u64)>>(self.dormant.capacity())
            + self
                .dormant
                .values()
                .map(|v| vec_bytes::<(u64, BlockHash, u64)>(v.capacity()))
                .sum::<u64>()
    }

    pub(super) fn dormant_len(&self) -> usize {
        self.dormant.values().map(Vec::len).sum()
    }
}

impl CacheState {
    /// Turn on write-behind to SSD: a block is spilled once it was hit
    /// `min_hits` times in DRAM (0 = every committed block).
    pub fn enable_ssd(&mut self, min_hits: u32) {
        self.enable_ssd_with(min_hits, SpillPolicy::Eager);
    }

    pub fn enable_ssd_with(&mut self, min_hits: u32, policy: SpillPolicy) {
        self.tier.enabled = true;
        self.tier.min_hits = min_hits;
        self.tier.policy = policy;
    }

    /// [`Self::enable_ssd_with`] on an SSD of `ssd_bytes`, decided with DRAM as
    /// one capacity: the policy (see [`crate::policy::Policy::enable_tiers`])
    /// tracks every visible block over DRAM + `ssd_bytes`; DRAM's victims are
    /// spilled only while it keeps them, its evictions delete SSD copies, and
    /// spills never take the SSD past `ssd_bytes` (room is made by the same
    /// policy's order).
    pub fn enable_ssd_tiers(&mut self, min_hits: u32, policy: SpillPolicy, ssd_bytes: u64) {
        self.enable_ssd_with(min_hits, policy);
        if ssd_bytes == 0 {
            return;
        }
        self.tier.ssd_capacity = ssd_bytes;
        let visible: Vec<(BlockRef, u64)> = self
            .index
            .iter_refs()
            .filter(|(_, _, e)| !e.doomed)
            .map(|(r, _, e)| (r, e.dram_slot().map_or(e.data_bytes(), |s| s.len)))
            .collect();
        let total = self.arena.capacity().saturating_add(ssd_bytes);
        self.policy.get().enable_tiers(total, visible);
    }

    pub fn ssd_enabled(&self) -> bool {
        self.tier.enabled
    }

    /// The tiers' bookkeeping (for tests): the SSD bytes counted are those of
    /// indexed blocks with a copy or a write in flight, within the capacity;
    /// with tiers, every visible SSD-only block is ranked by the tiers' policy.
    pub fn check_tier_invariants(&self) -> Result<(), String> {
        let held: u64 = self
            .index
            .values()
            .filter(|e| e.on_ssd || e.busy == Busy::Spilling)
            .map(|e| e.data_bytes())
            .sum();
        if held != self.tier.ssd_used {
            return Err(format!(
                "SSD bytes counted {} but held {held}",
                self.tier.ssd_used
            ));
        }
        if self.tier.ssd_capacity > 0 && self.tier.ssd_used > self.tier.ssd_capacity {
            return Err(format!(
                "SSD bytes {} above the capacity {}",
                self.tier.ssd_used, self.tier.ssd_capacity
            ));
        }
        let policy = self.policy.lock();
        if policy.tiers_enabled() {
            for (r, k, e) in self.index.iter_refs() {
                if e.dram_slot().is_none() && !e.doomed && !policy.tiers_keep(&r) {
                    return Err(format!("SSD-only {k:?} is not ranked by the tiers' policy"));
                }
            }
        }
        Ok(())
    }

    /// Is another lease staging one of these blocks?
    pub(super) fn any_staging(&self, keys: &[BlockKey]) -> bool {
        keys.iter()
            .any(|k| self.index.get(k).is_some_and(|e| matches!(e.busy, Busy::Staging)))
    }

    /// Allocate staging slots for the blocks of `keys` that are SSD-only and
    /// mark them `Staging`; empty when every block is in DRAM. All or nothing:
    /// when DRAM cannot hold them all, nothing stays allocated.
    pub(super) fn stage_jobs(&mut self, keys: &[BlockKey]) -> Result<Vec<StageJob>, CacheError> {
        // A lease may name a block twice (a client can repeat a hash): one
        // read per block, or the second staging slot would replace the first
        // and leak it.
        let mut seen = HashSet::new();
        let need: Vec<BlockKey> = keys
            .iter()
            .filter(|k| self.index.get(k).is_some_and(|e| e.dram_slot().is_none()) && seen.insert(**k))
            .copied()
            .collect();
        let mut jobs = Vec::with_capacity(need.len());
        for key in need {
            let block_bytes = self.index.get(&key).map_or(0, |e| e.data_bytes());
            let Some(slot) = self.alloc_or_evict(block_bytes) else {
                for j in &jobs {
                    self.abandon_stage(j);
                }
                return Err(CacheError::NoStagingSpace { blocks: keys.len() });
            };
            let Some(tier_key) = self.tier_key(&key) else {
                self.free_slot(slot, SlotFree::StageAbandoned);
                continue;
            };
            if let Some(e) = self.index.get_mut(&key) {
                e.busy = Busy::Staging;
            }
            jobs.push(StageJob {
                key,
                tier_key,
                slot,
                block_bytes,
            });
        }
        Ok(jobs)
    }

    fn abandon_stage(&mut self, job: &StageJob) {
        if let Some(e) = self.index.get_mut(&job.key) {
            e.busy = Busy::Idle;
        }
        self.free_slot(job.slot, SlotFree::StageAbandoned);
    }

    /// A staging read finished. `ok == false` (checksum mismatch, missing or
    /// unreadable copy) dooms the block: invisible now, deleted once unpinned.
    pub fn finish_stage(&mut self, job: &StageJob, ok: bool) {
        let Some(r) = self.index.ref_of(&job.key) else {
            self.free_slot(job.slot, SlotFree::StageDiscarded);
            return;
        };
        let Some(e) = self.index.get_mut(&job.key) else {
            self.free_slot(job.slot, SlotFree::StageDiscarded);
            return;
        };
        e.busy = Busy::Idle;
        if ok && !e.doomed {
            e.set_dram_slot(job.slot);
            if e.on_ssd && self.tier.ssd_capacity > 0 {
                self.tier.staged_copies.push(job.key);
                if self.tier.staged_copies.len() > 4096 + 2 * self.policy.get().len() {
                    let index = &self.index;
                    self.tier
                        .staged_copies
                        .retain(|k| index.get(k).is_some_and(|e| e.dram_slot().is_some() && e.on_ssd));
                }
            }
            self.policy.get().insert(r, job.slot.len);
            self.counters.staged_blocks += 1;
            self.note_moved(job.key, true);
        } else {
            self.free_slot(job.slot, SlotFree::StageDiscarded);
            if !ok {
                self.counters.stage_failures += 1;
            }
            self.doom(job.key);
        }
    }

    /// Make a block invisible; it is deleted (slot and SSD copy) once unpinned and idle.
    pub(super) fn doom(&mut self, key: BlockKey) {
        let r = self.index.ref_of(&key);
        if let Some(e) = self.index.get_mut(&key) {
            if !e.doomed
                && e.dram_slot().is_some()
                && let Some(r) = r
            {
                self.policy.get().remove(&r);
            }
            let was_visible = !e.doomed;
            let in_dram = e.dram_slot().is_some();
            e.doomed = true;
            if was_visible {
                self.note_visibility(key, false, in_dram);
            }
        }
        self.reap_if_doomed(key);
    }

    pub(super) fn reap_if_doomed(&mut self, key: BlockKey) {
        let reap = self
            .index
            .get(&key)
            .is_some_and(|e| e.doomed && e.pins() == 0 && e.busy == Busy::Idle);
        if !reap {
            return;
        }
        let tier_key = self.tier_key(&key);
        if let Some(e) = self.index.remove(&key) {
            if let Some(slot) = e.dram_slot() {
                self.free_slot(slot, SlotFree::Reaped);
            }
            if e.on_ssd {
                self.tier.ssd_used = self.tier.ssd_used.saturating_sub(e.data_bytes());
                if let Some(tk) = tier_key {
                    self.tier.removals.push(tk);
                }
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::keys::{Fingerprint, NamespaceKey, NsId, SessionId};

    pub(crate) fn setup(min_hits: u32) -> (CacheState, SessionId, NsId) {
        // 4 slots of 4 KiB.
        let mut c = CacheState::new(&[4 * 4096]);
        c.enable_ssd(min_hits);
        let (s, ns) = open_ns(&mut c, 1);
        (c, s, ns)
    }

    /// Finish every spill candidate (up to 8) as written.
    pub(crate) fn spill_all(c: &mut CacheState) {
        for j in c.spill_candidates(8) {
            c.spill_done(&j, true);
        }
    }

    /// `setup(0)` with `blocks` saved and spilled, then left on SSD only by
    /// saving `fill` after them.
    pub(crate) fn ssd_only(blocks: &[BlockHash], fill: &[BlockHash]) -> (CacheState, SessionId, NsId) {
        let (mut c, s, ns) = setup(0);
        save(&mut c, s, ns, blocks);
        spill_all(&mut c);
        save(&mut c, s, ns, fill);
        (c, s, ns)
    }

    /// A new session, and a namespace of 4 KiB blocks (fingerprint `[fp; 32]`,
    /// shard 0, no salt).
    pub(crate) fn open_ns(c: &mut CacheState, fp: u8) -> (SessionId, NsId) {
        let s = c.open_session();
        let key = NamespaceKey {
            fingerprint: Fingerprint([fp; 32]),
            shard: 0,
            salt: [0; 32],
        };
        let (ns, _) = c.register_namespace(key, 4096).expect("ns");
        (s, ns)
    }

    pub(crate) fn h(i: u8) -> BlockHash {
        [i; 32]
    }

    pub(crate) fn save(c: &mut CacheState, s: SessionId, ns: NsId, hs: &[BlockHash]) {
        let (id, _) = c.begin_save(s, ns, hs).expect("begin");
        c.commit_save(s, id).expect("commit");
    }

    #[test]
    fn spilled_blocks_survive_eviction_and_stage_back() {
        let (mut c, s, ns) = setup(0);
        save(&mut c, s, ns, &[h(1), h(2)]);
        let jobs = c.spill_candidates(8);
        assert_eq!(jobs.len(), 2);
        // While spilling, the slots cannot be evicted: filling DRAM refuses instead.
        let (id, st) = c.begin_save(s, ns, &[h(3), h(4), h(5)]).expect("begin");
        assert_eq!(
            st.iter()
                .filter(|x| matches!(x, crate::SaveStatus::Refused))
                .count(),
            1
        );
        c.abort_save(s, id).expect("abort");
        for j in &jobs {
            c.spill_done(j, true);
        }
        c.check_invariants().expect("invariants");
        // Now pressure demotes them to SSD-only, still visible.
        save(&mut c, s, ns, &[h(3), h(4), h(5), h(6)]);
        assert!(c.is_visible(ns, &h(1)) && c.is_visible(ns, &h(2)));
        assert_eq!(c.gauges().ssd_only_blocks, 2);
        c.check_invariants().expect("invariants");
        // A lease on them stages them back into DRAM.
        let r = c.lookup(s, ns, &[h(1), h(2)]).expect("lookup");
        let lease = r.lease.expect("hit");
        let AcquireStep::Stage(jobs) = c.acquire(s, lease).expect("acquire") else {
            panic!("stage expected")
        };
        assert_eq!(jobs.len(), 2);
        assert!(matches!(c.acquire(s, lease).expect("again"), AcquireStep::Wait));
        for j in &jobs {
            c.finish_stage(j, true);
        }
        let AcquireStep::Ready(slots) = c.acquire(s, lease).expect("ready") else {
            panic!("ready expected")
        };
        assert_eq!(slots.len(), 2);
        c.check_invariants().expect("invariants");
        c.release(s, lease).expect("release");
    }

    #[test]
    fn lookup_counts_the_hit_blocks_that_only_ssd_holds() {
        // Saving h(3)..h(6) demotes h(1), h(2).
        let (mut c, s, ns) = ssd_only(&[h(1), h(2)], &[h(3), h(4), h(5), h(6)]);
        assert_eq!(c.gauges().ssd_only_blocks, 2);
        // DRAM-only prefix: no SSD block.
        let r = c.lookup(s, ns, &[h(5), h(6)]).expect("lookup");
        assert_eq!((r.hit_blocks, r.ssd_blocks.as_slice()), (2, &[][..]));
        c.release(s, r.lease.expect("hit")).expect("release");
        // Mixed prefix: DRAM, SSD, DRAM, SSD, then a miss.
        let r = c.lookup(s, ns, &[h(6), h(1), h(5), h(2), h(9)]).expect("lookup");
        assert_eq!((r.hit_blocks, r.ssd_blocks.as_slice()), (4, &[1, 3][..]));
        let lease = r.lease.expect("hit");
        let AcquireStep::Stage(jobs) = c.acquire(s, lease).expect("acquire") else {
            panic!("stage expected")
        };
        assert_eq!(
            jobs.len(),
            2,
            "exactly the blocks reported as SSD hits are staged"
        );
        for j in &jobs {
            c.finish_stage(j, true);
        }
        assert!(matches!(
            c.acquire(s, lease).expect("ready"),
            AcquireStep::Ready(_)
        ));
        c.release(s, lease).expect("release");
        // Staged back: the same blocks are DRAM hits now.
        let r = c.lookup(s, ns, &[h(1), h(2)]).expect("lookup");
        assert_eq!((r.hit_blocks, r.ssd_blocks.as_slice()), (2, &[][..]));
        c.release(s, r.lease.expect("hit")).expect("release");
        // A miss reports no SSD block.
        let r = c.lookup(s, ns, &[h(9)]).expect("lookup");
        assert_eq!((r.hit_blocks, r.ssd_blocks.len(), r.lease), (0, 0, None));
        c.check_invariants().expect("invariants");
    }

    #[test]
    fn a_corrupt_copy_is_lost_never_served_and_deleted() {
        let (mut c, s, ns) = ssd_only(&[h(1)], &[h(2), h(3), h(4), h(5)]); // demote h(1)
        let lease = c.lookup(s, ns, &[h(1)]).expect("lookup").lease.expect("hit");
        let AcquireStep::Stage(jobs) = c.acquire(s, lease).expect("acquire") else {
            panic!()
        };
        c.finish_stage(&jobs[0], false);
        assert!(!c.is_visible(ns, &h(1)), "corrupt block is a miss from now on");
        assert!(matches!(
            c.acquire(s, lease).expect("acquire"),
            AcquireStep::Lost { blocks: 1 }
        ));
        assert_eq!(c.take_ssd_removals().len(), 1, "its SSD copy is deleted");
        assert_eq!(c.gauges().live_leases, 0);
        c.check_invariants().expect("invariants");
    }

    #[test]
    fn a_lease_naming_an_ssd_only_block_twice_stages_it_once() {
        let (mut c, s, ns) = ssd_only(&[h(1)], &[h(2), h(3), h(4), h(5)]); // demote h(1)
        let lease = c
            .lookup(s, ns, &[h(1), h(1)])
            .expect("lookup")
            .lease
            .expect("hit");
        let AcquireStep::Stage(jobs) = c.acquire(s, lease).expect("acquire") else {
            panic!("stage expected")
        };
        assert_eq!(jobs.len(), 1, "one read per block, not per mention");
        c.check_invariants().expect("invariants while staging");
        for j in &jobs {
            c.finish_stage(j, true);
        }
        let AcquireStep::Ready(slots) = c.acquire(s, lease).expect("ready") else {
            panic!("ready expected")
        };
        assert_eq!(slots.len(), 2);
        assert_eq!(slots[0], slots[1]);
        c.release(s, lease).expect("release");
        c.check_invariants().expect("invariants");
    }
}
