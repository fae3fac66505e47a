//! Which DRAM-resident blocks leave first. The cache (`CacheState`) tells the
//! policy what happens to blocks (committed, hit, removed) in chain order (a
//! save's or a lookup's blocks, prefix first) and asks it for victims; the
//! policy never frees anything itself.
//!
//! Candidates are compared on real traces by `benches/trace_sim.rs`, which drives
//! `CacheState` with each [`PolicyKind`]; `docs/performance.md` has the figures
//! that chose the default.

mod duel;
mod lru;
mod s3fifo;
mod tinylfu;

use std::fmt;
use std::hash::Hash;
use std::str::FromStr;

pub use duel::Duel;
pub use lru::Lru;
pub use s3fifo::S3Fifo;
pub use tinylfu::TinyLfu;

/// A selectable eviction policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PolicyKind {
    /// S3-FIFO (small, main and ghost FIFOs), blocks told in chain order.
    S3Fifo,
    /// S3-FIFO told deepest block first (a chain's tail leaves before its head),
    /// with a ghost history of 4× the capacity for returns after long gaps.
    S3FifoChain,
    /// S3-FIFO whose small queue (5–50 % of the capacity) grows when its
    /// evictions come back and shrinks when main's do (ARC's adaptation), told
    /// deepest block first, a ghost history of 1× the capacity.
    S3FifoAdaptive,
    /// LRU, blocks told in chain order (a request's deepest block is the most recent).
    Lru,
    /// LRU told deepest block first, so a chain's prefix stays more recent than its tail.
    LruChain,
    /// W-TinyLFU: a 1 % LRU window, a segmented-LRU main, admission to main by a
    /// frequency sketch with a doorkeeper whose aging period is 8× the capacity in
    /// entries (it remembers returns after long gaps); told deepest block first.
    TinyLfu,
    /// The default. Set dueling: S3-FIFO (4× ghost) and LRU both track every
    /// block; sampled shadow caches of five candidates (S3-FIFO with a 5, 10, 20
    /// or 40 % small queue, LRU) pick which one evicts and S3-FIFO's small-queue
    /// share; told deepest block first.
    #[default]
    Duel,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 7] = [
        PolicyKind::S3Fifo,
        PolicyKind::S3FifoChain,
        PolicyKind::S3FifoAdaptive,
        PolicyKind::Lru,
        PolicyKind::LruChain,
        PolicyKind::TinyLfu,
        PolicyKind::Duel,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::S3Fifo => "s3fifo",
            PolicyKind::S3FifoChain => "s3fifo-chain",
            PolicyKind::S3FifoAdaptive => "s3fifo-adaptive",
            PolicyKind::Lru => "lru",
            PolicyKind::LruChain => "lru-chain",
            PolicyKind::TinyLfu => "tinylfu",
            PolicyKind::Duel => "duel",
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PolicyKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        PolicyKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = PolicyKind::ALL.iter().map(|k| k.name()).collect();
                format!("unknown cache policy {s:?}; expected one of {}", names.join(", "))
            })
    }
}

/// The policy instance a `CacheState` owns.
#[derive(Debug, Clone)]
pub enum Policy<K> {
    S3Fifo { p: S3Fifo<K>, deepest_first: bool },
    Lru { p: Lru<K>, deepest_first: bool },
    TinyLfu { p: TinyLfu<K>, deepest_first: bool },
    Duel { p: Box<Duel<K>>, deepest_first: bool },
}

impl<K: Copy + Eq + Hash + Ord> Policy<K> {
    /// An S3-FIFO with explicit parameters (the simulator's parameter sweeps).
    pub fn s3fifo_tuned(capacity_bytes: u64, small_pct: u64, ghost_bytes: u64, deepest_first: bool) -> Self {
        Policy::S3Fifo {
            p: S3Fifo::tuned(capacity_bytes, small_pct, ghost_bytes),
            deepest_first,
        }
    }

    /// A W-TinyLFU with explicit parameters (window share in percent, sketch aging
    /// period as a multiple of the capacity in entries).
    pub fn tinylfu_tuned(capacity_bytes: u64, window_pct: u64, sample_x: u64, deepest_first: bool) -> Self {
        Policy::TinyLfu {
            p: TinyLfu::new(capacity_bytes, window_pct, sample_x),
            deepest_first,
        }
    }

    pub fn new(kind: PolicyKind, capacity_bytes: u64) -> Self {
        match kind {
            PolicyKind::S3Fifo => Policy::S3Fifo {
                p: S3Fifo::new(capacity_bytes),
                deepest_first: false,
            },
            PolicyKind::S3FifoChain => Policy::S3Fifo {
                p: S3Fifo::with_ghost(capacity_bytes, capacity_bytes.saturating_mul(4)),
                deepest_first: true,
            },
            PolicyKind::S3FifoAdaptive => Policy::S3Fifo {
                p: S3Fifo::adaptive(capacity_bytes, capacity_bytes),
                deepest_first: true,
            },
            PolicyKind::Lru => Policy::Lru {
                p: Lru::new(),
                deepest_first: false,
            },
            PolicyKind::LruChain => Policy::Lru {
                p: Lru::new(),
                deepest_first: true,
            },
            PolicyKind::TinyLfu => Self::tinylfu_tuned(capacity_bytes, 1, 8, true),
            PolicyKind::Duel => Policy::Duel {
                p: Box::new(Duel::new(capacity_bytes)),
                deepest_first: true,
            },
        }
    }

    fn deepest_first(&self) -> bool {
        match self {
            Policy::S3Fifo { deepest_first, .. }
            | Policy::Lru { deepest_first, .. }
            | Policy::TinyLfu { deepest_first, .. }
            | Policy::Duel { deepest_first, .. } => *deepest_first,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Policy::S3Fifo { p, .. } => p.len(),
            Policy::Lru { p, .. } => p.len(),
            Policy::TinyLfu { p, .. } => p.len(),
            Policy::Duel { p, .. } => p.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn contains(&self, key: &K) -> bool {
        match self {
            Policy::S3Fifo { p, .. } => p.contains(key),
            Policy::Lru { p, .. } => p.contains(key),
            Policy::TinyLfu { p, .. } => p.contains(key),
            Policy::Duel { p, .. } => p.contains(key),
        }
    }

    /// Newly visible blocks of one save, `(key, weight)` in chain order (prefix
    /// first). Returns, per block in the same order, whether the policy had seen it
    /// evicted recently (evidence of reuse).
    pub fn insert_chain(&mut self, blocks: &[(K, u64)]) -> Vec<bool> {
        let (n, deepest_first) = (blocks.len(), self.deepest_first());
        let mut readmitted = vec![false; n];
        for j in 0..n {
            let i = if deepest_first { n - 1 - j } else { j };
            let (k, w) = blocks[i];
            readmitted[i] = match self {
                Policy::S3Fifo { p, .. } => p.insert(k, w),
                Policy::Lru { p, .. } => {
                    p.insert(k, w);
                    false
                }
                Policy::TinyLfu { p, .. } => p.insert(k, w),
                Policy::Duel { p, .. } => p.insert(k, w),
            };
        }
        readmitted
    }

    /// One block made visible outside a save (a block staged back from SSD).
    pub fn insert(&mut self, key: K, weight: u64) -> bool {
        self.insert_chain(&[(key, weight)])[0]
    }

    /// A lookup's hit blocks, in chain order.
    pub fn touch_chain(&mut self, keys: &[K]) {
        let deepest_first = self.deepest_first();
        let mut touch = |k: &K| match self {
            Policy::S3Fifo { p, .. } => p.touch(k),
            Policy::Lru { p, .. } => {
                p.touch(k);
            }
            Policy::TinyLfu { p, .. } => p.touch(k),
            Policy::Duel { p, .. } => p.touch(k),
        };
        if deepest_first {
            keys.iter().rev().for_each(&mut touch);
        } else {
            keys.iter().for_each(&mut touch);
        }
    }

    /// Forget a block (explicit removal, not eviction).
    pub fn remove(&mut self, key: &K) {
        match self {
            Policy::S3Fifo { p, .. } => p.remove(key),
            Policy::Lru { p, .. } => p.remove(key),
            Policy::TinyLfu { p, .. } => p.remove(key),
            Policy::Duel { p, .. } => p.remove(key),
        }
    }

    /// Choose and forget one victim that `pinned` does not protect.
    pub fn evict_one(&mut self, pinned: impl FnMut(&K) -> bool) -> Option<K> {
        match self {
            Policy::S3Fifo { p, .. } => p.evict_one(pinned),
            Policy::Lru { p, .. } => p.evict_one(pinned),
            Policy::TinyLfu { p, .. } => p.evict_one(pinned),
            Policy::Duel { p, .. } => p.evict_one(pinned),
        }
    }

    /// The coldest blocks for which `wanted` holds, up to `limit_bytes` of them, in
    /// the order eviction would take them.
    pub fn coldest(&self, limit_bytes: u64, wanted: impl FnMut(&K) -> bool) -> Vec<K> {
        match self {
            Policy::S3Fifo { p, .. } => p.coldest(limit_bytes, wanted),
            Policy::Lru { p, .. } => p.coldest(limit_bytes, wanted),
            Policy::TinyLfu { p, .. } => p.coldest(limit_bytes, wanted),
            Policy::Duel { p, .. } => p.coldest(limit_bytes, wanted),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for k in PolicyKind::ALL {
            assert_eq!(k.name().parse::<PolicyKind>(), Ok(k));
        }
        let err = "belady".parse::<PolicyKind>().expect_err("unknown");
        assert!(err.contains("s3fifo") && err.contains("belady"), "{err}");
    }

    #[test]
    fn chain_order_decides_whether_a_chain_leaves_tail_or_head_first() {
        // One save of a 4-block chain, then pressure: in chain order LRU evicts the
        // head first (stranding the rest); deepest first, the tail goes first.
        for (kind, first) in [(PolicyKind::Lru, 0u32), (PolicyKind::LruChain, 3)] {
            let mut p = Policy::new(kind, 40);
            p.insert_chain(&[(0u32, 10), (1, 10), (2, 10), (3, 10)]);
            assert_eq!(p.evict_one(|_| false), Some(first), "{kind}");
        }
        // A hit on the chain keeps the head hot in lru-chain.
        let mut p = Policy::new(PolicyKind::LruChain, 40);
        p.insert_chain(&[(0u32, 10), (1, 10)]);
        p.insert_chain(&[(5u32, 10)]);
        p.touch_chain(&[0, 1]);
        assert_eq!(p.evict_one(|_| false), Some(5));
        assert_eq!(p.evict_one(|_| false), Some(1));
        assert_eq!(p.evict_one(|k| *k == 0), None);
    }
}
