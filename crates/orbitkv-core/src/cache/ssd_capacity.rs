//! The SSD capacity side of the tiers (see `tiers.rs`): the SSD bytes the
//! tiers count and their budget, making room in the tiers' policy order,
//! dropping SSD copies (the Manager's proposals included) and the outbox of
//! SSD copies the Manager must delete.

use super::CacheState;
use super::entries::{Busy, Entry};
use crate::keys::{BlockKey, TierKey};
use crate::table::BlockRef;

/// The block's SSD copy must stay: I/O in flight, or a lease will read it from SSD.
fn tier_pinned(e: &Entry) -> bool {
    e.busy != Busy::Idle || (e.dram_slot().is_none() && e.pins() > 0)
}

impl CacheState {
    /// SSD bytes held or being written, as the tiers count them.
    pub fn ssd_used_bytes(&self) -> u64 {
        self.tier.ssd_used
    }

    /// Evict from the tiers' policy until it fits its capacity (DRAM + SSD).
    pub(super) fn trim_tiers(&mut self) {
        while self.policy.get().tiers_excess() > 0 {
            let index = &self.index;
            let pinned = |r: &BlockRef| index.by_ref(*r).is_some_and(|(_, e)| tier_pinned(e));
            let Some(victim) = self.policy.get().tiers_evict_one(pinned) else {
                break;
            };
            self.tiers_drop(victim);
        }
    }

    /// Room for `bytes` more on SSD within `ssd_capacity`, deleting the copies
    /// the tiers' policy values least. `false` when none can go.
    pub(super) fn ssd_reserve(&mut self, bytes: u64) -> bool {
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
        let pinned = |r: &BlockRef| index.by_ref(*r).is_none_or(|(_, e)| tier_pinned(e) || !e.on_ssd);
        let Some(victim) = self.policy.get().tiers_evict_one(pinned) else {
            return false;
        };
        self.tiers_drop(victim);
        true
    }

    /// The tiers' policy evicted `r`: its SSD copy goes; an SSD-only block
    /// stops being visible, a DRAM-resident one stays until DRAM evicts it.
    fn tiers_drop(&mut self, r: BlockRef) {
        let Some((&key, _)) = self.index.by_ref(r) else {
            return;
        };
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
            if was_visible {
                self.note_visibility(key, false, false);
            }
            self.index.remove(&key);
        }
        if let Some(tk) = tier_key {
            self.tier.removals.push(tk);
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
                if was_visible {
                    self.note_visibility(key, false, false);
                }
                self.index.remove(&key);
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::tiers::tests::{h, ssd_only};

    #[test]
    fn ssd_full_drops_only_unpinned_copies() {
        // Both SSD-only once h(3)..h(6) are saved.
        let (mut c, s, ns) = ssd_only(&[h(1), h(2)], &[h(3), h(4), h(5), h(6)]);
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
}
