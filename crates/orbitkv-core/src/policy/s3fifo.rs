//! S3-FIFO eviction weighted by bytes (Yang et al., SOSP'23), adapted so that
//! pinned entries are skipped instead of evicted.
//!
//! Three queues: a small FIFO (~10 % of the byte capacity) for new entries, a
//! main FIFO for entries that were hit while in the small queue, and a ghost
//! FIFO of recently evicted keys; a key found in the ghost is admitted straight
//! to main. Entries live in a slab; the small and main queues hold
//! `(slot, generation)` (8 bytes an element) and are cleaned lazily: an element
//! is live only while its slot's current generation matches, so walking them
//! hashes no key (see [`Elem`] for why a stale element is never taken for a
//! live one).
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

/// [`Slot::meta`]: the frequency (0..=[`MAX_FREQ`]) in the low two bits, then
/// the queue, the owner's mark, and the slot's generation above [`GEN_SHIFT`].
const FREQ_BITS: u32 = 0b11;
const IN_MAIN: u32 = 1 << 2;
const MARK: u32 = 1 << 3;
const GEN_SHIFT: u32 = 4;
const FLAGS: u32 = (1 << GEN_SHIFT) - 1;
/// The widest generation that fits above the flags: generations count modulo
/// 2^28 (see [`Elem`]).
const GEN_MASK: u32 = u32::MAX >> GEN_SHIFT;
const _: () = assert!(MAX_FREQ as u32 <= FREQ_BITS);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queue {
    Small,
    Main,
}

/// One tracked entry: with the cache's 8-byte `BlockRef` 16 bytes, 24 with its
/// slab links (with a 48-byte `BlockKey` it was 56 + 8; before that, 72 + 8
/// with a `u64` seq, a `u64` tag and two flag bytes).
#[derive(Debug, Clone)]
struct Slot<K> {
    key: K,
    /// At most `u32::MAX` (blocks are at most 1 GiB).
    weight: u32,
    /// `generation << GEN_SHIFT | mark | in_main | freq` (see [`FREQ_BITS`]).
    /// The generation outlives the entry: a reused slot keeps it (see [`Elem`]).
    meta: u32,
}

impl<K> Slot<K> {
    fn freq(&self) -> u8 {
        (self.meta & FREQ_BITS) as u8
    }

    fn set_freq(&mut self, freq: u8) {
        self.meta = (self.meta & !FREQ_BITS) | u32::from(freq);
    }

    fn queue(&self) -> Queue {
        if self.meta & IN_MAIN != 0 {
            Queue::Main
        } else {
            Queue::Small
        }
    }

    fn set_queue(&mut self, queue: Queue) {
        self.meta = match queue {
            Queue::Main => self.meta | IN_MAIN,
            Queue::Small => self.meta & !IN_MAIN,
        };
    }

    fn mark(&self) -> bool {
        self.meta & MARK != 0
    }

    fn generation(&self) -> u32 {
        self.meta >> GEN_SHIFT
    }
}

/// A small or main queue element: slot `slot` as it was in generation `generation`.
///
/// It is live while the slot's generation is still `generation`. Each tracked entry
/// has exactly one element, pushed when it is inserted and pushed again only
/// right after it was popped. An entry that leaves through [`S3Fifo::evict_one`]
/// has just had its element popped, so none is left and its slot keeps its
/// generation; one that leaves while its element is still queued (a removal,
/// an LRU-order eviction) bumps the slot's generation, which makes that element
/// stale. So an element is live exactly when the entry that pushed it is still
/// the slot's (what a global 64-bit sequence number per insert told before, at
/// 16 bytes an element).
///
/// Generations count modulo 2^28 (`gen_mask` + 1), so a stale element could
/// match again after 2^28 bumps of its slot. Every bump is counted
/// (`stale_made`) since the last sweep that left no stale element able to
/// match (`compact_if_sparse` dropping them, or this): at `gen_mask` bumps every
/// stale element is turned into a [`TOMB`], which never matches (one pass over
/// the queues per 2^28 - 1 removals at most). An element made stale by bump
/// number `c` of a period (1 ≤ c ≤ `gen_mask`) sees at most
/// `gen_mask` - c + 1 < 2^28 bumps of its slot before it is a tomb or gone, so
/// its generation never comes round again while it is queued. Tombs keep their
/// place: the queues hold the same elements in the same order as with sequence
/// numbers, so eviction (whose work budget counts them) decides the same.
#[derive(Debug, Clone, Copy)]
struct Elem {
    slot: u32,
    generation: u32,
}

/// [`Elem::slot`] of a stale element that can never match (no slab has
/// `u32::MAX` slots).
const TOMB: u32 = u32::MAX;

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
    small: VecDeque<Elem>,
    main: VecDeque<Elem>,
    /// Evicted keys by a 32-bit fingerprint of their hash, oldest first (see
    /// `ghost.rs`). A fingerprint instead of the key: the ghost remembers
    /// several times more keys than are resident, and a fingerprint collision
    /// at worst admits one key to main.
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
    /// Slot generations count modulo `gen_mask` + 1 ([`GEN_MASK`]; smaller in tests).
    gen_mask: u32,
    /// Generation bumps (elements made stale) since the queues last held no
    /// stale element that could match; at `gen_mask` they are made tombs (see [`Elem`]).
    stale_made: u32,
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
            gen_mask: GEN_MASK,
            stale_made: 0,
        }
    }

    /// Also keep the entries' recency, for [`S3Fifo::evict_least_recent`] and
    /// [`S3Fifo::coldest_by_recency`]: a list move per insert and hit.
    pub fn with_recency(mut self) -> Self {
        self.recency = true;
        self
    }

    /// Count slot generations modulo 2^`bits` instead of 2^28, so that tests
    /// see them wrap.
    #[cfg(test)]
    fn with_generation_bits(mut self, bits: u32) -> Self {
        assert!((1..=32 - GEN_SHIFT).contains(&bits));
        self.gen_mask = GEN_MASK >> (32 - GEN_SHIFT - bits);
        self
    }

    /// The queues' elements, small then main: the key of each live one, `None`
    /// for a stale one.
    #[cfg(test)]
    fn queued(&self) -> Vec<Option<K>> {
        self.small
            .iter()
            .chain(self.main.iter())
            .map(|&e| is_live(&self.slots, e).then(|| self.slots[e.slot as usize].key))
            .collect()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Approximate heap bytes: (tracked entries with their queues, ghost history).
    pub fn heap_bytes(&self) -> (u64, u64) {
        use crate::map::vec_bytes;
        let tracked = self.entries.heap_bytes()
            + self.slots.heap_bytes()
            + vec_bytes::<Elem>(self.small.capacity() + self.main.capacity());
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
        self.insert_marked(key, weight, false)
    }

    /// [`S3Fifo::insert`], keeping one bit, `mark`, with the entry
    /// ([`S3Fifo::touch_marked`] returns it; `Duel`: the key is in its sample).
    pub fn insert_marked(&mut self, key: K, weight: u64, mark: bool) -> bool {
        let weight32 = u32::try_from(weight).unwrap_or(u32::MAX);
        let weight = u64::from(weight32);
        let h = self.hasher.hash_one(key);
        let slots = &self.slots;
        if self.entries.get(h, |i| slots[i].key == key).is_some() {
            return false;
        }
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
        let flags = if readmitted { IN_MAIN } else { 0 } | if mark { MARK } else { 0 };
        // A reused slot keeps its generation (see `Elem`); freq starts at 0.
        let i = self.slots.put_with(|old| Slot {
            key,
            weight: weight32,
            meta: old.map_or(0, |s| s.meta & !FLAGS) | flags,
        });
        let e = Elem {
            slot: i as u32, // below `TOMB`: the slab holds fewer than 2^32 - 1 slots
            generation: self.slots[i].generation(),
        };
        self.entries.insert(h, i);
        match queue {
            Queue::Small => {
                enqueue(&mut self.small, e);
                self.small_bytes += weight;
            }
            Queue::Main => {
                enqueue(&mut self.main, e);
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
        self.touch_marked(key).is_some()
    }

    /// Record a hit; the entry's weight and mark, `None` when it is not tracked.
    pub fn touch_marked(&mut self, key: &K) -> Option<(u64, bool)> {
        let i = self.slot_of(key)?;
        let s = &mut self.slots[i];
        s.set_freq((s.freq() + 1).min(MAX_FREQ));
        let found = (u64::from(s.weight), s.mark());
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
            self.forget_slot(i, true);
        }
        self.compact_if_sparse();
    }

    /// Choose and forget one victim that `pinned` does not protect. `None`
    /// when every tracked entry is pinned (or nothing is tracked).
    pub fn evict_one(&mut self, mut pinned: impl FnMut(&K) -> bool) -> Option<K> {
        // Each live element can be rotated at most MAX_FREQ+1 times in main and
        // once from small to main before it is either evicted or proven pinned.
        let mut budget = (self.small.len() + self.main.len()) * (MAX_FREQ as usize + 3) + 8;
        // Pinned entries met in a row in each queue: once a queue has gone round with
        // every entry pinned, the victim comes from the other one (a small queue of
        // pinned blocks, e.g. a fill's pinned head, must not make eviction fail while
        // main holds unpinned ones).
        let (mut small_pinned, mut main_pinned) = (0usize, 0usize);
        while budget > 0 {
            budget -= 1;
            let small_ok = !self.small.is_empty() && small_pinned < self.small.len();
            let main_ok = !self.main.is_empty() && main_pinned < self.main.len();
            if !small_ok && !main_ok {
                return None;
            }
            let from_small = small_ok && (self.small_bytes >= self.small_target || !main_ok);
            let e = if from_small {
                self.small.pop_front()?
            } else {
                self.main.pop_front()?
            };
            if !is_live(&self.slots, e) {
                continue; // stale
            }
            let i = e.slot as usize;
            let s = &mut self.slots[i];
            let key = s.key;
            if pinned(&key) {
                if from_small {
                    small_pinned += 1;
                    self.small.push_back(e);
                } else {
                    main_pinned += 1;
                    self.main.push_back(e);
                }
                continue;
            }
            (small_pinned, main_pinned) = (0, 0);
            if from_small {
                if s.freq() > 0 {
                    s.set_freq(0);
                    s.set_queue(Queue::Main);
                    let w = u64::from(s.weight);
                    self.small_bytes -= w;
                    self.main_bytes += w;
                    enqueue(&mut self.main, e);
                    continue;
                }
                let w = u64::from(s.weight);
                let h = self.unindex(&key, i);
                self.forget_slot(i, false);
                self.ghost.add(h, w, false, self.ghost_limit);
                return Some(key);
            }
            if s.freq() > 0 {
                s.set_freq(s.freq() - 1);
                self.main.push_back(e);
                continue;
            }
            let w = u64::from(s.weight);
            let h = self.unindex(&key, i);
            self.forget_slot(i, false);
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
        self.forget_slot(i, true);
        self.compact_if_sparse();
        Some(key)
    }

    /// With a recency list: the least recently inserted or hit entries for
    /// which `wanted` holds, up to `limit_bytes` of their weight (empty without
    /// one). Nothing is changed.
    pub fn coldest_by_recency(&self, limit_bytes: u64, wanted: impl FnMut(&K) -> bool) -> Vec<K> {
        super::walk_cold(self.cold_order_by_recency(), 0, usize::MAX, limit_bytes, wanted).keys
    }

    /// The recency list, least recent first (for [`Self::coldest_by_recency`]).
    pub fn cold_order_by_recency(&self) -> impl Iterator<Item = super::ColdItem<K>> + '_ {
        self.order.iter(&self.slots).map(|i| {
            let s = &self.slots[i];
            Some((s.key, u64::from(s.weight)))
        })
    }

    /// The coldest entries for which `wanted` holds, in the order eviction would
    /// reach them, up to `limit_bytes` of their weight: unhit entries at the front
    /// of the small queue, then unhit entries at the front of main (hit entries
    /// would be promoted or given another round first). Nothing is changed.
    pub fn coldest(&self, limit_bytes: u64, wanted: impl FnMut(&K) -> bool) -> Vec<K> {
        super::walk_cold(self.cold_order(), 0, usize::MAX, limit_bytes, wanted).keys
    }

    /// The small queue then main, front first; only live unhit entries may be
    /// listed (for [`Self::coldest`]).
    pub fn cold_order(&self) -> impl Iterator<Item = super::ColdItem<K>> + '_ {
        self.small.iter().chain(self.main.iter()).map(|&e| {
            if !is_live(&self.slots, e) {
                return None;
            }
            let s = &self.slots[e.slot as usize];
            (s.freq() == 0).then(|| (s.key, u64::from(s.weight)))
        })
    }

    /// Give back slot `i` (its key already out of `entries`): its weight leaves
    /// its queue's count and it leaves the recency list. `queued`: its queue
    /// element is still queued, and goes stale (the slot's generation moves on);
    /// otherwise the caller has just popped it.
    fn forget_slot(&mut self, i: usize, queued: bool) {
        let s = &mut self.slots[i];
        let (w, queue) = (u64::from(s.weight), s.queue());
        if queued {
            let next = (s.generation() + 1) & self.gen_mask;
            s.meta = next << GEN_SHIFT | (s.meta & FLAGS);
            self.stale_made += 1;
        }
        match queue {
            Queue::Small => self.small_bytes -= w,
            Queue::Main => self.main_bytes -= w,
        }
        if self.recency {
            self.order.unlink(&mut self.slots, i);
        }
        self.slots.release(i);
        if self.stale_made >= self.gen_mask {
            self.entomb_stale();
        }
    }

    /// Turn every stale element into a [`TOMB`], in place (see [`Elem`]).
    fn entomb_stale(&mut self) {
        let slots = &self.slots;
        for e in self.small.iter_mut().chain(self.main.iter_mut()) {
            if !is_live(slots, *e) {
                e.slot = TOMB;
            }
        }
        self.stale_made = 0;
    }

    /// Drop stale queue elements once they dominate, so explicit removals
    /// (generation purges, LRU-order evictions) do not leave the queues
    /// growing without bound.
    fn compact_if_sparse(&mut self) {
        let live = self.entries.len();
        if self.small.len() + self.main.len() > 2 * live + 1024 {
            let slots = &self.slots;
            let alive = |e: &Elem| is_live(slots, *e);
            self.small.retain(alive);
            self.main.retain(alive);
            self.stale_made = 0;
        }
    }
}

/// Whether queue element `e` is its entry's current one (see [`Elem`]).
fn is_live<K>(slots: &Slab<Slot<K>>, e: Elem) -> bool {
    e.slot != TOMB && slots[e.slot as usize].generation() == e.generation
}

/// Append a new element, growing a full queue by a quarter (not double: at
/// millions of entries a doubled queue would be up to half spare).
fn enqueue(q: &mut VecDeque<Elem>, x: Elem) {
    if q.len() == q.capacity() {
        q.reserve_exact(q.len() / 4 + 16);
    }
    q.push_back(x);
}

#[cfg(test)]
mod tests;
