//! `Inner`: one policy of one kind over one capacity, and how to build one
//! (`Recipe`); `Policy` (mod.rs) owns one for DRAM and one for the tiers and
//! dispatches to it.

use std::hash::Hash;

use super::{ColdOrder, Duel, Lru, PolicyHeap, PolicyKind, S3Fifo, TinyLfu};

/// One policy of one kind over one capacity.
#[derive(Debug, Clone)]
pub(super) enum Inner<K> {
    S3Fifo(S3Fifo<K>),
    Lru(Lru<K>),
    TinyLfu(TinyLfu<K>),
    Duel(Box<Duel<K>>),
}

/// How to build an [`Inner`] for any capacity (the tiers' policy is the DRAM
/// policy's kind over DRAM + SSD).
#[derive(Debug, Clone, Copy)]
pub(super) enum Recipe {
    Kind(PolicyKind),
    S3Fifo { small_pct: u64, ghost_x100: u64 },
    TinyLfu { window_pct: u64, sample_x: u64 },
}

impl<K: Copy + Eq + Hash + Ord> Inner<K> {
    pub(super) fn build(recipe: Recipe, capacity_bytes: u64, seed: Option<u64>) -> Self {
        match recipe {
            Recipe::Kind(kind) => match kind {
                PolicyKind::S3Fifo => Inner::S3Fifo(S3Fifo::new(capacity_bytes)),
                PolicyKind::S3FifoChain => Inner::S3Fifo(S3Fifo::with_ghost(
                    capacity_bytes,
                    capacity_bytes.saturating_mul(4),
                )),
                PolicyKind::S3FifoAdaptive => Inner::S3Fifo(S3Fifo::adaptive(capacity_bytes, capacity_bytes)),
                PolicyKind::Lru | PolicyKind::LruChain => Inner::Lru(Lru::new()),
                PolicyKind::TinyLfu => Inner::TinyLfu(TinyLfu::new(capacity_bytes, 1, 8).seeded(seed)),
                PolicyKind::Duel => Inner::Duel(Box::new(Duel::with_seed(capacity_bytes, seed))),
            },
            Recipe::S3Fifo {
                small_pct,
                ghost_x100,
            } => Inner::S3Fifo(S3Fifo::tuned(
                capacity_bytes,
                small_pct,
                capacity_bytes.saturating_mul(ghost_x100) / 100,
            )),
            Recipe::TinyLfu { window_pct, sample_x } => {
                Inner::TinyLfu(TinyLfu::new(capacity_bytes, window_pct, sample_x).seeded(seed))
            }
        }
    }

    pub(super) fn heap_bytes(&self) -> PolicyHeap {
        let (tracked, ghost, shadows) = match self {
            Inner::S3Fifo(p) => {
                let (t, g) = p.heap_bytes();
                (t, g, 0)
            }
            Inner::Lru(p) => (p.heap_bytes(), 0, 0),
            Inner::TinyLfu(p) => {
                let (t, g) = p.heap_bytes();
                (t, g, 0)
            }
            Inner::Duel(p) => p.heap_bytes(),
        };
        PolicyHeap {
            tracked,
            ghost,
            shadows,
        }
    }

    pub(super) fn reserve(&mut self, n: usize) {
        match self {
            Inner::S3Fifo(p) => p.reserve(n),
            Inner::Duel(p) => p.reserve(n),
            Inner::Lru(_) | Inner::TinyLfu(_) => {}
        }
    }

    pub(super) fn len(&self) -> usize {
        match self {
            Inner::S3Fifo(p) => p.len(),
            Inner::Lru(p) => p.len(),
            Inner::TinyLfu(p) => p.len(),
            Inner::Duel(p) => p.len(),
        }
    }

    pub(super) fn bytes(&self) -> u64 {
        match self {
            Inner::S3Fifo(p) => p.bytes(),
            Inner::Lru(p) => p.bytes(),
            Inner::TinyLfu(p) => p.bytes(),
            Inner::Duel(p) => p.bytes(),
        }
    }

    pub(super) fn weight(&self, key: &K) -> Option<u64> {
        match self {
            Inner::S3Fifo(p) => p.weight(key),
            Inner::Lru(p) => p.weight(key),
            Inner::TinyLfu(p) => p.weight(key),
            Inner::Duel(p) => p.weight(key),
        }
    }

    pub(super) fn contains(&self, key: &K) -> bool {
        match self {
            Inner::S3Fifo(p) => p.contains(key),
            Inner::Lru(p) => p.contains(key),
            Inner::TinyLfu(p) => p.contains(key),
            Inner::Duel(p) => p.contains(key),
        }
    }

    /// Track `key`; `true` when the policy had seen it evicted recently.
    pub(super) fn insert(&mut self, key: K, weight: u64) -> bool {
        match self {
            Inner::S3Fifo(p) => p.insert(key, weight),
            Inner::Lru(p) => {
                p.insert(key, weight);
                false
            }
            Inner::TinyLfu(p) => p.insert(key, weight),
            Inner::Duel(p) => p.insert(key, weight),
        }
    }

    /// The next inserts or touches are one chain (see [`Duel::begin_chain`]);
    /// only `duel` scores chains as a whole.
    pub(super) fn begin_chain(&mut self) {
        if let Inner::Duel(p) = self {
            p.begin_chain();
        }
    }

    pub(super) fn end_chain(&mut self, deepest_first: bool) {
        if let Inner::Duel(p) = self {
            p.end_chain(deepest_first);
        }
    }

    /// Record a hit; `false` when `key` is not tracked.
    pub(super) fn touch(&mut self, key: &K) -> bool {
        match self {
            Inner::S3Fifo(p) => p.touch(key),
            Inner::Lru(p) => p.touch(key).is_some(),
            Inner::TinyLfu(p) => p.touch(key),
            Inner::Duel(p) => p.touch(key),
        }
    }

    pub(super) fn remove(&mut self, key: &K) {
        match self {
            Inner::S3Fifo(p) => p.remove(key),
            Inner::Lru(p) => p.remove(key),
            Inner::TinyLfu(p) => p.remove(key),
            Inner::Duel(p) => p.remove(key),
        }
    }

    pub(super) fn evict_one(&mut self, pinned: impl FnMut(&K) -> bool) -> Option<K> {
        match self {
            Inner::S3Fifo(p) => p.evict_one(pinned),
            Inner::Lru(p) => p.evict_one(pinned),
            Inner::TinyLfu(p) => p.evict_one(pinned),
            Inner::Duel(p) => p.evict_one(pinned),
        }
    }

    pub(super) fn coldest(&self, limit_bytes: u64, wanted: impl FnMut(&K) -> bool) -> Vec<K> {
        match self {
            Inner::S3Fifo(p) => p.coldest(limit_bytes, wanted),
            Inner::Lru(p) => p.coldest(limit_bytes, wanted),
            Inner::TinyLfu(p) => p.coldest(limit_bytes, wanted),
            Inner::Duel(p) => p.coldest(limit_bytes, wanted),
        }
    }

    pub(super) fn cold_orders(&self) -> Vec<usize> {
        match self {
            Inner::Duel(p) => p.cold_orders().to_vec(),
            _ => vec![0],
        }
    }

    pub(super) fn cold_order(&self, which: usize) -> ColdOrder<'_, K> {
        match self {
            Inner::S3Fifo(p) => Box::new(p.cold_order()),
            Inner::Lru(p) => Box::new(p.cold_order()),
            Inner::TinyLfu(p) => Box::new(p.cold_order()),
            Inner::Duel(p) => p.cold_order(which),
        }
    }
}
