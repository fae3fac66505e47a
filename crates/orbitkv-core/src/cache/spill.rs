//! Spilling (see `tiers.rs`): which blocks are copied from DRAM to SSD and
//! when — the [`SpillPolicy`], admission by hits on commit and on lookup, the
//! [`SpillJob`]s handed to the Manager's workers and their completion.

use super::concurrent::HotCounters;
use super::entries::{Busy, Entry};
use super::jobs::SpillJob;
use super::{BlockRef, CacheState};
use crate::keys::BlockKey;

/// A walk of DRAM's cold end made in steps of at most `WALK_STEP` positions
/// (below), so that a large DRAM never holds the cache lock for a whole walk.
#[derive(Debug)]
pub(super) struct SpillWalk {
    /// The policy's cold orders, in listing order, and the one being walked.
    pub(super) orders: Vec<usize>,
    pub(super) at: usize,
    /// Positions of the current order already walked, and the weight listed.
    pub(super) skip: usize,
    pub(super) bytes: u64,
    /// Blocks the first order listed, when there are more (each block is
    /// listed once).
    pub(super) first: std::collections::HashSet<BlockKey>,
    /// Listed blocks not on SSD yet, with a hit and without, in listing order.
    pub(super) reused: Vec<BlockKey>,
    pub(super) once: Vec<BlockKey>,
    /// How many blocks were listed (on SSD or not).
    pub(super) listed: u64,
    /// The cache's change count when the walk began.
    pub(super) stamp: u64,
}

/// A plan of the `evict` policy's spill queue that listed at most this many
/// blocks is made again at every call: such a walk takes a few milliseconds.
const CHEAP_WALK: u64 = 4096;

/// Positions of DRAM's cold end one call walks at most (~8 ms at a million
/// resident blocks); a longer walk continues at the next calls.
const WALK_STEP: usize = 8192;

/// Larger plans are made again after changes of 1/this of what they listed
/// (see `spill_plan_due`).
const REPLAN_DIVISOR: u64 = 16;

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
        // Saved again after an eviction counts one hit for the remote tier too.
        if self.remote.due_at(hits) && self.remote.push(&[k]) > 0 {
            HotCounters::add(&self.hot.remote_due_dropped, 1);
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
    ///
    /// With the `evict` policy the queue is a plan: the cold end of DRAM in the
    /// order eviction reaches it, listed by a walk over up to 3/16 of the arena
    /// (the cost grows with DRAM: ~0.2 s at a million resident blocks). A call
    /// walks again only when the plan is due ([`Self::spill_plan_due`]); other
    /// calls take from the queue, checking each block again as they go.
    pub fn spill_candidates(&mut self, max: usize) -> Vec<SpillJob> {
        if self.tier.enabled && self.tier.policy == SpillPolicy::Evict {
            self.trim_tiers();
            let low_water = self.arena.capacity() * 3 / 16;
            if self.arena.free_bytes() >= low_water {
                // No pressure: nothing is about to be evicted.
                self.tier.spill_queue.clear();
                self.tier.last_plan = None;
                self.tier.walk = None;
            } else {
                if self.tier.walk.is_none() && self.spill_plan_due() {
                    self.tier.walk = Some(SpillWalk {
                        orders: self.policy.get().cold_orders(),
                        at: 0,
                        skip: 0,
                        bytes: 0,
                        first: std::collections::HashSet::new(),
                        reused: Vec::new(),
                        once: Vec::new(),
                        listed: 0,
                        stamp: self.spill_stamp(),
                    });
                }
                self.step_spill_walk(low_water);
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
            let Some((r, e)) = self.index.get_ref(&key) else {
                continue;
            };
            let (Some(slot), false, Busy::Idle, false) = (e.dram_slot(), e.on_ssd, e.busy, e.doomed) else {
                continue;
            };
            if !self.policy.get().tiers_keep(&r) {
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
            self.tier.spilling += 1;
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

    /// Spills handed out by [`Self::spill_candidates`] and not yet reported by
    /// [`Self::spill_done`]: DRAM slots that become evictable once they end (an
    /// acquire that found no staging space may wait for them).
    pub fn spills_in_flight(&self) -> usize {
        self.tier.spilling
    }

    /// A walk of DRAM's cold end is under way (`evict` policy): the next
    /// [`Self::spill_candidates`] calls continue it, so the worker should make
    /// them without waiting.
    pub fn spill_walk_in_progress(&self) -> bool {
        self.tier.walk.is_some()
    }

    /// Blocks committed, evicted or demoted (evicted with an SSD copy) so far:
    /// what moves the cold end of DRAM. (Hits reorder it too, but only an
    /// eviction, which only a commit causes, can lose a block before its spill.)
    fn spill_stamp(&self) -> u64 {
        self.counters.blocks_committed + self.counters.evictions + self.counters.demotions
    }

    /// Is a new walk of the cold end due? Always while the cold end is small
    /// (the last plan listed at most [`CHEAP_WALK`] blocks: the walk costs little,
    /// and one request's saves can move a small cold end by more than its depth).
    /// Otherwise: never planned; or, with the queue drained, once the blocks
    /// committed, evicted or demoted since reach 1/[`REPLAN_DIVISOR`] of what the
    /// plan listed; with blocks still queued, once they also reach the queue's
    /// length (the plan is stale by then). The nearest a new block starts from
    /// eviction in any policy kind is W-TinyLFU's window, 1/100 of DRAM; 1/16 of
    /// the cold end (3/16 of DRAM) in changes, which come about two per new
    /// block, is 0.6 % of DRAM in new blocks, so the next walk finds it in time,
    /// while walks cost at most 16 block visits per change.
    fn spill_plan_due(&self) -> bool {
        let Some((at, listed)) = self.tier.last_plan else {
            return true;
        };
        if listed <= CHEAP_WALK {
            return true;
        }
        let changed = self.spill_stamp().saturating_sub(at);
        let enough = listed / REPLAN_DIVISOR;
        if self.tier.spill_queue.is_empty() {
            changed >= enough
        } else {
            changed >= enough.max(self.tier.spill_queue.len() as u64)
        }
    }

    /// A spill finished; `ok` when the SSD copy is durable.
    pub fn spill_done(&mut self, job: &SpillJob, ok: bool) {
        self.tier.spilling = self.tier.spilling.saturating_sub(1);
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

    /// Walks on along the cold end of DRAM, at most [`WALK_STEP`] positions,
    /// sorting what it lists as it goes; once every cold order is walked, the
    /// listed blocks become the spill queue (replacing it). Until then the queue
    /// keeps serving the last plan. No step costs more than its positions.
    fn step_spill_walk(&mut self, low_water: u64) {
        let Some(mut w) = self.tier.walk.take() else {
            return;
        };
        let min_hits = self.tier.min_hits;
        let index = &self.index;
        let policy: &crate::policy::Policy<BlockRef> = self.policy.get();
        // Only blocks that qualify count towards the low-water bytes: with
        // `min_hits` > 0 the cold end is mostly unhit blocks, and stopping at
        // them would spill nothing. With tiers, only blocks the two tiers
        // together keep qualify. Blocks already on SSD count (they are the
        // cold end too) but need no spill: otherwise every call would reach
        // deeper, and all of DRAM would end up copied.
        let eligible = |r: &BlockRef| {
            index.by_ref(*r).is_some_and(|(_, e)| e.hits() >= min_hits) && policy.tiers_keep(r)
        };
        let mut budget = WALK_STEP;
        while budget > 0 && w.at < w.orders.len() {
            let c = policy.coldest_step(
                w.orders[w.at],
                w.skip,
                budget,
                low_water.saturating_sub(w.bytes),
                eligible,
            );
            budget -= c.visited;
            w.skip += c.visited;
            w.bytes += c.bytes;
            let more_orders = w.orders.len() > 1;
            for r in c.keys {
                let Some((&k, e)) = index.by_ref(r) else {
                    continue;
                };
                // `duel`: the other order's cold end after the leader's, each block once.
                if w.at > 0 && w.first.contains(&k) {
                    continue;
                }
                if w.at == 0 && more_orders {
                    w.first.insert(k);
                }
                w.listed += 1;
                // Blocks with evidence of reuse (hit, or saved again soon after an
                // eviction) first: when the disk falls behind, DRAM evicts the
                // rest of the cold end unspilled, and the evidence decides what
                // the slow disk holds. With a disk that keeps up, all are spilled.
                match (e.on_ssd, e.hits() > 0) {
                    (true, _) => {}
                    (false, true) => w.reused.push(k),
                    (false, false) => w.once.push(k),
                }
            }
            if c.end {
                w.at += 1;
                w.skip = 0;
                w.bytes = 0;
            }
        }
        if w.at < w.orders.len() {
            self.tier.walk = Some(w);
            return;
        }
        let SpillWalk {
            mut reused,
            once,
            listed,
            stamp,
            ..
        } = w;
        reused.extend(once);
        self.tier.spill_queue = reused.into();
        self.tier.last_plan = Some((stamp, listed));
        self.counters.spill_plans += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::tiers::tests::{h, open_ns, save, setup, spill_all};
    use crate::keys::BlockHash;

    #[test]
    fn generation_bump_deletes_ssd_copies_even_mid_spill() {
        let (mut c, s, ns) = setup(0);
        save(&mut c, s, ns, &[h(1), h(2)]);
        let jobs = c.spill_candidates(1);
        spill_all(&mut c);
        c.bump_generation(ns).expect("bump");
        assert!(!c.is_visible(ns, &h(1)) && !c.is_visible(ns, &h(2)));
        assert_eq!(c.take_ssd_removals().len(), 1, "the finished spill's copy");
        c.spill_done(&jobs[0], true); // the in-flight spill lands after the purge
        assert_eq!(c.take_ssd_removals().len(), 1, "and is deleted too");
        assert_eq!(c.gauges().visible_blocks, 0);
        c.check_invariants().expect("invariants");
    }

    fn wide(i: u32) -> BlockHash {
        let mut b = [0u8; 32];
        b[..4].copy_from_slice(&i.to_le_bytes());
        b[31] = 0xAB;
        b
    }

    /// An LRU cache of `slots` 4 KiB slots with an SSD tier (`evict` policy),
    /// filled with blocks `wide(0..slots)`, coldest first.
    fn filled_lru_tier(slots: u32) -> (CacheState, crate::cache::SessionId, crate::NsId, Vec<BlockHash>) {
        let mut c = CacheState::with_policy(&[u64::from(slots) * 4096], crate::policy::PolicyKind::Lru);
        c.enable_ssd_with(0, SpillPolicy::Evict);
        let (s, ns) = open_ns(&mut c, 2);
        let all: Vec<BlockHash> = (0..slots).map(wide).collect();
        for chunk in all.chunks(4096) {
            save(&mut c, s, ns, chunk);
        }
        (c, s, ns, all)
    }

    #[test]
    fn the_evict_plan_is_walked_again_only_when_due() {
        // 32,768 slots (cold end 6,144, above CHEAP_WALK): filled, the plan lists
        // the cold end once; draining it 64 blocks per call walks nothing more,
        // nor do idle calls; 1/16 of the listed blocks in changes (commits and
        // the evictions or demotions they cause) makes the next walk due.
        let slots = 32_768u32;
        let (mut c, s, ns, all) = filled_lru_tier(slots);
        let mut spilled = Vec::new();
        loop {
            let jobs = c.spill_candidates(64);
            if jobs.is_empty() {
                break;
            }
            for j in jobs {
                spilled.push(j.key.hash);
                c.spill_done(&j, true);
            }
        }
        assert_eq!(c.counters().spill_plans, 1, "one walk for the whole cold end");
        assert_eq!(spilled.len(), 6_144, "the coldest 3/16");
        assert_eq!(spilled, all[..6_144].to_vec(), "coldest first");
        for _ in 0..10 {
            assert!(c.spill_candidates(64).is_empty());
        }
        assert_eq!(c.counters().spill_plans, 1, "idle calls walk nothing");
        let few: Vec<BlockHash> = (slots..slots + 100).map(wide).collect();
        save(&mut c, s, ns, &few); // 200 changes < 6,144 / 16
        let _ = c.spill_candidates(64);
        assert_eq!(c.counters().spill_plans, 1, "not due yet");
        let more: Vec<BlockHash> = (slots + 100..slots + 300).map(wide).collect();
        save(&mut c, s, ns, &more); // 600 changes in all
        let jobs = c.spill_candidates(64);
        assert_eq!(
            c.counters().spill_plans,
            2,
            "due after 1/16 of the listed blocks changed"
        );
        assert!(!jobs.is_empty(), "the newly cold blocks");
        for j in &jobs {
            c.spill_done(j, true);
        }
        c.check_invariants().expect("invariants");
    }

    #[test]
    fn a_long_walk_is_made_over_several_calls() {
        // 65,536 slots: the cold end (12,288 blocks) is longer than one call's
        // WALK_STEP, so the first call walks part of it and spills nothing yet;
        // the second completes the plan and spills the coldest blocks.
        let slots = 65_536u32;
        let (mut c, _, _, all) = filled_lru_tier(slots);
        assert!(c.spill_candidates(64).is_empty(), "the walk is not complete yet");
        assert_eq!(c.counters().spill_plans, 0);
        let jobs = c.spill_candidates(64);
        assert_eq!(c.counters().spill_plans, 1);
        let got: Vec<BlockHash> = jobs.iter().map(|j| j.key.hash).collect();
        assert_eq!(got, all[..64].to_vec(), "coldest first");
        for j in &jobs {
            c.spill_done(j, true);
        }
        assert_eq!(c.pending_spills(), 12_288 - 64);
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
        let (s, ns) = open_ns(&mut c, 1);
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
