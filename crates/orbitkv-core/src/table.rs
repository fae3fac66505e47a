//! Compact hash indexes over slabs: [`SlotTable`], an index from keys to slab
//! slot numbers in 8 bytes per bucket, and [`SlabMap`], a map whose entries
//! live in a slab indexed by one (the block index: millions of entries).
//!
//! The slab slot already holds the key, so the index need not hold it again
//! (a `HashMap<BlockKey, usize>` bucket is 57 bytes with its control byte, and
//! std's table is 44–87 % full): each bucket is the top 32 bits of the key's
//! hash (its *tag*) and the slot number, in an open-addressing table (linear
//! probing from the tag's home, backward-shift deletion, grown by half at 80 %
//! full, so 53–80 %). A lookup compares tags and then the key in the slot the
//! tag names, which it reads anyway. A policy never depends on the table's
//! order, so it decides exactly as with a `HashMap`.

use std::hash::{BuildHasher, Hash, Hasher};

/// An empty bucket: all zeros, so a new table is `calloc`ed memory, zeroed
/// by the kernel as it is first touched (a bucket holds its slot number + 1).
const EMPTY: u64 = 0;

#[derive(Debug, Clone, Default)]
pub(crate) struct SlotTable {
    /// `tag << 32 | (slot + 1)`, or [`EMPTY`].
    buckets: Vec<u64>,
    len: usize,
}

fn tag_of(hash: u64) -> u32 {
    (hash >> 32) as u32
}

fn slot_of(bucket: u64) -> usize {
    (bucket & 0xffff_ffff) as usize - 1
}

impl SlotTable {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Heap bytes (allocated capacity).
    pub(crate) fn heap_bytes(&self) -> u64 {
        (self.buckets.capacity() * 8) as u64
    }

    fn home(&self, tag: u32) -> usize {
        home_of(tag, self.buckets.len())
    }

    fn next(&self, at: usize) -> usize {
        next_of(at, self.buckets.len())
    }

    /// The bucket of the key hashed to `hash` for which `is_key(slot)` holds.
    fn find(&self, hash: u64, mut is_key: impl FnMut(usize) -> bool) -> Option<usize> {
        if self.buckets.is_empty() {
            return None;
        }
        let tag = tag_of(hash);
        let mut at = self.home(tag);
        loop {
            let b = self.buckets[at];
            if b == EMPTY {
                return None;
            }
            if (b >> 32) as u32 == tag && is_key(slot_of(b)) {
                return Some(at);
            }
            at = self.next(at);
        }
    }

    /// The slot of the key hashed to `hash` (`is_key` tells a slot holding it).
    pub(crate) fn get(&self, hash: u64, is_key: impl FnMut(usize) -> bool) -> Option<usize> {
        self.find(hash, is_key).map(|at| slot_of(self.buckets[at]))
    }

    /// Index `slot` under `hash`; its key must not be indexed yet.
    pub(crate) fn insert(&mut self, hash: u64, slot: usize) {
        assert!(slot < u32::MAX as usize, "slab beyond 2^32 - 1 slots");
        if (self.len + 1) * 5 > self.buckets.len() * 4 {
            self.grow();
        }
        self.place(u64::from(tag_of(hash)) << 32 | (slot as u64 + 1));
        self.len += 1;
    }

    /// Unindex the key hashed to `hash`; its slot.
    pub(crate) fn remove(&mut self, hash: u64, is_key: impl FnMut(usize) -> bool) -> Option<usize> {
        let at = self.find(hash, is_key)?;
        let slot = slot_of(self.buckets[at]);
        remove_shifting(&mut self.buckets, at, EMPTY, |b| (b >> 32) as u32);
        self.len -= 1;
        Some(slot)
    }

    fn place(&mut self, b: u64) {
        let mut at = self.home((b >> 32) as u32);
        while self.buckets[at] != EMPTY {
            at = self.next(at);
        }
        self.buckets[at] = b;
    }

    fn grow(&mut self) {
        let size = (self.buckets.len() * 3 / 2).max(16);
        let old = std::mem::replace(&mut self.buckets, vec![EMPTY; size]);
        for b in old.into_iter().filter(|&b| b != EMPTY) {
            self.place(b);
        }
    }
}

impl SlotTable {
    /// Room for `n` keys without growing (a growth re-places every bucket).
    pub(crate) fn reserve(&mut self, n: usize) {
        let want = n.saturating_mul(5).div_ceil(4);
        if want > self.buckets.len() {
            let old = std::mem::replace(&mut self.buckets, vec![EMPTY; want]);
            for b in old.into_iter().filter(|&b| b != EMPTY) {
                self.place(b);
            }
        }
    }
}

/// What the cache policy knows an indexed block by (in place of its 48-byte
/// key, 8 bytes): the block's slot in the index's slab and its *tag*, the top
/// 32 bits of the index's hash of its key.
///
/// The slot names the block while it is indexed; the tag tells a later
/// occupant of the slot from it (a stale reference matches a new block only
/// if their tags agree: 1 in 2^32). The policy must forget a block before the
/// index drops it, so it holds no stale reference (`check_invariants`).
///
/// It hashes as its tag alone, so a block evicted and saved again (another
/// slot, the same tag) is the same key to hash-keyed history: S3-FIFO's ghost,
/// `duel`'s sample, W-TinyLFU's sketch. Two different blocks with the same tag
/// (1 in 2^32 per pair) share such history, a policy decision made on the
/// other's evidence, never a wrong block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct BlockRef {
    tag: u32,
    slot: u32,
}

impl Hash for BlockRef {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u32(self.tag);
    }
}

const _: () = assert!(std::mem::size_of::<BlockRef>() == 8);

/// A hash map whose entries live in a slab (a `Vec` grown by a quarter, so at
/// most ~20 % of it is spare) indexed by a [`SlotTable`]: per entry the pair
/// itself plus ~12 bytes, against the pair plus one control byte at 44–87 %
/// load in std's table. Iteration follows the slab (any order).
#[derive(Debug)]
pub(crate) struct SlabMap<K, V> {
    slots: Vec<Option<(K, V)>>,
    free: Vec<u32>,
    table: SlotTable,
    hasher: foldhash::fast::SeedableRandomState,
}

impl<K, V> Default for SlabMap<K, V> {
    fn default() -> Self {
        SlabMap {
            slots: Vec::new(),
            free: Vec::new(),
            table: SlotTable::default(),
            hasher: foldhash::fast::SeedableRandomState::random(),
        }
    }
}

impl<K, V> SlabMap<K, V> {
    /// An empty map hashing with `seed` (the block index: the tags of its
    /// [`BlockRef`]s, which the policy's sample and history hash, follow the
    /// seed, so a seeded policy decides alike in every run).
    pub(crate) fn with_seed(seed: u64) -> Self {
        SlabMap {
            hasher: foldhash::fast::SeedableRandomState::with_seed(
                seed,
                foldhash::SharedSeed::global_fixed(),
            ),
            ..Self::default()
        }
    }
}

type Pair<'a, K, V> = (&'a K, &'a V);
type PairOf<K, V> = for<'a> fn(&'a Option<(K, V)>) -> Option<Pair<'a, K, V>>;
/// The entries of a [`SlabMap`], in slab order.
pub(crate) type Iter<'m, K, V> = std::iter::FilterMap<std::slice::Iter<'m, Option<(K, V)>>, PairOf<K, V>>;

fn pair<K, V>(s: &Option<(K, V)>) -> Option<Pair<'_, K, V>> {
    s.as_ref().map(|(k, v)| (k, v))
}

impl<K: Hash + Eq, V> SlabMap<K, V> {
    /// Heap bytes (allocated capacity).
    pub(crate) fn heap_bytes(&self) -> u64 {
        // Slots past `len` were never written: address space, not memory.
        (self.slots.len() * std::mem::size_of::<Option<(K, V)>>() + self.free.capacity() * 4) as u64
            + self.table.heap_bytes()
    }

    /// Room for `n` entries without growing the index or the slab (the slab's
    /// room is address space until entries are written to it).
    pub(crate) fn reserve_index(&mut self, n: usize) {
        self.table.reserve(n);
        self.slots.reserve_exact(n.saturating_sub(self.slots.len()));
    }

    fn slot_of(&self, key: &K) -> Option<usize> {
        self.find(key).map(|(i, _)| i)
    }

    /// `key`'s slot and hash.
    fn find(&self, key: &K) -> Option<(usize, u64)> {
        let slots = &self.slots;
        let h = self.hasher.hash_one(key);
        let i = self
            .table
            .get(h, |i| slots[i].as_ref().is_some_and(|(k, _)| k == key))?;
        Some((i, h))
    }

    fn block_ref(slot: usize, hash: u64) -> BlockRef {
        BlockRef {
            tag: tag_of(hash),
            slot: slot as u32, // below 2^32: the table's buckets hold slot + 1 in 32 bits
        }
    }

    /// The reference to `key`'s entry, and the entry.
    pub(crate) fn get_ref(&self, key: &K) -> Option<(BlockRef, &V)> {
        let (i, h) = self.find(key)?;
        self.slots[i].as_ref().map(|(_, v)| (Self::block_ref(i, h), v))
    }

    /// The reference to `key`'s entry.
    pub(crate) fn ref_of(&self, key: &K) -> Option<BlockRef> {
        self.get_ref(key).map(|(r, _)| r)
    }

    /// The entry `r` refers to, with its key; `None` when its slot is empty
    /// or holds another block now.
    pub(crate) fn by_ref(&self, r: BlockRef) -> Option<(&K, &V)> {
        let (k, v) = self.slots.get(r.slot as usize)?.as_ref()?;
        (tag_of(self.hasher.hash_one(k)) == r.tag).then_some((k, v))
    }

    /// Every entry with its reference (hashes each key: for start-up and checks).
    pub(crate) fn iter_refs(&self) -> impl Iterator<Item = (BlockRef, &K, &V)> {
        self.slots.iter().enumerate().filter_map(|(i, s)| {
            let (k, v) = s.as_ref()?;
            Some((Self::block_ref(i, self.hasher.hash_one(k)), k, v))
        })
    }

    pub(crate) fn get(&self, key: &K) -> Option<&V> {
        let i = self.slot_of(key)?;
        self.slots[i].as_ref().map(|(_, v)| v)
    }

    pub(crate) fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        let i = self.slot_of(key)?;
        self.slots[i].as_mut().map(|(_, v)| v)
    }

    pub(crate) fn contains_key(&self, key: &K) -> bool {
        self.slot_of(key).is_some()
    }

    /// Insert or replace; the entry's reference and the value replaced.
    pub(crate) fn insert_ref(&mut self, key: K, value: V) -> (BlockRef, Option<V>) {
        let h = self.hasher.hash_one(&key);
        let slots = &self.slots;
        if let Some(i) = self
            .table
            .get(h, |i| slots[i].as_ref().is_some_and(|(k, _)| *k == key))
        {
            let old = self.slots[i].replace((key, value)).map(|(_, v)| v);
            return (Self::block_ref(i, h), old);
        }
        let i = match self.free.pop() {
            Some(i) => i as usize,
            None => {
                if self.slots.len() == self.slots.capacity() {
                    self.slots.reserve_exact(self.slots.len() / 4 + 16);
                }
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        self.slots[i] = Some((key, value));
        self.table.insert(h, i);
        (Self::block_ref(i, h), None)
    }

    pub(crate) fn remove(&mut self, key: &K) -> Option<V> {
        let slots = &self.slots;
        let i = self.table.remove(self.hasher.hash_one(key), |i| {
            slots[i].as_ref().is_some_and(|(k, _)| k == key)
        })?;
        self.free.push(i as u32);
        self.slots[i].take().map(|(_, v)| v)
    }

    pub(crate) fn iter(&self) -> Iter<'_, K, V> {
        self.slots.iter().filter_map(pair as PairOf<K, V>)
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.slots.iter().filter_map(|s| s.as_ref().map(|(_, v)| v))
    }
}

impl<'m, K: Hash + Eq, V> IntoIterator for &'m SlabMap<K, V> {
    type Item = Pair<'m, K, V>;
    type IntoIter = Iter<'m, K, V>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// The home bucket of `tag` among `buckets` (multiply-shift: the tag's high
/// bits pick it), in this table and the ghost history's.
pub(crate) fn home_of(tag: u32, buckets: usize) -> usize {
    ((u64::from(tag) * buckets as u64) >> 32) as usize
}

/// The bucket after `at` among `buckets`, wrapping (linear probing).
pub(crate) fn next_of(at: usize, buckets: usize) -> usize {
    if at + 1 == buckets { 0 } else { at + 1 }
}

/// Empty bucket `at` of a linear-probing table (`empty` marks a free bucket)
/// and shift the later entries of its probe run back (backward-shift
/// deletion), so each stays reachable from its home; `tag(entry)` is the tag
/// its home is computed from.
pub(crate) fn remove_shifting<T: Copy + PartialEq>(
    buckets: &mut [T],
    mut at: usize,
    empty: T,
    tag: impl Fn(T) -> u32,
) {
    buckets[at] = empty;
    let mut j = at;
    loop {
        j = next_of(j, buckets.len());
        let b = buckets[j];
        if b == empty {
            return;
        }
        // Move `b` back to `at` unless its home lies cyclically in (at, j].
        if !home_in(at, home_of(tag(b), buckets.len()), j) {
            buckets[at] = b;
            buckets[j] = empty;
            at = j;
        }
    }
}

/// Backward-shift deletion in a linear-probing table: whether an entry whose
/// home is `k`, found at `j` while closing the hole at `at`, may stay where it
/// is (its home lies cyclically in `(at, j]`, so moving it to `at` would put it
/// before its home).
fn home_in(at: usize, k: usize, j: usize) -> bool {
    if at <= j {
        at < k && k <= j
    } else {
        at < k || k <= j
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// One xorshift64 step: the tests' cheap deterministic stream.
    fn xorshift(x: &mut u64) -> u64 {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    #[test]
    fn behaves_like_a_hash_map() {
        let mut t = SlotTable::default();
        let mut keys: Vec<Option<u64>> = Vec::new(); // slot -> key
        let mut free: Vec<usize> = Vec::new();
        let mut reference: HashMap<u64, usize> = HashMap::new();
        // A weak hash (many equal tags and homes) to exercise probing and shifts.
        let hash = |k: u64| (k % 97) << 40 | k;
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        for step in 0..200_000u32 {
            xorshift(&mut x);
            let k = (x >> 16) % 5000;
            let found = t.get(hash(k), |s| keys[s] == Some(k));
            assert_eq!(found, reference.get(&k).copied(), "step {step}");
            if x.is_multiple_of(2) {
                if found.is_none() {
                    let s = free.pop().unwrap_or_else(|| {
                        keys.push(None);
                        keys.len() - 1
                    });
                    keys[s] = Some(k);
                    t.insert(hash(k), s);
                    reference.insert(k, s);
                }
            } else {
                let removed = t.remove(hash(k), |s| keys[s] == Some(k));
                assert_eq!(removed, reference.remove(&k));
                if let Some(s) = removed {
                    keys[s] = None;
                    free.push(s);
                }
            }
            assert_eq!(t.len(), reference.len());
        }
    }

    #[test]
    fn slab_map_behaves_like_a_hash_map() {
        let mut m: SlabMap<u64, u64> = SlabMap::with_seed(3);
        let mut reference: HashMap<u64, u64> = HashMap::new();
        let mut refs: HashMap<u64, BlockRef> = HashMap::new();
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        for step in 0..100_000u64 {
            xorshift(&mut x);
            let k = (x >> 16) % 3000;
            match x % 4 {
                0 | 1 => assert_eq!(m.insert_ref(k, step).1, reference.insert(k, step)),
                2 => assert_eq!(m.remove(&k), reference.remove(&k)),
                _ => {
                    if let Some(v) = m.get_mut(&k) {
                        *v += 1;
                    }
                    if let Some(v) = reference.get_mut(&k) {
                        *v += 1;
                    }
                }
            }
            assert_eq!(m.get(&k), reference.get(&k));
            assert_eq!(m.contains_key(&k), reference.contains_key(&k));
            // A reference names its entry until the entry leaves; then it names
            // nothing (a later occupant of the slot has another tag: 1 in 2^32
            // would not, and with this seed none of these keys does).
            match m.ref_of(&k) {
                Some(r) => {
                    assert_eq!(m.by_ref(r).map(|(k, _)| *k), Some(k));
                    refs.insert(k, r);
                }
                None => {
                    if let Some(r) = refs.remove(&k) {
                        assert!(m.by_ref(r).is_none(), "step {step}: a stale reference");
                    }
                }
            }
            assert_eq!(m.table.len(), reference.len());
        }
        let mut all: Vec<(u64, u64)> = m.iter().map(|(k, v)| (*k, *v)).collect();
        all.sort_unstable();
        let mut want: Vec<(u64, u64)> = reference.into_iter().collect();
        want.sort_unstable();
        assert_eq!(all, want);
        assert_eq!(m.values().count(), all.len());
        assert_eq!(m.iter_refs().count(), all.len());
        for (r, k, v) in m.iter_refs() {
            assert_eq!(m.by_ref(r), Some((k, v)));
        }
    }
}
