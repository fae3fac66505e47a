//! Least recently used, weighted by bytes: the reference policy of the trace
//! simulator and a candidate. O(1) per operation: a doubly linked list threaded
//! through a slab of nodes (least recent first, [`super::slab`]), indexed by key
//! in a [`SlotTable`] (8 bytes a bucket: the node holds the key; a `HashMap`
//! from key to node held the key again, 57 bytes a bucket for a `BlockKey`).

use std::hash::{BuildHasher, Hash};

use super::slab::{List, Slab};
use crate::table::SlotTable;

#[derive(Debug, Clone)]
struct Node<K> {
    key: K,
    weight: u64,
}

#[derive(Debug, Clone)]
pub struct Lru<K> {
    /// Key → its node in `nodes`.
    index: SlotTable,
    /// Hashes keys for `index` (per process, random).
    hasher: foldhash::fast::RandomState,
    nodes: Slab<Node<K>>,
    order: List,
    bytes: u64,
}

impl<K: Copy + Eq + Hash + Ord> Lru<K> {
    pub fn new() -> Self {
        Lru {
            index: SlotTable::default(),
            hasher: foldhash::fast::RandomState::default(),
            nodes: Slab::new(),
            order: List::EMPTY,
            bytes: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Approximate heap bytes.
    pub fn heap_bytes(&self) -> u64 {
        self.index.heap_bytes() + self.nodes.heap_bytes()
    }

    /// The tracked entries' weight.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.index.len() == 0
    }

    pub fn contains(&self, key: &K) -> bool {
        self.node_of(key).is_some()
    }

    /// The node tracking `key`.
    fn node_of(&self, key: &K) -> Option<usize> {
        let nodes = &self.nodes;
        self.index
            .get(self.hasher.hash_one(key), |i| nodes[i].key == *key)
    }

    /// A tracked entry's weight.
    pub fn weight(&self, key: &K) -> Option<u64> {
        self.node_of(key).map(|i| self.nodes[i].weight)
    }

    /// Track a new entry of `weight` bytes as the most recently used (an entry
    /// already tracked takes the new weight and becomes the most recent).
    pub fn insert(&mut self, key: K, weight: u64) {
        let h = self.hasher.hash_one(key);
        let nodes = &self.nodes;
        if let Some(i) = self.index.get(h, |i| nodes[i].key == key) {
            self.bytes = self.bytes - self.nodes[i].weight + weight;
            self.nodes[i].weight = weight;
            self.order.move_last(&mut self.nodes, i);
            return;
        }
        let i = self.nodes.put(Node { key, weight });
        self.index.insert(h, i);
        self.bytes += weight;
        self.order.push_last(&mut self.nodes, i);
    }

    /// Record a hit: the entry becomes the most recently used. Returns its
    /// weight, `None` when it is not tracked.
    pub fn touch(&mut self, key: &K) -> Option<u64> {
        let i = self.node_of(key)?;
        self.order.move_last(&mut self.nodes, i);
        Some(self.nodes[i].weight)
    }

    pub fn remove(&mut self, key: &K) {
        let nodes = &self.nodes;
        if let Some(i) = self
            .index
            .remove(self.hasher.hash_one(key), |i| nodes[i].key == *key)
        {
            self.order.unlink(&mut self.nodes, i);
            self.bytes -= self.nodes[i].weight;
            self.nodes.release(i);
        }
    }

    /// Nodes from least to most recently used.
    fn iter(&self) -> impl Iterator<Item = &Node<K>> {
        self.order.iter(&self.nodes).map(|i| &self.nodes[i])
    }

    /// The least recently used entry that `pinned` does not protect.
    pub fn evict_one(&mut self, mut pinned: impl FnMut(&K) -> bool) -> Option<K> {
        let victim = self.iter().map(|n| n.key).find(|k| !pinned(k))?;
        self.remove(&victim);
        Some(victim)
    }

    /// Least recently used entries for which `wanted` holds, up to `limit_bytes` of
    /// their weight. Nothing is changed.
    pub fn coldest(&self, limit_bytes: u64, wanted: impl FnMut(&K) -> bool) -> Vec<K> {
        super::walk_cold(self.cold_order(), 0, usize::MAX, limit_bytes, wanted).keys
    }

    /// Every entry, least recently used first (for [`Self::coldest`]).
    pub fn cold_order(&self) -> impl Iterator<Item = super::ColdItem<K>> + '_ {
        self.iter().map(|n| Some((n.key, n.weight)))
    }
}

impl<K: Copy + Eq + Hash + Ord> Default for Lru<K> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recent_unpinned_entry_leaves_and_slots_are_reused() {
        let mut p = Lru::new();
        for k in 0..5u32 {
            p.insert(k, 10);
        }
        p.touch(&0);
        p.insert(3, 20); // re-insert: new weight, most recent
        assert_eq!(p.bytes(), 60);
        assert_eq!(p.coldest(25, |_| true), vec![1, 2, 4]);
        assert_eq!(p.coldest(u64::MAX, |k| k % 2 == 0), vec![2, 4, 0]);
        assert_eq!(p.evict_one(|k| *k == 1), Some(2));
        p.remove(&4);
        assert_eq!(p.len(), 3);
        p.insert(9, 10); // takes a freed slot
        assert_eq!(p.nodes.capacity(), 5);
        let mut order = Vec::new();
        while let Some(k) = p.evict_one(|_| false) {
            order.push(k);
        }
        assert_eq!(order, vec![1, 0, 3, 9]);
        assert!(p.is_empty() && p.bytes() == 0);
        assert_eq!(p.evict_one(|_| false), None);
    }
}
