//! The index from a policy's keys to their slab slots, in 8 bytes per bucket.
//!
//! The slab slot already holds the key, so the index need not hold it again
//! (a `HashMap<BlockKey, usize>` bucket is 57 bytes with its control byte, and
//! std's table is 44–87 % full): each bucket is the top 32 bits of the key's
//! hash (its *tag*) and the slot number, in an open-addressing table (linear
//! probing from the tag's home, backward-shift deletion, grown by half at 80 %
//! full, so 53–80 %). A lookup compares tags and then the key in the slot the
//! tag names, which it reads anyway. Nothing here depends on the table's
//! order, so a policy decides exactly as with a `HashMap`.

/// An empty bucket (slot numbers stay below `u32::MAX`).
const EMPTY: u64 = u64::MAX;

#[derive(Debug, Clone, Default)]
pub(super) struct SlotTable {
    /// `tag << 32 | slot`, or [`EMPTY`].
    buckets: Vec<u64>,
    len: usize,
}

fn tag_of(hash: u64) -> u32 {
    (hash >> 32) as u32
}

impl SlotTable {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Heap bytes (allocated capacity).
    pub(super) fn heap_bytes(&self) -> u64 {
        (self.buckets.capacity() * 8) as u64
    }

    fn home(&self, tag: u32) -> usize {
        ((u64::from(tag) * self.buckets.len() as u64) >> 32) as usize
    }

    fn next(&self, at: usize) -> usize {
        if at + 1 == self.buckets.len() { 0 } else { at + 1 }
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
            if (b >> 32) as u32 == tag && is_key((b & 0xffff_ffff) as usize) {
                return Some(at);
            }
            at = self.next(at);
        }
    }

    /// The slot of the key hashed to `hash` (`is_key` tells a slot holding it).
    pub(super) fn get(&self, hash: u64, is_key: impl FnMut(usize) -> bool) -> Option<usize> {
        self.find(hash, is_key)
            .map(|at| (self.buckets[at] & 0xffff_ffff) as usize)
    }

    /// Index `slot` under `hash`; its key must not be indexed yet.
    pub(super) fn insert(&mut self, hash: u64, slot: usize) {
        assert!(slot < u32::MAX as usize, "policy slab beyond 2^32 - 1 slots");
        if (self.len + 1) * 5 > self.buckets.len() * 4 {
            self.grow();
        }
        self.place(u64::from(tag_of(hash)) << 32 | slot as u64);
        self.len += 1;
    }

    /// Unindex the key hashed to `hash`; its slot.
    pub(super) fn remove(&mut self, hash: u64, is_key: impl FnMut(usize) -> bool) -> Option<usize> {
        let mut at = self.find(hash, is_key)?;
        let slot = (self.buckets[at] & 0xffff_ffff) as usize;
        self.buckets[at] = EMPTY;
        self.len -= 1;
        let mut j = at;
        loop {
            j = self.next(j);
            let b = self.buckets[j];
            if b == EMPTY {
                break;
            }
            let k = self.home((b >> 32) as u32);
            // `b` stays unless its home lies cyclically outside (at, j].
            let stays = if at <= j {
                at < k && k <= j
            } else {
                at < k || k <= j
            };
            if !stays {
                self.buckets[at] = b;
                self.buckets[j] = EMPTY;
                at = j;
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

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
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = (x >> 16) % 5000;
            let found = t.get(hash(k), |s| keys[s] == Some(k));
            assert_eq!(found, reference.get(&k).copied(), "step {step}");
            if x % 2 == 0 {
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
}
