//! Spilling (see `tiers.rs`): which blocks are copied from DRAM to SSD and
//! when — the [`SpillPolicy`], admission by hits on commit and on lookup, the
//! [`SpillJob`]s handed to the Manager's workers and their completion.

use super::CacheState;
use super::entries::{Busy, Entry};
use super::jobs::SpillJob;
use crate::keys::BlockKey;

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

impl CacheState {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::tiers::tests::{h, save, setup};
    use crate::keys::{BlockHash, Fingerprint, NamespaceKey};

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
}
