//! Tier moves of [`CacheState`], still without I/O: which blocks to spill
//! (write-behind), staging SSD-only blocks back into DRAM for a lease,
//! *doomed* blocks (corrupt or purged: invisible at once, reaped once unpinned
//! and idle), adopting blocks recovered from disk at start, and an outbox of
//! SSD copies the Manager must delete. The Manager's workers do the reads and
//! writes and report back through `spill_done` / `finish_stage`. Calls down
//! into `entries` and `registry` only; the lease that asked for a stage is
//! `leases`' business.
//!
//! Who deletes an SSD copy? Only the Manager, and only keys taken from
//! [`CacheState::take_ssd_removals`] or granted by [`CacheState::ssd_droppable`].

use std::collections::{HashMap, HashSet, VecDeque};

use super::entries::{Busy, Entry, SlotFree};
use super::{CacheError, CacheState};
use crate::keys::{BlockHash, BlockKey, NamespaceKey, NsId, Slot, TierKey};

/// Copy `slot` (holding `block_bytes` of data) to SSD under `tier_key`.
#[derive(Debug, Clone, Copy)]
pub struct SpillJob {
    pub key: BlockKey,
    pub tier_key: TierKey,
    pub slot: Slot,
    pub block_bytes: u64,
}

/// Read the SSD copy of `tier_key` into `slot`.
#[derive(Debug, Clone, Copy)]
pub struct StageJob {
    pub key: BlockKey,
    pub tier_key: TierKey,
    pub slot: Slot,
    pub block_bytes: u64,
}

/// What `acquire` needs next.
#[derive(Debug, Clone)]
pub enum AcquireStep {
    /// Every block is in DRAM: copy from these slots.
    Ready(Vec<Slot>),
    /// Read these SSD copies, report with `finish_stage`, then acquire again.
    Stage(Vec<StageJob>),
    /// Another lease is staging one of these blocks: wait, then acquire again.
    Wait,
    /// A block was found corrupt (or purged) meanwhile; the lease was retired.
    Lost { blocks: usize },
}

/// When blocks are copied to SSD.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SpillPolicy {
    /// Only blocks about to be evicted: once free DRAM falls under 1/8 of the
    /// arena, the coldest blocks (that eviction would reach first) are spilled,
    /// so eviction demotes them instead of dropping them. Blocks that live and
    /// die in DRAM never cost an SSD write.
    #[default]
    Evict,
    /// Every admitted block as soon as it qualifies (write-behind): more SSD
    /// writes, but a restarted Manager recovers everything that was admitted.
    Eager,
}

/// The block's SSD copy must stay: I/O in flight, or a lease will read it from SSD.
fn tier_pinned(e: &Entry) -> bool {
    e.busy != Busy::Idle || (e.dram_slot().is_none() && e.pins() > 0)
}

#[derive(Debug, Default)]
pub(super) struct TierState {
    enabled: bool,
    policy: SpillPolicy,
    min_hits: u32,
    /// SSD bytes the tiers may hold (0: not told; the store's own limit rules).
    ssd_capacity: u64,
    /// SSD bytes held or being written by indexed blocks.
    ssd_used: u64,
    spill_queue: VecDeque<BlockKey>,
    /// Blocks staged back into DRAM whose SSD copy was kept (newest last):
    /// the first copies to go when the SSD needs room, as DRAM holds them.
    staged_copies: Vec<BlockKey>,
    /// Recovered SSD blocks whose namespace has not registered yet:
    /// namespace → (generation, hash, block bytes).
    dormant: HashMap<NamespaceKey, Vec<(u64, BlockHash, u64)>>,
    removals: Vec<TierKey>,
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
        let visible: Vec<(BlockKey, u64)> = self
            .index
            .iter()
            .filter(|(_, e)| !e.doomed)
            .map(|(k, e)| (*k, e.dram_slot().map_or(e.data_bytes(), |s| s.len)))
            .collect();
        let total = self.arena.capacity().saturating_add(ssd_bytes);
        self.policy.get().enable_tiers(total, visible);
    }

    /// SSD bytes held or being written, as the tiers count them.
    pub fn ssd_used_bytes(&self) -> u64 {
        self.tier.ssd_used
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
            for (k, e) in &self.index {
                if e.dram_slot().is_none() && !e.doomed && !policy.tiers_keep(k) {
                    return Err(format!("SSD-only {k:?} is not ranked by the tiers' policy"));
                }
            }
        }
        Ok(())
    }

    /// Evict from the tiers' policy until it fits its capacity (DRAM + SSD).
    fn trim_tiers(&mut self) {
        while self.policy.get().tiers_excess() > 0 {
            let index = &self.index;
            let pinned = |k: &BlockKey| index.get(k).is_some_and(tier_pinned);
            let Some(victim) = self.policy.get().tiers_evict_one(pinned) else {
                break;
            };
            self.tiers_drop(victim);
        }
    }

    /// Room for `bytes` more on SSD within `ssd_capacity`, deleting the copies
    /// the tiers' policy values least. `false` when none can go.
    fn ssd_reserve(&mut self, bytes: u64) -> bool {
        if self.tier.ssd_capacity == 0 {
            self.tier.ssd_used += bytes;
            return true;
        }
        while self.tier.ssd_used.saturating_add(bytes) > self.tier.ssd_capacity {
            if !self.ssd_free_one() {
                return false;
            }
        }
        self.tier.ssd_used += bytes;
        true
    }

    /// The SSD store is full (its per-block overhead exceeds what the tiers
    /// count): up to `n` copies the Manager may delete now, in the tiers'
    /// order (see [`Self::ssd_free_one`]). Empty without tiers.
    pub fn ssd_make_room(&mut self, n: usize) -> Vec<TierKey> {
        let before = self.tier.removals.len();
        if self.policy.get().tiers_enabled() {
            for _ in 0..n {
                if !self.ssd_free_one() {
                    break;
                }
            }
        }
        self.tier.removals.split_off(before)
    }

    /// Delete one SSD copy (queued in `removals`): first a copy of a block
    /// staged back into DRAM (nothing is lost until DRAM evicts it, and then it
    /// is spilled again if the tiers still keep it), else the copy the tiers'
    /// policy values least. `false` when no copy can go.
    fn ssd_free_one(&mut self) -> bool {
        while let Some(k) = self.tier.staged_copies.pop() {
            let tier_key = self.tier_key(&k);
            if let Some(e) = self.index.get_mut(&k)
                && e.dram_slot().is_some()
                && e.on_ssd
                && !tier_pinned(e)
            {
                e.on_ssd = false;
                self.tier.ssd_used = self.tier.ssd_used.saturating_sub(e.data_bytes());
                self.counters.ssd_dropped_blocks += 1;
                if let Some(tk) = tier_key {
                    self.tier.removals.push(tk);
                }
                return true;
            }
        }
        let index = &self.index;
        // Blocks without an SSD copy free nothing: they stay.
        let pinned = |k: &BlockKey| index.get(k).is_none_or(|e| tier_pinned(e) || !e.on_ssd);
        let Some(victim) = self.policy.get().tiers_evict_one(pinned) else {
            return false;
        };
        self.tiers_drop(victim);
        true
    }

    /// The tiers' policy evicted `key`: its SSD copy goes; an SSD-only block
    /// stops being visible, a DRAM-resident one stays until DRAM evicts it.
    fn tiers_drop(&mut self, key: BlockKey) {
        let tier_key = self.tier_key(&key);
        let Some(e) = self.index.get_mut(&key) else {
            return;
        };
        if !e.on_ssd || tier_pinned(e) {
            return;
        }
        e.on_ssd = false;
        self.tier.ssd_used = self.tier.ssd_used.saturating_sub(e.data_bytes());
        self.counters.ssd_dropped_blocks += 1;
        if e.dram_slot().is_none() {
            let was_visible = !e.doomed;
            self.index.remove(&key);
            if was_visible {
                self.note_visibility(key, false);
            }
        }
        if let Some(tk) = tier_key {
            self.tier.removals.push(tk);
        }
    }

    pub fn ssd_enabled(&self) -> bool {
        self.tier.enabled
    }

    /// A block became visible. `readmitted`: DRAM evicted it recently and it is
    /// saved again — it was reused after all, which counts as one hit (so the
    /// hit-based admission also catches reuse distances longer than DRAM).
    pub(super) fn note_committed(&mut self, k: BlockKey, readmitted: bool) {
        if !self.tier.enabled {
            return;
        }
        let hits = u32::from(readmitted);
        if let Some(e) = self.index.get_mut(&k) {
            e.set_hits(hits);
        }
        if hits >= self.tier.min_hits && self.tier.policy == SpillPolicy::Eager {
            self.tier.spill_queue.push_back(k);
        }
    }

    /// Does this hit (the entry's count now `hits`) make the block due for an
    /// eager spill? (It just reached `--ssd-admit-hits`.)
    pub(super) fn due_on_hit(&self, e: &Entry, hits: u32) -> bool {
        let t = &self.tier;
        t.enabled && t.min_hits > 0 && t.policy == SpillPolicy::Eager && hits == t.min_hits && !e.on_ssd
    }

    /// Queue a block [`Self::due_on_hit`] found due (still DRAM-only).
    pub(super) fn queue_spill_on_hit(&mut self, k: BlockKey) {
        if self.index.get(&k).is_some_and(|e| !e.on_ssd) {
            self.tier.spill_queue.push_back(k);
        }
    }

    /// Up to `max` blocks to copy to SSD. Each is marked busy (its DRAM slot
    /// cannot be freed) until [`Self::spill_done`].
    pub fn spill_candidates(&mut self, max: usize) -> Vec<SpillJob> {
        if self.tier.enabled && self.tier.policy == SpillPolicy::Evict {
            let low_water = self.arena.capacity() * 3 / 16;
            // The queue only ever holds this call's view of the cold end.
            self.tier.spill_queue.clear();
            self.trim_tiers();
            if self.arena.free_bytes() < low_water {
                let min_hits = self.tier.min_hits;
                let index = &self.index;
                let policy: &crate::policy::Policy<BlockKey> = self.policy.get();
                // Only blocks that qualify count towards the low-water bytes: with
                // `min_hits` > 0 the cold end is mostly unhit blocks, and stopping at
                // them would spill nothing. With tiers, only blocks the two tiers
                // together keep qualify. Blocks already on SSD count (they are the
                // cold end too) but need no spill: otherwise every call would reach
                // deeper, and all of DRAM would end up copied.
                let eligible =
                    |k: &BlockKey| index.get(k).is_some_and(|e| e.hits() >= min_hits) && policy.tiers_keep(k);
                let cold = policy.coldest(low_water, eligible);
                // Blocks with evidence of reuse (hit, or saved again soon after an
                // eviction) first: when the disk falls behind, DRAM evicts the
                // rest of the cold end unspilled, and the evidence decides what
                // the slow disk holds. With a disk that keeps up, all are spilled.
                let (mut reused, once): (Vec<BlockKey>, Vec<BlockKey>) = cold
                    .into_iter()
                    .filter(|k| self.index.get(k).is_some_and(|e| !e.on_ssd))
                    .partition(|k| self.index.get(k).is_some_and(|e| e.hits() > 0));
                reused.extend(once);
                self.tier.spill_queue.extend(reused);
            }
        }
        let mut jobs = Vec::new();
        while jobs.len() < max {
            let Some(key) = self.tier.spill_queue.pop_front() else {
                break;
            };
            let Some(tier_key) = self.tier_key(&key) else {
                continue;
            };
            let Some(e) = self.index.get(&key) else {
                continue;
            };
            let (Some(slot), false, Busy::Idle, false) = (e.dram_slot(), e.on_ssd, e.busy, e.doomed) else {
                continue;
            };
            if !self.policy.get().tiers_keep(&key) {
                continue; // the two tiers together gave it up since it was queued
            }
            if !self.ssd_reserve(e.data_bytes()) {
                self.tier.spill_queue.clear(); // the SSD is full of blocks valued more
                break;
            }
            let Some(e) = self.index.get_mut(&key) else {
                continue;
            };
            e.busy = Busy::Spilling;
            jobs.push(SpillJob {
                key,
                tier_key,
                slot,
                block_bytes: e.data_bytes(),
            });
        }
        jobs
    }

    pub fn pending_spills(&self) -> usize {
        self.tier.spill_queue.len()
    }

    /// A spill finished; `ok` when the SSD copy is durable.
    pub fn spill_done(&mut self, job: &SpillJob, ok: bool) {
        match self.index.get_mut(&job.key) {
            Some(e) if e.busy == Busy::Spilling => {
                e.busy = Busy::Idle;
                if ok {
                    e.on_ssd = true;
                    self.counters.spilled_blocks += 1;
                } else {
                    self.tier.ssd_used = self.tier.ssd_used.saturating_sub(e.data_bytes());
                    self.counters.spill_failures += 1;
                }
                self.reap_if_doomed(job.key);
            }
            _ => {
                self.tier.ssd_used = self.tier.ssd_used.saturating_sub(job.block_bytes);
                if ok {
                    self.tier.removals.push(job.tier_key);
                }
            }
        }
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
            self.policy.get().insert(job.key, job.slot.len);
            self.counters.staged_blocks += 1;
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
        if let Some(e) = self.index.get_mut(&key) {
            if !e.doomed && e.dram_slot().is_some() {
                self.policy.get().remove(&key);
            }
            let was_visible = !e.doomed;
            e.doomed = true;
            if was_visible {
                self.note_visibility(key, false);
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

    /// The SSD tier is full and proposes these (least recently used) copies;
    /// returns those the Manager may delete now. Blocks that lose their only
    /// copy leave the index; pinned SSD-only blocks and blocks with I/O in
    /// flight are kept.
    pub fn ssd_droppable(&mut self, proposed: &[TierKey]) -> Vec<TierKey> {
        let mut ok = Vec::new();
        for tk in proposed {
            let Some(ns) = self.ns_id(&tk.ns) else {
                self.forget_dormant(tk);
                ok.push(*tk);
                continue;
            };
            let key = BlockKey {
                ns,
                generation: tk.generation,
                hash: tk.hash,
            };
            let Some(e) = self.index.get_mut(&key) else {
                ok.push(*tk);
                continue;
            };
            if e.busy != Busy::Idle || !e.on_ssd || (e.dram_slot().is_none() && e.pins() > 0) {
                continue;
            }
            e.on_ssd = false;
            self.tier.ssd_used = self.tier.ssd_used.saturating_sub(e.data_bytes());
            if e.dram_slot().is_none() {
                let was_visible = !e.doomed;
                self.index.remove(&key);
                if was_visible {
                    self.note_visibility(key, false);
                }
            }
            self.counters.ssd_dropped_blocks += 1;
            ok.push(*tk);
        }
        ok
    }

    /// SSD copies to delete (purged generations, corrupt blocks, rejected at adoption).
    pub fn take_ssd_removals(&mut self) -> Vec<TierKey> {
        std::mem::take(&mut self.tier.removals)
    }

    /// Blocks found on disk at start. They stay dormant until their namespace
    /// registers; generations only move forward.
    pub fn adopt_recovered(&mut self, items: impl IntoIterator<Item = (TierKey, u64)>) {
        for (tk, len) in items {
            self.restore_generation(tk.ns.fingerprint, tk.generation);
            self.tier
                .dormant
                .entry(tk.ns)
                .or_default()
                .push((tk.generation, tk.hash, len));
        }
        let registered: Vec<NsId> = self.namespaces.keys().copied().collect();
        for ns in registered {
            self.adopt_dormant(ns);
        }
    }

    /// Make dormant blocks of `ns` visible: only the current generation and
    /// the registered block size qualify; the rest is queued for deletion.
    pub(super) fn adopt_dormant(&mut self, ns: NsId) {
        let Some(info) = self.namespaces.get(&ns).cloned() else {
            return;
        };
        let Some(items) = self.tier.dormant.remove(&info.key) else {
            return;
        };
        let current = self.generations.get(&info.key.fingerprint).copied().unwrap_or(0);
        for (generation, hash, len) in items {
            let key = BlockKey { ns, generation, hash };
            let tk = TierKey {
                ns: info.key,
                generation,
                hash,
            };
            if generation == current && len == info.block_bytes && !self.index.contains_key(&key) {
                self.index.insert(key, Entry::on_ssd_only(len));
                self.note_visibility(key, true);
                self.policy.get().tiers_insert(key, len);
                self.tier.ssd_used += len;
                self.counters.ssd_adopted_blocks += 1;
            } else {
                self.tier.removals.push(tk);
                self.counters.ssd_rejected_blocks += 1;
            }
        }
    }

    fn forget_dormant(&mut self, tk: &TierKey) {
        if let Some(v) = self.tier.dormant.get_mut(&tk.ns) {
            v.retain(|(g, h, _)| !(*g == tk.generation && *h == tk.hash));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{Fingerprint, NamespaceKey, SessionId};
    use crate::{AcquireStep, CacheState};

    fn setup(min_hits: u32) -> (CacheState, SessionId, NsId) {
        // 4 slots of 4 KiB.
        let mut c = CacheState::new(&[4 * 4096]);
        c.enable_ssd(min_hits);
        let s = c.open_session();
        let key = NamespaceKey {
            fingerprint: Fingerprint([1; 32]),
            shard: 0,
            salt: [0; 32],
        };
        let (ns, _) = c.register_namespace(key, 4096).expect("ns");
        (c, s, ns)
    }

    fn h(i: u8) -> BlockHash {
        [i; 32]
    }

    fn save(c: &mut CacheState, s: SessionId, ns: NsId, hs: &[BlockHash]) {
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
        let (mut c, s, ns) = setup(0);
        save(&mut c, s, ns, &[h(1), h(2)]);
        for j in c.spill_candidates(8) {
            c.spill_done(&j, true);
        }
        save(&mut c, s, ns, &[h(3), h(4), h(5), h(6)]); // demotes h(1), h(2)
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
        let (mut c, s, ns) = setup(0);
        save(&mut c, s, ns, &[h(1)]);
        for j in c.spill_candidates(8) {
            c.spill_done(&j, true);
        }
        save(&mut c, s, ns, &[h(2), h(3), h(4), h(5)]); // demote h(1)
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
    fn recovered_blocks_adopt_only_matching_namespace_generation_and_size() {
        let mut c = CacheState::new(&[4 * 4096]);
        let key = NamespaceKey {
            fingerprint: Fingerprint([1; 32]),
            shard: 0,
            salt: [0; 32],
        };
        c.restore_generation(key.fingerprint, 2);
        c.adopt_recovered([
            (
                TierKey {
                    ns: key,
                    generation: 2,
                    hash: h(1),
                },
                4096,
            ),
            (
                TierKey {
                    ns: key,
                    generation: 1,
                    hash: h(2),
                },
                4096,
            ), // stale generation
            (
                TierKey {
                    ns: key,
                    generation: 2,
                    hash: h(3),
                },
                8192,
            ), // other block size
        ]);
        assert_eq!(c.gauges().dormant_ssd_blocks, 3);
        let (ns, generation) = c.register_namespace(key, 4096).expect("ns");
        assert_eq!(generation, 2);
        assert!(c.is_visible(ns, &h(1)));
        assert!(!c.is_visible(ns, &h(2)) && !c.is_visible(ns, &h(3)));
        assert_eq!(c.take_ssd_removals().len(), 2);
        assert_eq!(
            (c.counters().ssd_adopted_blocks, c.counters().ssd_rejected_blocks),
            (1, 2)
        );
        c.check_invariants().expect("invariants");
    }

    #[test]
    fn generation_bump_deletes_ssd_copies_even_mid_spill() {
        let (mut c, s, ns) = setup(0);
        save(&mut c, s, ns, &[h(1), h(2)]);
        let jobs = c.spill_candidates(1);
        for j in c.spill_candidates(8) {
            c.spill_done(&j, true);
        }
        c.bump_generation(ns).expect("bump");
        assert!(!c.is_visible(ns, &h(1)) && !c.is_visible(ns, &h(2)));
        assert_eq!(c.take_ssd_removals().len(), 1, "the finished spill's copy");
        c.spill_done(&jobs[0], true); // the in-flight spill lands after the purge
        assert_eq!(c.take_ssd_removals().len(), 1, "and is deleted too");
        assert_eq!(c.gauges().visible_blocks, 0);
        c.check_invariants().expect("invariants");
    }

    #[test]
    fn hit_admission_spills_blocks_reused_after_eviction() {
        let (mut c, s, ns) = setup(1);
        save(&mut c, s, ns, &[h(1)]);
        assert!(c.spill_candidates(8).is_empty(), "never hit: not admitted");
        save(&mut c, s, ns, &[h(2), h(3), h(4), h(5)]); // h(1) evicted unhit → ghost
        assert!(!c.is_visible(ns, &h(1)));
        let _ = c.spill_candidates(8);
        save(&mut c, s, ns, &[h(1)]); // saved again: it was reused after all
        let jobs = c.spill_candidates(8);
        assert!(
            jobs.iter().any(|j| j.key.hash == h(1)),
            "readmission counts as a hit"
        );
        for j in &jobs {
            c.spill_done(j, true);
        }
        c.check_invariants().expect("invariants");
    }

    #[test]
    fn evict_policy_with_hit_admission_spills_the_coldest_hit_blocks_behind_unhit_ones() {
        // 16 slots (low water 2), LRU order so the cold end is easy to arrange: six
        // unhit blocks are colder than the two hit ones. The unhit ones do not qualify
        // (`min_hits` 1); the spill must still reach the hit blocks behind them.
        let mut c = CacheState::with_policy(&[16 * 4096], crate::policy::PolicyKind::Lru);
        c.enable_ssd_with(1, SpillPolicy::Evict);
        let s = c.open_session();
        let key = NamespaceKey {
            fingerprint: Fingerprint([1; 32]),
            shard: 0,
            salt: [0; 32],
        };
        let (ns, _) = c.register_namespace(key, 4096).expect("ns");
        save(&mut c, s, ns, &(1..=8).map(h).collect::<Vec<_>>());
        let lease = c
            .lookup(s, ns, &[h(1), h(2)])
            .expect("lookup")
            .lease
            .expect("hit");
        c.release(s, lease).expect("release");
        save(&mut c, s, ns, &(9..=15).map(h).collect::<Vec<_>>()); // one slot left
        let jobs = c.spill_candidates(8);
        let mut spilled: Vec<BlockHash> = jobs.iter().map(|j| j.key.hash).collect();
        spilled.sort();
        assert_eq!(
            spilled,
            vec![h(1), h(2)],
            "the qualifying cold blocks, and only them"
        );
        for j in &jobs {
            c.spill_done(j, true);
        }
        c.check_invariants().expect("invariants");
    }

    #[test]
    fn ssd_full_drops_only_unpinned_copies() {
        let (mut c, s, ns) = setup(0);
        save(&mut c, s, ns, &[h(1), h(2)]);
        for j in c.spill_candidates(8) {
            c.spill_done(&j, true);
        }
        save(&mut c, s, ns, &[h(3), h(4), h(5), h(6)]); // both SSD-only now
        let lease = c.lookup(s, ns, &[h(1)]).expect("lookup").lease.expect("hit");
        let tks: Vec<TierKey> = [h(1), h(2)]
            .iter()
            .map(|x| {
                c.tier_key(&BlockKey {
                    ns,
                    generation: 0,
                    hash: *x,
                })
                .expect("tk")
            })
            .collect();
        let ok = c.ssd_droppable(&tks);
        assert_eq!(ok, vec![tks[1]], "the leased SSD-only block keeps its copy");
        assert!(c.is_visible(ns, &h(1)) && !c.is_visible(ns, &h(2)));
        c.release(s, lease).expect("release");
        c.check_invariants().expect("invariants");
    }

    #[test]
    fn a_lease_naming_an_ssd_only_block_twice_stages_it_once() {
        let (mut c, s, ns) = setup(0);
        save(&mut c, s, ns, &[h(1)]);
        for j in c.spill_candidates(8) {
            c.spill_done(&j, true);
        }
        save(&mut c, s, ns, &[h(2), h(3), h(4), h(5)]); // demote h(1)
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
