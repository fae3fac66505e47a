//! The tier's key -> entry map. Entries sit in one dense list; a table of 64-bit keyed
//! digests (16 bytes a slot) finds them, instead of a hash table of 152-byte key-entry
//! pairs: half the memory, and recovery fills it with one sequential copy plus small
//! table inserts (2 M blocks: ~70 MB of table instead of ~640 MB of sparse pairs).
//!
//! The digest is foldhash seeded per process, so keys a client picks cannot be made to
//! collide. A key whose digest another key already holds goes to `spill`, a table keyed
//! by the full key: each key is in exactly one of the two, and a lookup always compares
//! the full key.
//!
//! `Entry`, the value (one stored block: extent, sequence, payload checksum, LRU tick),
//! is defined here too.

use std::collections::HashMap;
use std::collections::hash_map::Entry as Slot;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};

use crate::format::{FORMAT_VERSION, JournalRecord, RecordKind, SECTOR, extent_bytes};
use crate::key::SsdKey;

/// One stored block.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Entry {
    pub(crate) off: u64,
    pub(crate) len: u64,
    pub(crate) seq: u64,
    pub(crate) sum: u64,
    pub(crate) tick: u64,
}

impl Entry {
    pub(crate) fn units(&self) -> u64 {
        extent_bytes(self.len) / SECTOR
    }
    pub(crate) fn put_record(&self, key: SsdKey) -> JournalRecord {
        JournalRecord {
            version: FORMAT_VERSION as u16,
            kind: RecordKind::Put,
            seq: self.seq,
            key,
            file: 0,
            offset: self.off,
            len: self.len,
            payload_sum: self.sum,
        }
    }
}

/// The digest is already a keyed hash: the table uses it unchanged.
#[derive(Default, Clone, Copy)]
pub(crate) struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

pub(crate) struct KeyIndex {
    items: Vec<(SsdKey, Entry)>,
    by_digest: HashMap<u64, usize, BuildHasherDefault<PassThrough>>,
    spill: HashMap<SsdKey, usize, foldhash::fast::RandomState>,
    seed: foldhash::fast::RandomState,
    /// `u64::MAX`; tests narrow it to force collisions.
    mask: u64,
}

impl KeyIndex {
    pub(crate) fn with_capacity(n: usize) -> KeyIndex {
        KeyIndex {
            items: Vec::with_capacity(n),
            by_digest: HashMap::with_capacity_and_hasher(n, BuildHasherDefault::default()),
            spill: HashMap::default(),
            seed: foldhash::fast::RandomState::default(),
            mask: u64::MAX,
        }
    }

    fn digest(&self, k: &SsdKey) -> u64 {
        self.seed.hash_one(k) & self.mask
    }

    fn find(&self, k: &SsdKey) -> Option<usize> {
        match self.by_digest.get(&self.digest(k)) {
            Some(&i) if self.items.get(i).is_some_and(|(ik, _)| ik == k) => Some(i),
            _ => self.spill.get(k).copied(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    pub(crate) fn get(&self, k: &SsdKey) -> Option<&Entry> {
        let i = self.find(k)?;
        self.items.get(i).map(|(_, e)| e)
    }

    pub(crate) fn get_mut(&mut self, k: &SsdKey) -> Option<&mut Entry> {
        let i = self.find(k)?;
        self.items.get_mut(i).map(|(_, e)| e)
    }

    pub(crate) fn contains_key(&self, k: &SsdKey) -> bool {
        self.find(k).is_some()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&SsdKey, &Entry)> {
        self.items.iter().map(|(k, e)| (k, e))
    }

    /// Insert or replace; returns the entry replaced. One table probe when the key's
    /// digest is free (recovery's bulk inserts).
    pub(crate) fn insert(&mut self, k: SsdKey, e: Entry) -> Option<Entry> {
        let n = self.items.len();
        let d = self.digest(&k);
        let at = match self.by_digest.entry(d) {
            Slot::Occupied(o) => {
                let i = *o.get();
                if self.items.get(i).is_some_and(|(ik, _)| *ik == k) {
                    Some(i)
                } else {
                    match self.spill.get(&k) {
                        Some(&i) => Some(i),
                        None => {
                            self.spill.insert(k, n);
                            None
                        }
                    }
                }
            }
            // The key may sit in `spill` (another key held this digest when it came,
            // and has gone since).
            Slot::Vacant(v) => match (!self.spill.is_empty()).then(|| self.spill.get(&k)).flatten() {
                Some(&i) => Some(i),
                None => {
                    v.insert(n);
                    None
                }
            },
        };
        if let Some(i) = at
            && let Some((_, old)) = self.items.get_mut(i)
        {
            return Some(std::mem::replace(old, e));
        }
        self.items.push((k, e));
        None
    }

    pub(crate) fn remove(&mut self, k: &SsdKey) -> Option<Entry> {
        let d = self.digest(k);
        let i = match self.by_digest.get(&d) {
            Some(&i) if self.items.get(i).is_some_and(|(ik, _)| ik == k) => {
                self.by_digest.remove(&d);
                i
            }
            _ => self.spill.remove(k)?,
        };
        let last = self.items.len().checked_sub(1)?;
        let (_, e) = self.items.swap_remove(i);
        if i != last
            && let Some(&(moved, _)) = self.items.get(i)
        {
            // The last entry moved into the hole: repoint whichever table holds it.
            let md = self.digest(&moved);
            match self.by_digest.get_mut(&md) {
                Some(slot) if *slot == last => *slot = i,
                _ => {
                    if let Some(slot) = self.spill.get_mut(&moved) {
                        *slot = i;
                    }
                }
            }
        }
        Some(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(i: u8) -> SsdKey {
        SsdKey {
            fingerprint: [7; 32],
            shard: u32::from(i % 3),
            salt: [8; 32],
            generation: 1,
            hash: [i; 32],
        }
    }

    fn entry(v: u64) -> Entry {
        Entry {
            off: v,
            len: v,
            seq: v,
            sum: v,
            tick: v,
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        /// Same answers as a map keyed by the full key, with digests colliding often
        /// (four digests for up to 16 keys) or never.
        #[test]
        fn matches_a_full_key_map(
            narrow in any::<bool>(),
            ops in proptest::collection::vec((0u8..16, 0u8..3, 0u64..1000), 0..300),
        ) {
            let mut ix = KeyIndex::with_capacity(4);
            if narrow {
                ix.mask = 3;
            }
            let mut model: std::collections::HashMap<SsdKey, u64> = std::collections::HashMap::new();
            for (k, op, v) in ops {
                let k = key(k);
                match op {
                    0 => prop_assert_eq!(ix.insert(k, entry(v)).map(|e| e.off), model.insert(k, v)),
                    1 => prop_assert_eq!(ix.remove(&k).map(|e| e.off), model.remove(&k)),
                    _ => {
                        if let Some(e) = ix.get_mut(&k) {
                            e.off = v;
                        }
                        if let Some(m) = model.get_mut(&k) {
                            *m = v;
                        }
                    }
                }
                prop_assert_eq!(ix.len(), model.len());
                for i in 0..16u8 {
                    let k = key(i);
                    prop_assert_eq!(ix.get(&k).map(|e| e.off), model.get(&k).copied());
                    prop_assert_eq!(ix.contains_key(&k), model.contains_key(&k));
                }
                let mut all: Vec<(SsdKey, u64)> = ix.iter().map(|(k, e)| (*k, e.off)).collect();
                let mut want: Vec<(SsdKey, u64)> = model.iter().map(|(k, v)| (*k, *v)).collect();
                all.sort();
                want.sort();
                prop_assert_eq!(all, want);
            }
        }
    }
}
