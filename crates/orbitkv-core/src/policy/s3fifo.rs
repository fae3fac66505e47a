//! S3-FIFO eviction weighted by bytes (Yang et al., SOSP'23), adapted so that
//! pinned entries are skipped instead of evicted.
//!
//! Three queues: a small FIFO (~10 % of the byte capacity) for new entries, a
//! main FIFO for entries that were hit while in the small queue, and a ghost
//! FIFO of recently evicted keys; a key found in the ghost is admitted straight
//! to main. Queues hold `(key, seq)` and are cleaned lazily: an element is live
//! only while the entry's current `seq` matches.

use std::collections::VecDeque;
use std::hash::Hash;

use crate::map::Map;

const MAX_FREQ: u8 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queue {
    Small,
    Main,
}

#[derive(Debug, Clone)]
struct Meta {
    weight: u64,
    freq: u8,
    queue: Queue,
    seq: u64,
}

#[derive(Debug, Clone)]
pub struct S3Fifo<K> {
    capacity: u64,
    /// Ghost history, in bytes of the keys it remembers (default: 90 % of capacity).
    ghost_limit: u64,
    /// The small queue's target size in bytes (default 10 % of capacity).
    small_target: u64,
    /// Adapt `small_target` to ghost hits (ARC's rule): a key evicted from the
    /// small queue that comes back grows it, one evicted from main that comes
    /// back shrinks it. Main evictions are then remembered in the ghost too.
    adaptive: bool,
    small: VecDeque<(K, u64)>,
    main: VecDeque<(K, u64)>,
    ghost: VecDeque<(K, u64, u64)>,
    ghost_index: Map<K, (u64, Queue)>, // key -> (ghost seq, queue it was evicted from)
    entries: Map<K, Meta>,
    small_bytes: u64,
    main_bytes: u64,
    ghost_bytes: u64,
    next_seq: u64,
}

impl<K: Copy + Eq + Hash> S3Fifo<K> {
    pub fn new(capacity_bytes: u64) -> Self {
        Self::with_ghost(capacity_bytes, capacity_bytes - capacity_bytes / 10)
    }

    /// Like [`S3Fifo::new`] with a ghost history of `ghost_bytes` (keys of that much
    /// evicted weight are remembered; a longer history catches longer reuse gaps).
    pub fn with_ghost(capacity_bytes: u64, ghost_bytes: u64) -> Self {
        Self::tuned(capacity_bytes, 10, ghost_bytes)
    }

    /// Adaptive: the small queue's size follows ghost hits (see `adaptive`).
    pub fn adaptive(capacity_bytes: u64, ghost_bytes: u64) -> Self {
        let mut p = Self::tuned(capacity_bytes, 10, ghost_bytes);
        p.adaptive = true;
        p
    }

    /// Fully parameterised: the small queue's share of the capacity in percent
    /// (1..=90) and the ghost history in bytes.
    pub fn tuned(capacity_bytes: u64, small_pct: u64, ghost_bytes: u64) -> Self {
        let capacity = capacity_bytes.max(1);
        S3Fifo {
            capacity,
            ghost_limit: ghost_bytes,
            small_target: capacity.saturating_mul(small_pct.clamp(1, 90)) / 100,
            adaptive: false,
            small: VecDeque::new(),
            main: VecDeque::new(),
            ghost: VecDeque::new(),
            ghost_index: Map::default(),
            entries: Map::default(),
            small_bytes: 0,
            main_bytes: 0,
            ghost_bytes: 0,
            next_seq: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Move the small queue's target to `small_pct` percent of the capacity
    /// (1..=90); the queues drift to it through later evictions.
    pub fn set_small_pct(&mut self, small_pct: u64) {
        self.small_target = self.capacity.saturating_mul(small_pct.clamp(1, 90)) / 100;
    }

    /// The weight `key` is tracked with.
    pub fn weight(&self, key: &K) -> Option<u64> {
        self.entries.get(key).map(|m| m.weight)
    }

    /// The tracked entries' weight.
    pub fn bytes(&self) -> u64 {
        self.small_bytes + self.main_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn contains(&self, key: &K) -> bool {
        self.entries.contains_key(key)
    }

    /// Track a newly visible entry of `weight` bytes.
    /// Returns `true` when the key came back from the ghost queue: it was
    /// evicted recently and is being inserted again (evidence of reuse).
    pub fn insert(&mut self, key: K, weight: u64) -> bool {
        if self.entries.contains_key(&key) {
            return false;
        }
        let seq = self.bump_seq();
        let ghost = self.ghost_index.remove(&key);
        let readmitted = ghost.is_some();
        if self.adaptive {
            let (lo, hi) = (self.capacity / 20, self.capacity / 2);
            match ghost {
                Some((_, Queue::Small)) => self.small_target = (self.small_target + weight).min(hi),
                Some((_, Queue::Main)) => {
                    self.small_target = self.small_target.saturating_sub(weight).max(lo)
                }
                None => {}
            }
        }
        let queue = if readmitted { Queue::Main } else { Queue::Small };
        self.entries.insert(
            key,
            Meta {
                weight,
                freq: 0,
                queue,
                seq,
            },
        );
        match queue {
            Queue::Small => {
                self.small.push_back((key, seq));
                self.small_bytes += weight;
            }
            Queue::Main => {
                self.main.push_back((key, seq));
                self.main_bytes += weight;
            }
        }
        readmitted
    }

    /// Record a hit; `false` when `key` is not tracked.
    pub fn touch(&mut self, key: &K) -> bool {
        let Some(m) = self.entries.get_mut(key) else {
            return false;
        };
        m.freq = (m.freq + 1).min(MAX_FREQ);
        true
    }

    /// Forget an entry (explicit removal, not eviction: no ghost).
    pub fn remove(&mut self, key: &K) {
        if let Some(m) = self.entries.remove(key) {
            match m.queue {
                Queue::Small => self.small_bytes -= m.weight,
                Queue::Main => self.main_bytes -= m.weight,
            }
        }
        self.compact_if_sparse();
    }

    /// Choose and forget one victim that `pinned` does not protect. `None`
    /// when every tracked entry is pinned (or nothing is tracked).
    pub fn evict_one(&mut self, mut pinned: impl FnMut(&K) -> bool) -> Option<K> {
        // Each live element can be rotated at most MAX_FREQ+1 times in main and
        // once from small to main before it is either evicted or proven pinned.
        let mut budget = (self.small.len() + self.main.len()) * (MAX_FREQ as usize + 3) + 8;
        while budget > 0 {
            budget -= 1;
            let from_small =
                !self.small.is_empty() && (self.small_bytes >= self.small_target || self.main.is_empty());
            let (key, seq) = if from_small {
                self.small.pop_front()?
            } else {
                self.main.pop_front()?
            };
            let Some(meta) = self.entries.get_mut(&key) else {
                continue; // stale
            };
            if meta.seq != seq {
                continue; // stale
            }
            if pinned(&key) {
                if from_small {
                    self.small.push_back((key, seq));
                } else {
                    self.main.push_back((key, seq));
                }
                continue;
            }
            if from_small {
                if meta.freq > 0 {
                    meta.freq = 0;
                    meta.queue = Queue::Main;
                    let w = meta.weight;
                    self.small_bytes -= w;
                    self.main_bytes += w;
                    self.main.push_back((key, seq));
                    continue;
                }
                let w = meta.weight;
                self.entries.remove(&key);
                self.small_bytes -= w;
                self.add_ghost(key, w, Queue::Small);
                return Some(key);
            }
            if meta.freq > 0 {
                meta.freq -= 1;
                self.main.push_back((key, seq));
                continue;
            }
            let w = meta.weight;
            self.entries.remove(&key);
            self.main_bytes -= w;
            if self.adaptive {
                self.add_ghost(key, w, Queue::Main);
            }
            return Some(key);
        }
        None
    }

    /// The coldest entries for which `wanted` holds, in the order eviction would
    /// reach them, up to `limit_bytes` of their weight: unhit entries at the front
    /// of the small queue, then unhit entries at the front of main (hit entries
    /// would be promoted or given another round first). Nothing is changed.
    pub fn coldest(&self, limit_bytes: u64, mut wanted: impl FnMut(&K) -> bool) -> Vec<K> {
        let mut out = Vec::new();
        let mut bytes = 0;
        for (k, seq) in self.small.iter().chain(self.main.iter()) {
            if bytes >= limit_bytes {
                break;
            }
            if let Some(m) = self
                .entries
                .get(k)
                .filter(|m| m.seq == *seq && m.freq == 0 && wanted(k))
            {
                bytes += m.weight;
                out.push(*k);
            }
        }
        out
    }

    fn add_ghost(&mut self, key: K, weight: u64, from: Queue) {
        let seq = self.bump_seq();
        self.ghost.push_back((key, seq, weight));
        self.ghost_index.insert(key, (seq, from));
        self.ghost_bytes += weight;
        while self.ghost_bytes > self.ghost_limit {
            let Some((k, s, w)) = self.ghost.pop_front() else {
                break;
            };
            self.ghost_bytes -= w;
            if self.ghost_index.get(&k).is_some_and(|(gs, _)| *gs == s) {
                self.ghost_index.remove(&k);
            }
        }
    }

    fn bump_seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }

    /// Drop stale queue elements once they dominate, so explicit removals
    /// (generation purges) do not leave the queues growing without bound.
    fn compact_if_sparse(&mut self) {
        let live = self.entries.len();
        if self.small.len() + self.main.len() > 2 * live + 1024 {
            let entries = &self.entries;
            let alive = |(k, s): &(K, u64)| entries.get(k).is_some_and(|m| m.seq == *s);
            self.small.retain(alive);
            self.main.retain(alive);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_hit_wonders_leave_before_reused_entries() {
        let mut p = S3Fifo::new(100);
        for k in 0..10u32 {
            p.insert(k, 10);
        }
        p.touch(&3);
        p.touch(&3);
        // First victims are the untouched small-queue entries in FIFO order.
        assert_eq!(p.evict_one(|_| false), Some(0));
        assert_eq!(p.evict_one(|_| false), Some(1));
        assert_eq!(p.evict_one(|_| false), Some(2));
        // 3 was promoted to main, so 4 goes next.
        assert_eq!(p.evict_one(|_| false), Some(4));
        assert!(p.contains(&3));
    }

    #[test]
    fn ghost_hit_goes_to_main() {
        let mut p = S3Fifo::new(100);
        p.insert(1u32, 10);
        assert_eq!(p.evict_one(|_| false), Some(1));
        p.insert(1, 10);
        p.insert(2, 10);
        // 1 re-entered through the ghost into main; 2 is in small and is the
        // victim while small is over its share.
        assert_eq!(p.evict_one(|_| false), Some(2));
    }

    #[test]
    fn adaptive_small_queue_follows_the_ghost_hits_within_its_bounds() {
        // Capacity 1000, small target starts at 100 (10 %), bounds 50..=500.
        let mut p = S3Fifo::adaptive(1000, 1000);
        assert_eq!(p.small_target, 100);
        // Keys evicted from small that come back grow the small queue by their weight.
        for k in 0..20u32 {
            p.insert(k, 50);
        }
        let mut evicted = Vec::new();
        while p.small_bytes + p.main_bytes > 500 {
            evicted.push(p.evict_one(|_| false).expect("victim"));
        }
        for k in &evicted {
            p.insert(*k, 50);
        }
        assert_eq!(
            p.small_target, 500,
            "grew by 50 per return, capped at half the capacity"
        );
        // Returned keys sit in main; evict them from main and bring them back: it shrinks.
        for k in 100..120u32 {
            p.insert(k, 50);
        }
        let mut from_main = Vec::new();
        for _ in 0..30 {
            let k = p.evict_one(|_| false).expect("victim");
            if evicted.contains(&k) {
                from_main.push(k);
            }
        }
        assert!(!from_main.is_empty(), "main evicted some of the returned keys");
        let before = p.small_target;
        for k in &from_main {
            p.insert(*k, 50);
        }
        assert_eq!(p.small_target, (before - 50 * from_main.len() as u64).max(50));
    }

    #[test]
    fn pinned_entries_are_never_chosen() {
        let mut p = S3Fifo::new(100);
        for k in 0..5u32 {
            p.insert(k, 20);
        }
        let pinned = |k: &u32| *k != 4;
        assert_eq!(p.evict_one(pinned), Some(4));
        assert_eq!(p.evict_one(|_| true), None);
        assert_eq!(p.len(), 4);
    }

    #[test]
    fn removed_then_reinserted_is_not_evicted_twice() {
        let mut p = S3Fifo::new(100);
        p.insert(1u32, 10);
        p.remove(&1);
        p.insert(1, 10);
        assert_eq!(p.evict_one(|_| false), Some(1));
        assert_eq!(p.evict_one(|_| false), None);
    }
}
