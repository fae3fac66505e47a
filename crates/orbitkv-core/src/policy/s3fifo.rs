//! S3-FIFO eviction weighted by bytes (Yang et al., SOSP'23), adapted so that
//! pinned entries are skipped instead of evicted.
//!
//! Three queues: a small FIFO (~10 % of the byte capacity) for new entries, a
//! main FIFO for entries that were hit while in the small queue, and a ghost
//! FIFO of recently evicted keys; a key found in the ghost is admitted straight
//! to main. Entries live in a slab; the small and main queues hold
//! `(slot, seq)` and are cleaned lazily: an element is live only while the
//! slot's current `seq` matches (a freed slot's is 0), so walking them hashes
//! no key.
//!
//! Optionally ([`S3Fifo::with_recency`]) the same entries are also threaded on
//! a recency list, so they can leave in LRU order instead: `Duel` runs S3-FIFO
//! and LRU over one set of blocks with one map lookup per hit.

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hash};

use super::ghost::Ghost;
use super::slab::{List, Slab};
use crate::table::SlotTable;

const MAX_FREQ: u8 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queue {
    Small,
    Main,
}

/// One tracked entry.
#[derive(Debug, Clone)]
struct Slot<K> {
    key: K,
    /// At most `u32::MAX` (blocks are at most 1 GiB): 8 bytes less per slot.
    weight: u32,
    /// The entry's queue element's seq; 0 while the slot is free.
    seq: u64,
    freq: u8,
    queue: Queue,
    /// A value the owner keeps with the entry (`Duel`: the key's sample hash).
    tag: u64,
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
    small: VecDeque<(usize, u64)>,
    main: VecDeque<(usize, u64)>,
    /// Evicted keys by their 64-bit ghost hash, oldest first (see `ghost.rs`).
    /// A hash instead of the key (48 bytes for a `BlockKey`): the ghost
    /// remembers several times more keys than are resident, and two keys would
    /// merge only on a 64-bit collision under a per-process random hash (which
    /// at worst admits one key to main).
    ghost: Ghost,
    /// Hashes keys for `entries` and the ghost history (per process, random).
    hasher: foldhash::fast::RandomState,
    /// Key → its slot in `slots` (the slot holds the key; see `table.rs`).
    entries: SlotTable,
    slots: Slab<Slot<K>>,
    /// Keep the recency list ([`S3Fifo::with_recency`]).
    recency: bool,
    /// Least recently inserted or hit first.
    order: List,
    small_bytes: u64,
    main_bytes: u64,
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
            ghost: Ghost::default(),
            hasher: foldhash::fast::RandomState::default(),
            entries: SlotTable::default(),
            slots: Slab::new(),
            recency: false,
            order: List::EMPTY,
            small_bytes: 0,
            main_bytes: 0,
            next_seq: 0,
        }
    }

    /// Also keep the entries' recency, for [`S3Fifo::evict_least_recent`] and
    /// [`S3Fifo::coldest_by_recency`]: a list move per insert and hit.
    pub fn with_recency(mut self) -> Self {
        self.recency = true;
        self
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Approximate heap bytes: (tracked entries with their queues, ghost history).
    pub fn heap_bytes(&self) -> (u64, u64) {
        use crate::map::vec_bytes;
        let tracked = self.entries.heap_bytes()
            + self.slots.heap_bytes()
            + vec_bytes::<(usize, u64)>(self.small.capacity() + self.main.capacity());
        (tracked, self.ghost.heap_bytes())
    }

    /// Room for `n` entries (and the ghost history their weight implies)
    /// without growing a table under load.
    pub fn reserve(&mut self, n: usize) {
        self.entries.reserve(n);
        self.slots.reserve(n);
        let ghost_x = self.ghost_limit.div_ceil(self.capacity);
        self.ghost
            .reserve(n.saturating_mul(usize::try_from(ghost_x).unwrap_or(usize::MAX)));
    }

    /// Move the small queue's target to `small_pct` percent of the capacity
    /// (1..=90); the queues drift to it through later evictions.
    pub fn set_small_pct(&mut self, small_pct: u64) {
        self.small_target = self.capacity.saturating_mul(small_pct.clamp(1, 90)) / 100;
    }

    /// The weight `key` is tracked with.
    pub fn weight(&self, key: &K) -> Option<u64> {
        self.slot_of(key).map(|i| u64::from(self.slots[i].weight))
    }

    /// The tracked entries' weight.
    pub fn bytes(&self) -> u64 {
        self.small_bytes + self.main_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.entries.len() == 0
    }

    pub fn contains(&self, key: &K) -> bool {
        self.slot_of(key).is_some()
    }

    /// The slot tracking `key`.
    fn slot_of(&self, key: &K) -> Option<usize> {
        let slots = &self.slots;
        self.entries
            .get(self.hasher.hash_one(key), |i| slots[i].key == *key)
    }

    /// Take `key` (tracked in slot `i`) out of `entries`; its hash.
    fn unindex(&mut self, key: &K, i: usize) -> u64 {
        let h = self.hasher.hash_one(key);
        self.entries.remove(h, |s| s == i);
        h
    }

    /// Track a newly visible entry of `weight` bytes.
    /// Returns `true` when the key came back from the ghost queue: it was
    /// evicted recently and is being inserted again (evidence of reuse).
    pub fn insert(&mut self, key: K, weight: u64) -> bool {
        self.insert_tagged(key, weight, 0)
    }

    /// [`S3Fifo::insert`], keeping `tag` with the entry ([`S3Fifo::touch_tagged`]
    /// returns it).
    pub fn insert_tagged(&mut self, key: K, weight: u64, tag: u64) -> bool {
        let weight32 = u32::try_from(weight).unwrap_or(u32::MAX);
        let weight = u64::from(weight32);
        let h = self.hasher.hash_one(key);
        let slots = &self.slots;
        if self.entries.get(h, |i| slots[i].key == key).is_some() {
            return false;
        }
        let seq = self.bump_seq();
        let ghost = self
            .ghost
            .take(h)
            .map(|main| if main { Queue::Main } else { Queue::Small });
        let readmitted = ghost.is_some();
        if self.adaptive {
            let (lo, hi) = (self.capacity / 20, self.capacity / 2);
            match ghost {
                Some(Queue::Small) => self.small_target = (self.small_target + weight).min(hi),
                Some(Queue::Main) => self.small_target = self.small_target.saturating_sub(weight).max(lo),
                None => {}
            }
        }
        let queue = if readmitted { Queue::Main } else { Queue::Small };
        let slot = Slot {
            key,
            weight: weight32,
            seq,
            freq: 0,
            queue,
            tag,
        };
        let i = self.slots.put(slot);
        self.entries.insert(h, i);
        match queue {
            Queue::Small => {
                enqueue(&mut self.small, (i, seq));
                self.small_bytes += weight;
            }
            Queue::Main => {
                enqueue(&mut self.main, (i, seq));
                self.main_bytes += weight;
            }
        }
        if self.recency {
            self.order.push_last(&mut self.slots, i);
        }
        readmitted
    }

    /// Record a hit; `false` when `key` is not tracked.
    pub fn touch(&mut self, key: &K) -> bool {
        self.touch_tagged(key).is_some()
    }

    /// Record a hit; the entry's weight and tag, `None` when it is not tracked.
    pub fn touch_tagged(&mut self, key: &K) -> Option<(u64, u64)> {
        let i = self.slot_of(key)?;
        let s = &mut self.slots[i];
        s.freq = (s.freq + 1).min(MAX_FREQ);
        let found = (u64::from(s.weight), s.tag);
        if self.recency {
            self.order.move_last(&mut self.slots, i);
        }
        Some(found)
    }

    /// Forget an entry (explicit removal, not eviction: no ghost).
    pub fn remove(&mut self, key: &K) {
        let slots = &self.slots;
        if let Some(i) = self
            .entries
            .remove(self.hasher.hash_one(key), |i| slots[i].key == *key)
        {
            self.forget_slot(i);
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
            let (i, seq) = if from_small {
                self.small.pop_front()?
            } else {
                self.main.pop_front()?
            };
            let s = &mut self.slots[i];
            if s.seq != seq {
                continue; // stale
            }
            let key = s.key;
            if pinned(&key) {
                if from_small {
                    self.small.push_back((i, seq));
                } else {
                    self.main.push_back((i, seq));
                }
                continue;
            }
            if from_small {
                if s.freq > 0 {
                    s.freq = 0;
                    s.queue = Queue::Main;
                    let w = u64::from(s.weight);
                    self.small_bytes -= w;
                    self.main_bytes += w;
                    self.main.push_back((i, seq));
                    continue;
                }
                let w = u64::from(s.weight);
                let h = self.unindex(&key, i);
                self.forget_slot(i);
                self.ghost.add(h, w, false, self.ghost_limit);
                return Some(key);
            }
            if s.freq > 0 {
                s.freq -= 1;
                self.main.push_back((i, seq));
                continue;
            }
            let w = u64::from(s.weight);
            let h = self.unindex(&key, i);
            self.forget_slot(i);
            if self.adaptive {
                self.ghost.add(h, w, true, self.ghost_limit);
            }
            return Some(key);
        }
        None
    }

    /// With a recency list: the least recently inserted or hit entry that
    /// `pinned` does not protect, forgotten without a ghost (S3-FIFO did not
    /// choose it). `None` without a recency list or when every entry is pinned.
    pub fn evict_least_recent(&mut self, mut pinned: impl FnMut(&K) -> bool) -> Option<K> {
        if !self.recency {
            return None;
        }
        let i = self
            .order
            .iter(&self.slots)
            .find(|&i| !pinned(&self.slots[i].key))?;
        let key = self.slots[i].key;
        self.unindex(&key, i);
        self.forget_slot(i);
        self.compact_if_sparse();
        Some(key)
    }

    /// With a recency list: the least recently inserted or hit entries for
    /// which `wanted` holds, up to `limit_bytes` of their weight (empty without
    /// one). Nothing is changed.
    pub fn coldest_by_recency(&self, limit_bytes: u64, mut wanted: impl FnMut(&K) -> bool) -> Vec<K> {
        let mut out = Vec::new();
        let mut bytes = 0;
        for i in self.order.iter(&self.slots) {
            if bytes >= limit_bytes {
                break;
            }
            let s = &self.slots[i];
            if wanted(&s.key) {
                bytes += u64::from(s.weight);
                out.push(s.key);
            }
        }
        out
    }

    /// The coldest entries for which `wanted` holds, in the order eviction would
    /// reach them, up to `limit_bytes` of their weight: unhit entries at the front
    /// of the small queue, then unhit entries at the front of main (hit entries
    /// would be promoted or given another round first). Nothing is changed.
    pub fn coldest(&self, limit_bytes: u64, mut wanted: impl FnMut(&K) -> bool) -> Vec<K> {
        let mut out = Vec::new();
        let mut bytes = 0;
        for &(i, seq) in self.small.iter().chain(self.main.iter()) {
            if bytes >= limit_bytes {
                break;
            }
            let s = &self.slots[i];
            if s.seq == seq && s.freq == 0 && wanted(&s.key) {
                bytes += u64::from(s.weight);
                out.push(s.key);
            }
        }
        out
    }

    /// Give back slot `i` (its key already out of `entries`): its weight leaves
    /// its queue's count, it leaves the recency list, and its queue element
    /// goes stale.
    fn forget_slot(&mut self, i: usize) {
        let (w, queue) = (u64::from(self.slots[i].weight), self.slots[i].queue);
        match queue {
            Queue::Small => self.small_bytes -= w,
            Queue::Main => self.main_bytes -= w,
        }
        if self.recency {
            self.order.unlink(&mut self.slots, i);
        }
        self.slots[i].seq = 0;
        self.slots.release(i);
    }

    fn bump_seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }

    /// Drop stale queue elements once they dominate, so explicit removals
    /// (generation purges, LRU-order evictions) do not leave the queues
    /// growing without bound.
    fn compact_if_sparse(&mut self) {
        let live = self.entries.len();
        if self.small.len() + self.main.len() > 2 * live + 1024 {
            let slots = &self.slots;
            let alive = |&(i, s): &(usize, u64)| slots[i].seq == s;
            self.small.retain(alive);
            self.main.retain(alive);
        }
    }
}

/// Append a new element, growing a full queue by a quarter (not double: at
/// millions of entries a doubled queue would be up to half spare).
fn enqueue(q: &mut VecDeque<(usize, u64)>, x: (usize, u64)) {
    if q.len() == q.capacity() {
        q.reserve_exact(q.len() / 4 + 16);
    }
    q.push_back(x);
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

    /// The recency order decides exactly as `Lru` does on the same operations
    /// (pins, removals, S3-FIFO's own evictions in between), and stays bounded.
    #[test]
    fn the_recency_order_evicts_like_lru() {
        use super::super::Lru;
        let mut p = S3Fifo::tuned(2000, 10, 8000).with_recency();
        let mut lru = Lru::new();
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for step in 0..200_000u32 {
            let r = next();
            let k = (r >> 8) % 400;
            match r % 8 {
                0..=2 => {
                    if !p.contains(&k) {
                        p.insert(k, 10 + (r >> 40) % 3);
                        lru.insert(k, p.weight(&k).unwrap_or(0));
                    }
                }
                3..=5 => assert_eq!(p.touch_tagged(&k).map(|t| t.0), lru.touch(&k)),
                6 => {
                    p.remove(&k);
                    lru.remove(&k);
                }
                _ => {
                    let pin = (r >> 20) % 7;
                    let pinned = |k: &u64| k % 7 == pin;
                    if step % 3 == 0 {
                        // S3-FIFO's own choice; LRU is told.
                        if let Some(v) = p.evict_one(pinned) {
                            lru.remove(&v);
                        }
                    } else {
                        assert_eq!(p.evict_least_recent(pinned), lru.evict_one(pinned));
                    }
                }
            }
            assert_eq!((p.len(), p.bytes()), (lru.len(), lru.bytes()));
            if step % 1000 == 0 {
                assert_eq!(
                    p.coldest_by_recency(300, |k| k % 2 == 0),
                    lru.coldest(300, |k| k % 2 == 0)
                );
            }
            let queued = p.small.len() + p.main.len();
            assert!(queued <= 2 * p.len() + 1025, "{queued} for {}", p.len());
            assert!(
                p.slots.capacity() <= 400,
                "slots are reused: {}",
                p.slots.capacity()
            );
        }
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
