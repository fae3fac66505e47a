//! W-TinyLFU weighted by bytes (Einziger, Friedman & Manes, "TinyLFU: A Highly
//! Efficient Cache Admission Policy", 2017), adapted so that pinned entries are
//! skipped instead of evicted.
//!
//! New entries enter a small LRU *window*. When the cache needs room and the
//! window is over its share, the window's least recent entry (the candidate)
//! competes with main's least recent probationary entry (the victim): the one
//! the frequency sketch has seen less often leaves (ties keep the victim, which
//! has already earned its place). Main is a segmented LRU: a hit moves an entry
//! from *probation* to *protected* (80 % of main); protected overflow is demoted
//! back to probation.
//!
//! The frequency sketch is a 4-row count-min sketch of 4-bit-range counters
//! (saturating at 15) behind a *doorkeeper* bit set that absorbs each key's first
//! occurrence, so one-time keys never reach the counters. Every save and every
//! hit counts. After `sample` counted events all counters halve and the
//! doorkeeper clears (aging). The sample is a multiple of the capacity in
//! entries; a long sample remembers keys across long reuse gaps, which makes the
//! sketch a compact ghost history: a block saved again after eviction arrives
//! with its old count.
//!
//! Memory: one byte per sketch counter (4 rows × `width`) and `width` × 8 bits
//! of doorkeeper, `width` about 2× the number of entries that fit.

use std::collections::BTreeSet;
use std::hash::{BuildHasher, Hash};

use crate::map::Map;

const MAX_COUNT: u8 = 15;
const ROWS: usize = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Seg {
    Window,
    Probation,
    Protected,
}

#[derive(Debug, Clone)]
struct Meta {
    weight: u64,
    seg: Seg,
    stamp: u64,
}

/// Count-min sketch with a doorkeeper and periodic halving.
#[derive(Debug, Clone)]
pub(crate) struct FrequencySketch {
    hasher: foldhash::fast::SeedableRandomState,
    counters: Vec<u8>, // ROWS × width
    doorkeeper: Vec<u64>,
    mask: u64,
    /// Counted events since the last halving, and how many trigger one.
    events: u64,
    sample: u64,
}

impl FrequencySketch {
    /// Room for about `entries` distinct keys between halvings of `sample`
    /// events; the hash seeded by `seed` (see [`crate::map::policy_hash_state`]).
    pub(crate) fn new(entries: u64, sample: u64, seed: Option<u64>) -> Self {
        let width = (entries.max(64) * 2).next_power_of_two().min(1 << 26);
        FrequencySketch {
            hasher: crate::map::policy_hash_state(seed),
            counters: vec![0; ROWS * width as usize],
            doorkeeper: vec![0; (width as usize * 8).div_ceil(64)],
            mask: width - 1,
            events: 0,
            sample: sample.max(16),
        }
    }

    fn width(&self) -> u64 {
        self.mask + 1
    }

    fn slots<K: Hash>(&self, key: &K) -> ([usize; ROWS], [usize; 3]) {
        let h = self.hasher.hash_one(key);
        let (h1, h2) = (h & 0xffff_ffff, (h >> 32) | 1);
        let width = self.width() as usize;
        let mut rows = [0usize; ROWS];
        for (i, r) in rows.iter_mut().enumerate() {
            let col = (h1.wrapping_add((i as u64 + 1).wrapping_mul(h2)) & self.mask) as usize;
            *r = i * width + col;
        }
        let bits = self.width() * 8;
        let mut door = [0usize; 3];
        for (i, d) in door.iter_mut().enumerate() {
            *d = (h
                .rotate_left(17 * (i as u32 + 1))
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                % bits) as usize;
        }
        (rows, door)
    }

    /// How often `key` was counted (the doorkeeper's bit counts one).
    pub(crate) fn estimate<K: Hash>(&self, key: &K) -> u8 {
        let (rows, door) = self.slots(key);
        let min = rows.iter().map(|&i| self.counters[i]).min().unwrap_or(0);
        let seen = door
            .iter()
            .all(|&b| self.doorkeeper[b / 64] & (1 << (b % 64)) != 0);
        min + u8::from(seen)
    }

    /// Count one event of `key`.
    pub(crate) fn increment<K: Hash>(&mut self, key: &K) {
        let (rows, door) = self.slots(key);
        let seen = door
            .iter()
            .all(|&b| self.doorkeeper[b / 64] & (1 << (b % 64)) != 0);
        if !seen {
            for b in door {
                self.doorkeeper[b / 64] |= 1 << (b % 64);
            }
        } else {
            // Conservative update: raise only the counters at the minimum.
            let min = rows.iter().map(|&i| self.counters[i]).min().unwrap_or(0);
            if min < MAX_COUNT {
                for i in rows {
                    if self.counters[i] == min {
                        self.counters[i] += 1;
                    }
                }
            }
        }
        self.events += 1;
        if self.events >= self.sample {
            self.events = 0;
            for c in &mut self.counters {
                *c /= 2;
            }
            self.doorkeeper.iter_mut().for_each(|w| *w = 0);
        }
    }
}

#[derive(Debug, Clone)]
pub struct TinyLfu<K> {
    capacity: u64,
    window_target: u64,
    protected_target: u64,
    /// Multiple of the capacity (in entries) between sketch halvings.
    sample_x: u64,
    entries: Map<K, Meta>,
    window: BTreeSet<(u64, K)>,
    probation: BTreeSet<(u64, K)>,
    protected: BTreeSet<(u64, K)>,
    window_bytes: u64,
    protected_bytes: u64,
    total_bytes: u64,
    sketch: Option<FrequencySketch>,
    /// The sketch's hash seed (`None`: random per process).
    seed: Option<u64>,
    clock: u64,
}

impl<K: Copy + Eq + Hash + Ord> TinyLfu<K> {
    /// `window_pct`: the window's share of the capacity (1..=90); `sample_x`: the
    /// sketch's aging period as a multiple of the entries that fit.
    pub fn new(capacity_bytes: u64, window_pct: u64, sample_x: u64) -> Self {
        let capacity = capacity_bytes.max(1);
        let window_target = capacity.saturating_mul(window_pct.clamp(1, 90)) / 100;
        TinyLfu {
            capacity,
            window_target,
            protected_target: (capacity - window_target) / 5 * 4,
            sample_x: sample_x.max(1),
            entries: Map::default(),
            window: BTreeSet::new(),
            probation: BTreeSet::new(),
            protected: BTreeSet::new(),
            window_bytes: 0,
            protected_bytes: 0,
            total_bytes: 0,
            sketch: None,
            seed: None,
            clock: 0,
        }
    }

    /// Seed the sketch's hash (the same estimates in every process and run).
    pub fn seeded(mut self, seed: Option<u64>) -> Self {
        self.seed = seed;
        self
    }

    /// Approximate heap bytes: (entries with their segments, frequency sketch).
    pub fn heap_bytes(&self) -> (u64, u64) {
        use crate::map::{btree_bytes, table_bytes};
        let sets = self.window.len() + self.probation.len() + self.protected.len();
        let tracked = table_bytes::<K, Meta>(self.entries.capacity()) + btree_bytes::<(u64, K)>(sets);
        let sketch = self.sketch.as_ref().map_or(0, |s| {
            (s.counters.capacity() + s.doorkeeper.capacity() * 8) as u64
        });
        (tracked, sketch)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The weight `key` is tracked with.
    pub fn weight(&self, key: &K) -> Option<u64> {
        self.entries.get(key).map(|m| m.weight)
    }

    /// The tracked entries' weight.
    pub fn bytes(&self) -> u64 {
        self.total_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn contains(&self, key: &K) -> bool {
        self.entries.contains_key(key)
    }

    /// The sketch, sized on first use from the capacity and the first weight seen.
    fn sketch(&mut self, weight: u64) -> &mut FrequencySketch {
        let (capacity, sample_x, seed) = (self.capacity, self.sample_x, self.seed);
        self.sketch.get_or_insert_with(|| {
            let entries = (capacity / weight.max(1)).max(1);
            FrequencySketch::new(entries, entries.saturating_mul(sample_x), seed)
        })
    }

    fn frequency(&self, key: &K) -> u8 {
        self.sketch.as_ref().map_or(0, |s| s.estimate(key))
    }

    fn set_mut(&mut self, seg: Seg) -> &mut BTreeSet<(u64, K)> {
        match seg {
            Seg::Window => &mut self.window,
            Seg::Probation => &mut self.probation,
            Seg::Protected => &mut self.protected,
        }
    }

    /// Put `key` (tracked) at the most recent end of `seg`.
    fn place(&mut self, key: K, seg: Seg) {
        self.clock += 1;
        let stamp = self.clock;
        let Some(m) = self.entries.get_mut(&key) else {
            return;
        };
        let (old_seg, old_stamp, w) = (m.seg, m.stamp, m.weight);
        m.seg = seg;
        m.stamp = stamp;
        self.set_mut(old_seg).remove(&(old_stamp, key));
        self.account(old_seg, w, false);
        self.set_mut(seg).insert((stamp, key));
        self.account(seg, w, true);
    }

    fn account(&mut self, seg: Seg, w: u64, add: bool) {
        let b = match seg {
            Seg::Window => &mut self.window_bytes,
            Seg::Protected => &mut self.protected_bytes,
            Seg::Probation => return,
        };
        if add {
            *b += w;
        } else {
            *b -= w;
        }
    }

    /// Track a newly visible entry of `weight` bytes (a save: counted in the sketch).
    /// Returns `true` when the sketch had seen the key before (evidence of reuse).
    pub fn insert(&mut self, key: K, weight: u64) -> bool {
        if self.entries.contains_key(&key) {
            return false;
        }
        let sketch = self.sketch(weight);
        let seen = sketch.estimate(&key) > 0;
        sketch.increment(&key);
        self.clock += 1;
        let stamp = self.clock;
        self.entries.insert(
            key,
            Meta {
                weight,
                seg: Seg::Window,
                stamp,
            },
        );
        self.window.insert((stamp, key));
        self.window_bytes += weight;
        self.total_bytes += weight;
        seen
    }

    /// Record a hit; `false` when `key` is not tracked.
    pub fn touch(&mut self, key: &K) -> bool {
        let Some(m) = self.entries.get(key) else {
            return false;
        };
        let (seg, w) = (m.seg, m.weight);
        self.sketch(w).increment(key);
        match seg {
            Seg::Window => self.place(*key, Seg::Window),
            Seg::Probation | Seg::Protected => {
                self.place(*key, Seg::Protected);
                // Protected overflow goes back to probation (most recent end).
                while self.protected_bytes > self.protected_target {
                    let Some(&(_, k)) = self.protected.first() else {
                        break;
                    };
                    if k == *key {
                        break;
                    }
                    self.place(k, Seg::Probation);
                }
            }
        }
        true
    }

    /// Forget an entry (explicit removal, not eviction).
    pub fn remove(&mut self, key: &K) {
        if let Some(m) = self.entries.remove(key) {
            self.set_mut(m.seg).remove(&(m.stamp, *key));
            self.account(m.seg, m.weight, false);
            self.total_bytes -= m.weight;
        }
    }

    fn forget(&mut self, key: K) -> K {
        self.remove(&key);
        key
    }

    fn first_unpinned(set: &BTreeSet<(u64, K)>, pinned: &mut impl FnMut(&K) -> bool) -> Option<K> {
        set.iter().map(|&(_, k)| k).find(|k| !pinned(k))
    }

    /// Choose and forget one victim that `pinned` does not protect. `None`
    /// when every tracked entry is pinned (or nothing is tracked).
    pub fn evict_one(&mut self, mut pinned: impl FnMut(&K) -> bool) -> Option<K> {
        // Each pass either evicts or moves one window entry into probation, so the
        // loop ends within (window entries + 1) passes.
        loop {
            let main_victim = Self::first_unpinned(&self.probation, &mut pinned)
                .or_else(|| Self::first_unpinned(&self.protected, &mut pinned));
            if self.window_bytes > self.window_target
                && let Some(cand) = Self::first_unpinned(&self.window, &mut pinned)
            {
                // Main below its share takes the candidate without a contest.
                let main_bytes = self.total_bytes - self.window_bytes;
                let cand_w = self.entries.get(&cand).map_or(0, |m| m.weight);
                let Some(victim) =
                    main_victim.filter(|_| main_bytes + cand_w > self.capacity - self.window_target)
                else {
                    self.place(cand, Seg::Probation);
                    continue;
                };
                if self.frequency(&cand) > self.frequency(&victim) {
                    self.place(cand, Seg::Probation);
                    return Some(self.forget(victim));
                }
                return Some(self.forget(cand));
            }
            let victim = main_victim.or_else(|| Self::first_unpinned(&self.window, &mut pinned))?;
            return Some(self.forget(victim));
        }
    }

    /// The entries eviction would reach first for which `wanted` holds, up to
    /// `limit_bytes` of their weight: window entries past its share, probation,
    /// protected, then the rest of the window, least recent first in each.
    /// Nothing is changed.
    pub fn coldest(&self, limit_bytes: u64, wanted: impl FnMut(&K) -> bool) -> Vec<K> {
        super::walk_cold(self.cold_order(), 0, usize::MAX, limit_bytes, wanted).keys
    }

    /// Window entries past its share, probation, protected, then the rest of
    /// the window, least recent first in each (for [`Self::coldest`]).
    pub fn cold_order(&self) -> impl Iterator<Item = super::ColdItem<K>> + '_ {
        let over = self.window_bytes.saturating_sub(self.window_target);
        let mut window_bytes = 0;
        let split = self
            .window
            .iter()
            .take_while(|(_, k)| {
                window_bytes += self.entries.get(k).map_or(0, |m| m.weight);
                window_bytes <= over
            })
            .count();
        let window = self.window.iter().take(split);
        let window_rest = self.window.iter().skip(split);
        window
            .chain(self.probation.iter())
            .chain(self.protected.iter())
            .chain(window_rest)
            .map(|(_, k)| Some((*k, self.entries.get(k).map_or(0, |m| m.weight))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sketch_counts_after_the_doorkeeper_and_halves_with_age() {
        let mut s = FrequencySketch::new(1024, 100, None);
        assert_eq!(s.estimate(&7u32), 0);
        s.increment(&7u32);
        assert_eq!(s.estimate(&7u32), 1, "first sight sets the doorkeeper only");
        for _ in 0..5 {
            s.increment(&7u32);
        }
        assert_eq!(s.estimate(&7u32), 6);
        for k in 1000..1093u32 {
            s.increment(&k); // 6 + 93 = 99 events: no halving yet
        }
        assert_eq!(s.estimate(&7u32), 6);
        s.increment(&5000u32); // the 100th event: counters halve, doorkeeper clears
        assert_eq!(s.estimate(&7u32), 2);
        for _ in 0..40 {
            s.increment(&8u32);
        }
        assert_eq!(s.estimate(&8u32), MAX_COUNT + 1, "counters saturate");
    }

    #[test]
    fn a_frequent_victim_keeps_its_place_against_a_one_time_candidate() {
        // Capacity 10 entries of 10 bytes, window 10 % (one entry).
        let mut p = TinyLfu::new(100, 10, 8).seeded(Some(1)); // fixed sketch hash: no chance collisions
        for k in 0..10u32 {
            p.insert(k, 10);
        }
        for _ in 0..3 {
            for k in 0..9u32 {
                p.touch(&k);
            }
        }
        // The window holds 9 (the last insert); the rest moved to main on the
        // first eviction. A new one-time key displaces the window's least recent.
        p.insert(10, 10);
        let v = p.evict_one(|_| false).expect("victim");
        assert!(
            v == 9 || v == 10,
            "a one-time key leaves, not a frequent one: {v}"
        );
        for k in 0..9u32 {
            assert!(p.contains(&k), "frequent key {k} stays");
        }
    }

    #[test]
    fn a_candidate_seen_more_often_than_the_victim_is_admitted() {
        // Capacity 10 entries, window one entry: after 11 inserts and one eviction,
        // main holds 9 entries seen once.
        let mut p = TinyLfu::new(100, 10, 8).seeded(Some(1)); // fixed sketch hash: no chance collisions
        for k in 0..11u32 {
            p.insert(k, 10);
        }
        assert_eq!(
            p.evict_one(|_| false),
            Some(9),
            "a tie keeps main's entry: the candidate leaves"
        );
        // Key 50 was saved and evicted several times before (the sketch remembers).
        for _ in 0..4 {
            p.sketch(10).increment(&50u32);
        }
        p.insert(50, 10);
        // The window's least recent (10) loses its contest, then 50 wins its own:
        // main's least recent probationary entry (0) leaves.
        assert_eq!(p.evict_one(|_| false), Some(10));
        p.insert(51, 10);
        assert_eq!(p.evict_one(|_| false), Some(0));
        assert!(p.contains(&50));
    }

    #[test]
    fn pinned_entries_are_never_chosen_and_all_pinned_gives_none() {
        let mut p = TinyLfu::new(100, 10, 8).seeded(Some(1)); // fixed sketch hash: no chance collisions
        for k in 0..5u32 {
            p.insert(k, 20);
        }
        assert_eq!(p.evict_one(|k| *k != 3), Some(3));
        assert_eq!(p.evict_one(|_| true), None);
        assert_eq!(p.len(), 4);
        p.remove(&0);
        assert_eq!(p.len(), 3);
        assert!(!p.contains(&0));
        let order = p.coldest(u64::MAX, |_| true);
        assert_eq!(order.len(), 3);
        let mut left = Vec::new();
        while let Some(k) = p.evict_one(|_| false) {
            left.push(k);
        }
        assert_eq!(left.len(), 3);
        assert!(p.is_empty() && p.window_bytes == 0 && p.protected_bytes == 0 && p.total_bytes == 0);
    }
}
