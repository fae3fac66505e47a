//! Retention hints: blocks an application said will return by a deadline
//! (*kept*) or will not return (*done*). Held blocks leave the inner policies
//! (DRAM's and the tiers'), so those never pick them; [`super::Policy`] asks
//! this table for victims before (done) and after (kept) the inner policies.
//!
//! - **Kept** blocks are never evicted while anything else is evictable. Their
//!   bytes are capped ([`Retention::set_cap`]); a keep over the cap displaces
//!   only its *own owner's* kept block expected back last, never another
//!   owner's, and only when that block's deadline is later than the new one
//!   (the block expected back last is worth least: Belady's rule among kept
//!   blocks). At its deadline a kept block returns to the inner policies as a
//!   block that was referenced again: inserted, then touched once for the
//!   hint and once per hit while kept (up to 3), so a hot shared prefix that a
//!   hint kept for a while comes back hot, not as a newcomer.
//! - **Done** blocks leave first, deepest block of a chain first. A hit on a
//!   done block (another request still uses it) returns it to the inner
//!   policies as a hit.
//!
//! This type only keeps the books; it never frees anything.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::Hash;

/// What a held block is held as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// Expected back by `until_ms` (the caller's clock); `owner` is the
    /// namespace whose request kept it.
    Keep { until_ms: u64, owner: u32 },
    /// Not expected back.
    Done,
}

/// One held block: its hold, weight, and which inner policies it was taken
/// from (and returns to).
#[derive(Debug, Clone, Copy)]
pub(super) struct Held {
    pub(super) hold: Hold,
    pub(super) weight: u64,
    pub(super) in_dram: bool,
    pub(super) in_tiers: bool,
    /// Hits while held (saturating), told to the inner policies on release.
    pub(super) hits: u8,
}

/// Counts and gauges of retention hints, exported as metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionStats {
    /// Blocks held as kept / done now, and the kept bytes.
    pub kept_blocks: u64,
    pub kept_bytes: u64,
    pub done_blocks: u64,
    /// The cap on kept bytes (0: hints are off).
    pub cap_bytes: u64,
    /// Blocks a keep hint applied to / a done hint applied to.
    pub kept_total: u64,
    pub done_total: u64,
    /// Keep hints not applied: the owner's kept bytes were at the cap with
    /// nothing of its own expected back later.
    pub refused_total: u64,
    /// Kept blocks released by their deadline.
    pub expired_total: u64,
    /// Kept blocks released to make room for their owner's earlier-due keep.
    pub displaced_total: u64,
    /// Kept blocks evicted from DRAM because nothing else was evictable.
    pub kept_evicted_total: u64,
    /// Done blocks evicted from DRAM before anything else.
    pub done_evicted_total: u64,
    /// Done blocks hit again (returned to the inner policies).
    pub done_revived_total: u64,
}

#[derive(Debug, Clone)]
pub(super) struct Retention<K> {
    held: HashMap<K, Held>,
    /// Kept blocks by deadline (expiry takes the front, pressure the back).
    by_deadline: BTreeSet<(u64, K)>,
    /// Done blocks resident in DRAM / tracked by the tiers, in eviction order;
    /// entries no longer matching are skipped when reached.
    done_dram: VecDeque<K>,
    done_tiers: VecDeque<K>,
    kept_by_owner: HashMap<u32, u64>,
    /// Held blocks resident in DRAM, and the weight of those the tiers track.
    dram_len: usize,
    tiers_bytes: u64,
    cap_bytes: u64,
    stats: RetentionStats,
}

impl<K: Copy + Eq + Hash + Ord> Retention<K> {
    pub(super) fn new() -> Self {
        Retention {
            held: HashMap::new(),
            by_deadline: BTreeSet::new(),
            done_dram: VecDeque::new(),
            done_tiers: VecDeque::new(),
            kept_by_owner: HashMap::new(),
            dram_len: 0,
            tiers_bytes: 0,
            cap_bytes: 0,
            stats: RetentionStats::default(),
        }
    }

    pub(super) fn set_cap(&mut self, bytes: u64) {
        self.cap_bytes = bytes;
    }

    pub(super) fn cap(&self) -> u64 {
        self.cap_bytes
    }

    pub(super) fn stats(&self) -> RetentionStats {
        RetentionStats {
            cap_bytes: self.cap_bytes,
            ..self.stats
        }
    }

    /// How `key` is held, if it is (no hash computed while nothing is held: the
    /// common case of a Manager whose clients send no hints).
    pub(super) fn get(&self, key: &K) -> Option<&Held> {
        if self.held.is_empty() {
            return None;
        }
        self.held.get(key)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    pub(super) fn dram_len(&self) -> usize {
        self.dram_len
    }

    pub(super) fn tiers_bytes(&self) -> u64 {
        self.tiers_bytes
    }

    pub(super) fn heap_bytes(&self) -> u64 {
        let k = std::mem::size_of::<K>() as u64;
        self.held.capacity() as u64 * (k + std::mem::size_of::<Held>() as u64 + 8)
            + self.by_deadline.len() as u64 * (k + 8) * 2
            + (self.done_dram.capacity() + self.done_tiers.capacity()) as u64 * k
    }

    /// The earliest deadline of a kept block.
    pub(super) fn next_deadline(&self) -> Option<u64> {
        self.by_deadline.first().map(|(t, _)| *t)
    }

    /// Bytes `owner` keeps now.
    pub(super) fn kept_of(&self, owner: u32) -> u64 {
        self.kept_by_owner.get(&owner).copied().unwrap_or(0)
    }

    /// Bytes kept by every owner.
    pub(super) fn kept_bytes(&self) -> u64 {
        self.stats.kept_bytes
    }

    /// `owner`'s kept block expected back last, if its deadline is after `until_ms`.
    pub(super) fn displaceable(&self, owner: u32, until_ms: u64) -> Option<K> {
        self.by_deadline
            .iter()
            .rev()
            .take_while(|(t, _)| *t > until_ms)
            .find(|(_, k)| matches!(self.held.get(k), Some(h) if matches!(h.hold, Hold::Keep { owner: o, .. } if o == owner)))
            .map(|(_, k)| *k)
    }

    /// Start holding `key` (not held now).
    pub(super) fn hold(&mut self, key: K, h: Held) {
        debug_assert!(!self.held.contains_key(&key));
        if h.in_dram {
            self.dram_len += 1;
        }
        if h.in_tiers {
            self.tiers_bytes += h.weight;
        }
        self.held.insert(key, h);
        self.enter(key, h);
    }

    /// Change the hold of a held block (keep ↔ done, a later deadline).
    pub(super) fn rehold(&mut self, key: K, hold: Hold) {
        let Some(h) = self.held.get(&key).copied() else {
            return;
        };
        self.leave(key, h);
        let h = Held { hold, ..h };
        self.held.insert(key, h);
        self.enter(key, h);
    }

    /// Stop holding `key`; what it was held as.
    pub(super) fn take(&mut self, key: &K) -> Option<Held> {
        let h = self.held.remove(key)?;
        if h.in_dram {
            self.dram_len -= 1;
        }
        if h.in_tiers {
            self.tiers_bytes -= h.weight;
        }
        self.leave(*key, h);
        Some(h)
    }

    /// A held block became DRAM-resident (staged back) or left DRAM; it is
    /// dropped when it is then in neither place. Returns whether it is held.
    pub(super) fn set_in_dram(&mut self, key: &K, in_dram: bool) -> bool {
        if self.held.is_empty() {
            return false;
        }
        let Some(h) = self.held.get_mut(key) else {
            return false;
        };
        if h.in_dram != in_dram {
            h.in_dram = in_dram;
            if in_dram {
                self.dram_len += 1;
                if h.hold == Hold::Done {
                    self.done_dram.push_back(*key);
                }
            } else {
                self.dram_len -= 1;
            }
        }
        self.drop_if_untracked(key);
        true
    }

    /// A hit on a held block, remembered for its release.
    pub(super) fn hit(&mut self, key: &K) {
        if let Some(h) = self.held.get_mut(key) {
            h.hits = h.hits.saturating_add(1);
        }
    }

    /// The tiers stop tracking a held block.
    pub(super) fn clear_in_tiers(&mut self, key: &K) {
        if let Some(h) = self.held.get_mut(key)
            && h.in_tiers
        {
            h.in_tiers = false;
            self.tiers_bytes -= h.weight;
        }
        self.drop_if_untracked(key);
    }

    fn drop_if_untracked(&mut self, key: &K) {
        if self.held.get(key).is_some_and(|h| !h.in_dram && !h.in_tiers) {
            self.take(key);
        }
    }

    /// The first done block resident in DRAM that `pinned` does not protect.
    pub(super) fn done_victim_dram(&mut self, pinned: &mut impl FnMut(&K) -> bool) -> Option<K> {
        Self::done_victim(&self.held, &mut self.done_dram, |h| h.in_dram, pinned)
    }

    /// The first done block the tiers track that `pinned` does not protect.
    pub(super) fn done_victim_tiers(&mut self, pinned: &mut impl FnMut(&K) -> bool) -> Option<K> {
        Self::done_victim(&self.held, &mut self.done_tiers, |h| h.in_tiers, pinned)
    }

    fn done_victim(
        held: &HashMap<K, Held>,
        queue: &mut VecDeque<K>,
        here: impl Fn(&Held) -> bool,
        pinned: &mut impl FnMut(&K) -> bool,
    ) -> Option<K> {
        let live = |k: &K| held.get(k).is_some_and(|h| h.hold == Hold::Done && here(h));
        while queue.front().is_some_and(|k| !live(k)) {
            queue.pop_front();
        }
        let i = queue.iter().position(|k| live(k) && !pinned(k))?;
        queue.remove(i)
    }

    /// The kept block expected back last that `here` accepts and `pinned`
    /// does not protect (eviction under pressure).
    pub(super) fn kept_victim(
        &self,
        here: impl Fn(&Held) -> bool,
        pinned: &mut impl FnMut(&K) -> bool,
    ) -> Option<K> {
        self.by_deadline
            .iter()
            .rev()
            .map(|(_, k)| *k)
            .find(|k| self.held.get(k).is_some_and(&here) && !pinned(k))
    }

    /// Kept blocks whose deadline is at or before `now_ms`, removed from the
    /// deadline order (the caller takes and releases each).
    pub(super) fn due(&self, now_ms: u64) -> Vec<K> {
        self.by_deadline
            .iter()
            .take_while(|(t, _)| *t <= now_ms)
            .map(|(_, k)| *k)
            .collect()
    }

    pub(super) fn count(&mut self) -> &mut RetentionStats {
        &mut self.stats
    }

    fn enter(&mut self, key: K, h: Held) {
        match h.hold {
            Hold::Keep { until_ms, owner } => {
                self.by_deadline.insert((until_ms, key));
                *self.kept_by_owner.entry(owner).or_default() += h.weight;
                self.stats.kept_blocks += 1;
                self.stats.kept_bytes += h.weight;
            }
            Hold::Done => {
                if h.in_dram {
                    self.done_dram.push_back(key);
                }
                if h.in_tiers {
                    self.done_tiers.push_back(key);
                }
                self.stats.done_blocks += 1;
            }
        }
    }

    fn leave(&mut self, key: K, h: Held) {
        match h.hold {
            Hold::Keep { until_ms, owner } => {
                self.by_deadline.remove(&(until_ms, key));
                if let Some(b) = self.kept_by_owner.get_mut(&owner) {
                    *b -= h.weight;
                    if *b == 0 {
                        self.kept_by_owner.remove(&owner);
                    }
                }
                self.stats.kept_blocks -= 1;
                self.stats.kept_bytes -= h.weight;
            }
            // Its queue entries are skipped when reached.
            Hold::Done => self.stats.done_blocks -= 1,
        }
    }
}
