//! Least recently used, weighted by bytes: the reference policy of the trace
//! simulator and a candidate. O(log n) per operation (an ordered set of stamps).

use std::collections::BTreeSet;
use std::hash::Hash;

use crate::map::Map;

#[derive(Debug, Clone)]
pub struct Lru<K> {
    stamps: Map<K, (u64, u64)>, // key -> (stamp, weight)
    order: BTreeSet<(u64, K)>,
    clock: u64,
    bytes: u64,
}

impl<K: Copy + Eq + Hash + Ord> Lru<K> {
    pub fn new() -> Self {
        Lru {
            stamps: Map::default(),
            order: BTreeSet::new(),
            clock: 0,
            bytes: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.stamps.len()
    }

    /// The tracked entries' weight.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.stamps.is_empty()
    }

    pub fn contains(&self, key: &K) -> bool {
        self.stamps.contains_key(key)
    }

    /// A tracked entry's weight.
    pub fn weight(&self, key: &K) -> Option<u64> {
        self.stamps.get(key).map(|&(_, w)| w)
    }

    /// Track a new entry of `weight` bytes as the most recently used.
    pub fn insert(&mut self, key: K, weight: u64) {
        self.stamp(key, weight);
    }

    /// Record a hit: the entry becomes the most recently used.
    pub fn touch(&mut self, key: &K) {
        if let Some(&(_, weight)) = self.stamps.get(key) {
            self.stamp(*key, weight);
        }
    }

    fn stamp(&mut self, key: K, weight: u64) {
        self.clock += 1;
        self.bytes += weight;
        if let Some((old, w)) = self.stamps.insert(key, (self.clock, weight)) {
            self.order.remove(&(old, key));
            self.bytes -= w;
        }
        self.order.insert((self.clock, key));
    }

    pub fn remove(&mut self, key: &K) {
        if let Some((old, w)) = self.stamps.remove(key) {
            self.order.remove(&(old, *key));
            self.bytes -= w;
        }
    }

    /// The least recently used entry that `pinned` does not protect.
    pub fn evict_one(&mut self, mut pinned: impl FnMut(&K) -> bool) -> Option<K> {
        let victim = self.order.iter().find(|(_, k)| !pinned(k)).copied()?;
        self.order.remove(&victim);
        if let Some((_, w)) = self.stamps.remove(&victim.1) {
            self.bytes -= w;
        }
        Some(victim.1)
    }

    /// Least recently used entries for which `wanted` holds, up to `limit_bytes` of
    /// their weight. Nothing is changed.
    pub fn coldest(&self, limit_bytes: u64, mut wanted: impl FnMut(&K) -> bool) -> Vec<K> {
        let mut bytes = 0;
        let mut out = Vec::new();
        for (_, k) in &self.order {
            if bytes >= limit_bytes {
                break;
            }
            if wanted(k) {
                bytes += self.stamps.get(k).map_or(0, |&(_, w)| w);
                out.push(*k);
            }
        }
        out
    }
}

impl<K: Copy + Eq + Hash + Ord> Default for Lru<K> {
    fn default() -> Self {
        Self::new()
    }
}
