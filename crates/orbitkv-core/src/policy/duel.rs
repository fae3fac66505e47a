//! Set dueling among several policies (Qureshi et al., "Adaptive Insertion
//! Policies", ISCA'07, applied to whole policies): S3-FIFO with a small queue of
//! 5, 10, 20 or 40 % of the capacity, and LRU. One S3-FIFO whose small-queue
//! share follows the leader tracks every resident entry and also keeps their
//! recency, so either S3-FIFO or LRU decides each eviction over the same set,
//! with one map lookup per hit ([`S3Fifo::with_recency`]).
//!
//! The leader is found by *shadows*: one small independent cache per candidate,
//! 1/`SAMPLE` of the capacity, fed only the keys whose hash falls in a 1/`SAMPLE`
//! sample (each save or hit of a sampled key is one access to every shadow).
//! Each shadow counts its hits; the counts halve every `WINDOW` sampled accesses,
//! so the leader follows the workload. Ties keep the current leader.
//!
//! A shadow scores a chain as a prefix cache serves it: the sampled blocks of one
//! lookup's hit or one save ([`Duel::begin_chain`] … [`Duel::end_chain`]) count
//! up to the shadow's first miss among them, and blocks it holds behind that miss
//! are not touched. Counted key by key instead, a candidate that leaves holes in
//! chains (S3-FIFO's FIFO order evicts a chain's older blocks, often near its
//! head) scored as if it served the blocks behind the holes, and on interleaved
//! sessions `duel` followed it to about 0.01 below LRU. Holes at blocks outside
//! the sample stay invisible, so the shadows still see less of that loss than
//! the real cache does (`docs/performance.md`).
//!
//! Measured on the traces (`benches/trace_sim.rs`): S3-FIFO with a small share
//! leads in small caches (one-time blocks crowd out returning ones), a larger
//! share or LRU in large caches (first returns after long gaps). Every S3-FIFO
//! here keeps a ghost history of 4× the capacity.
//!
//! Cost: a hit is one map lookup, a frequency bump and a move to the end of the
//! recency list. A key's sample hash is taken at its insert; the entry keeps
//! one bit, whether it is in the sample (a spare bit of its S3-FIFO slot, where
//! the whole hash cost 8 bytes a block), and a hit on a sampled key (1 in
//! `SAMPLE`) hashes it again, with the same hasher: the same hash. Such a hit
//! is also an access to the five shadows, which know a key by that 64-bit hash
//! (cheaper to hash again than the key; two sampled keys colliding would only
//! merge two shadow entries).

use std::hash::{BuildHasher, Hash};

use super::{Lru, S3Fifo};

const SAMPLE: u64 = 16;
const WINDOW: u64 = 4096;
const GHOST_X: u64 = 4;
/// The S3-FIFO candidates' small-queue shares in percent; the last candidate is LRU.
const SMALL_PCTS: [u64; 4] = [5, 10, 20, 40];
const LRU: usize = SMALL_PCTS.len();

#[derive(Debug, Clone)]
pub struct Duel<K> {
    /// The real policy: S3-FIFO with a recency order (LRU over the same entries).
    s3: S3Fifo<K>,
    /// Keyed by the sample hash (see the module comment).
    shadows: Vec<S3Fifo<u64>>,
    shadow_lru: Lru<u64>,
    shadow_capacity: u64,
    /// Picks the sample; seeded per process unless a seed is given (the Manager's
    /// `--cache-policy-seed`), so clients cannot aim keys at it.
    hasher: foldhash::fast::SeedableRandomState,
    hits: [u64; LRU + 1],
    accesses: u64,
    leader: usize,
    /// The sampled accesses `(hash, weight)` of the chain being told (between
    /// [`Duel::begin_chain`] and [`Duel::end_chain`]), in the order told.
    chain: Vec<(u64, u64)>,
    in_chain: bool,
}

impl<K: Copy + Eq + Hash + Ord> Duel<K> {
    /// A duel whose sample is drawn with a random per-process seed.
    pub fn new(capacity_bytes: u64) -> Self {
        Self::with_seed(capacity_bytes, None)
    }

    /// A duel whose sample is drawn with `seed` (the same keys in every process
    /// and run: reproducible figures), or a random per-process seed for `None`.
    pub fn with_seed(capacity_bytes: u64, seed: Option<u64>) -> Self {
        let shadow_capacity = (capacity_bytes / SAMPLE).max(1);
        let leader = 1; // S3-FIFO, 10 %, until the shadows say otherwise
        Duel {
            s3: S3Fifo::tuned(
                capacity_bytes,
                SMALL_PCTS[leader],
                capacity_bytes.saturating_mul(GHOST_X),
            )
            .with_recency(),
            shadows: SMALL_PCTS
                .iter()
                .map(|&pct| S3Fifo::tuned(shadow_capacity, pct, shadow_capacity.saturating_mul(GHOST_X)))
                .collect(),
            shadow_lru: Lru::new(),
            shadow_capacity,
            hasher: crate::map::policy_hash_state(seed),
            hits: [0; LRU + 1],
            accesses: 0,
            leader,
            chain: Vec::new(),
            in_chain: false,
        }
    }

    /// The leading candidate: `Some(pct)` for S3-FIFO with that small-queue share,
    /// `None` for LRU.
    pub fn leader(&self) -> Option<u64> {
        SMALL_PCTS.get(self.leader).copied()
    }

    pub fn len(&self) -> usize {
        self.s3.len()
    }

    /// Approximate heap bytes: (tracked entries, their ghost history, the shadows
    /// with their own ghosts).
    pub fn heap_bytes(&self) -> (u64, u64, u64) {
        let (tracked, ghost) = self.s3.heap_bytes();
        let shadows = self
            .shadows
            .iter()
            .map(|s| {
                let (t, g) = s.heap_bytes();
                t + g
            })
            .sum::<u64>()
            + self.shadow_lru.heap_bytes();
        (tracked, ghost, shadows)
    }

    /// Room for `n` tracked entries (the shadows: their 1/`SAMPLE` share).
    pub fn reserve(&mut self, n: usize) {
        self.s3.reserve(n);
        let shadow_n = n / SAMPLE as usize;
        for sh in &mut self.shadows {
            sh.reserve(shadow_n);
        }
    }

    /// The weight `key` is tracked with.
    pub fn weight(&self, key: &K) -> Option<u64> {
        self.s3.weight(key)
    }

    /// The tracked entries' weight.
    pub fn bytes(&self) -> u64 {
        self.s3.bytes()
    }

    pub fn is_empty(&self) -> bool {
        self.s3.is_empty()
    }

    pub fn contains(&self, key: &K) -> bool {
        self.s3.contains(key)
    }

    fn in_sample(hash: u64) -> bool {
        hash.is_multiple_of(SAMPLE)
    }

    /// The sampled blocks of one lookup's hit or one save, `chain` in chain
    /// order (prefix first), applied to every shadow as a prefix cache would
    /// serve them: a shadow scores the blocks before its first miss in the chain,
    /// and does not touch the blocks it holds after that miss (a lookup stops at
    /// its first miss; a save does not touch blocks already present). Counting
    /// every present key instead would score a candidate that leaves holes in
    /// chains as if it served the blocks behind them. Updates are applied in
    /// the order the real policy was told (`deepest_first`: tail first).
    fn shadow_chain(&mut self, chain: &[(u64, u64)], deepest_first: bool) {
        let cap = self.shadow_capacity;
        for (i, sh) in self.shadows.iter_mut().enumerate() {
            // An S3-FIFO hit only counts (no reordering), so the served prefix is
            // touched in chain order as it is found: one lookup per hit.
            let served = chain.iter().take_while(|(k, _)| sh.touch(k)).count();
            self.hits[i] += served as u64;
            apply(&chain[served..], deepest_first, |_, &(k, w)| {
                if !sh.contains(&k) {
                    sh.insert(k, w);
                    while sh.bytes() > cap && sh.evict_one(|_| false).is_some() {}
                }
            });
        }
        // LRU's touches reorder, so they follow the order the real policy was told.
        let lru = &mut self.shadow_lru;
        let served = chain.iter().take_while(|(k, _)| lru.contains(k)).count();
        self.hits[LRU] += served as u64;
        apply(chain, deepest_first, |j, &(k, w)| {
            if j < served {
                lru.touch(&k);
            } else if !lru.contains(&k) {
                lru.insert(k, w);
                while lru.bytes() > cap && lru.evict_one(|_| false).is_some() {}
            }
        });
        self.accesses += chain.len() as u64;
        while self.accesses >= WINDOW {
            self.accesses -= WINDOW;
            self.hits.iter_mut().for_each(|h| *h /= 2);
        }
        let best = (0..=LRU)
            .max_by_key(|&i| (self.hits[i], i == self.leader))
            .unwrap_or(self.leader);
        if best != self.leader {
            self.leader = best;
            if let Some(&pct) = SMALL_PCTS.get(best) {
                self.s3.set_small_pct(pct);
            }
        }
    }

    /// The next inserts and touches are one chain (one save, or one lookup's
    /// hit), told in the order the caller gives; [`Self::end_chain`] scores it.
    pub fn begin_chain(&mut self) {
        self.in_chain = true;
        self.chain.clear();
    }

    /// The chain begun by [`Self::begin_chain`] is complete; `deepest_first`:
    /// it was told tail first.
    pub fn end_chain(&mut self, deepest_first: bool) {
        self.in_chain = false;
        let mut chain = std::mem::take(&mut self.chain);
        if !chain.is_empty() {
            if deepest_first {
                chain.reverse();
            }
            self.shadow_chain(&chain, deepest_first);
        }
        chain.clear();
        self.chain = chain;
    }

    /// A sampled key was inserted or hit: scored with its chain, or alone.
    fn sampled(&mut self, hash: u64, weight: u64) {
        if self.in_chain {
            self.chain.push((hash, weight));
        } else {
            self.shadow_chain(&[(hash, weight)], false);
        }
    }

    /// Track a newly visible entry (a save). Returns `true` when S3-FIFO's ghost
    /// remembered it (evidence of reuse).
    pub fn insert(&mut self, key: K, weight: u64) -> bool {
        if self.s3.contains(&key) {
            return false;
        }
        let hash = self.hasher.hash_one(key);
        if Self::in_sample(hash) {
            self.sampled(hash, weight);
        }
        self.s3.insert_marked(key, weight, Self::in_sample(hash))
    }

    /// Record a hit.
    pub fn touch(&mut self, key: &K) -> bool {
        let Some((weight, sampled)) = self.s3.touch_marked(key) else {
            return false;
        };
        if sampled {
            // The hash taken at its insert (the sample's hasher never changes).
            let hash = self.hasher.hash_one(key);
            debug_assert!(Self::in_sample(hash));
            self.sampled(hash, weight);
        }
        true
    }

    /// Forget an entry (explicit removal, not eviction).
    pub fn remove(&mut self, key: &K) {
        self.s3.remove(key);
    }

    /// Choose and forget one victim that `pinned` does not protect.
    pub fn evict_one(&mut self, pinned: impl FnMut(&K) -> bool) -> Option<K> {
        if self.leader == LRU {
            self.s3.evict_least_recent(pinned)
        } else {
            self.s3.evict_one(pinned)
        }
    }

    /// The two cold orders [`Self::coldest`] lists, leader first: 0 is
    /// S3-FIFO's, 1 the recency order.
    pub fn cold_orders(&self) -> [usize; 2] {
        if self.leader == LRU { [1, 0] } else { [0, 1] }
    }

    /// Cold order `which` (see [`Self::cold_orders`]).
    pub fn cold_order(&self, which: usize) -> super::ColdOrder<'_, K> {
        if which == 1 {
            Box::new(self.s3.cold_order_by_recency())
        } else {
            Box::new(self.s3.cold_order())
        }
    }

    /// The entries the leader would evict first (see the policies), then those
    /// the other order would: the leader changes with the shadows' hits,
    /// and a spill-ahead that listed only the current leader's cold end would
    /// miss what the next leader evicts.
    pub fn coldest(&self, limit_bytes: u64, mut wanted: impl FnMut(&K) -> bool) -> Vec<K> {
        let (mut first, second) = if self.leader == LRU {
            (
                self.s3.coldest_by_recency(limit_bytes, &mut wanted),
                self.s3.coldest(limit_bytes, &mut wanted),
            )
        } else {
            (
                self.s3.coldest(limit_bytes, &mut wanted),
                self.s3.coldest_by_recency(limit_bytes, &mut wanted),
            )
        };
        let listed: std::collections::HashSet<K> = first.iter().copied().collect();
        first.extend(second.into_iter().filter(|k| !listed.contains(k)));
        first
    }
}

/// Visit `chain`'s blocks with their chain index, tail first when `deepest_first`.
fn apply(chain: &[(u64, u64)], deepest_first: bool, mut f: impl FnMut(usize, &(u64, u64))) {
    if deepest_first {
        chain.iter().enumerate().rev().for_each(|(j, a)| f(j, a));
    } else {
        chain.iter().enumerate().for_each(|(j, a)| f(j, a));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn either_leader_evicts_unpinned_entries_and_forgets_them() {
        let mut p = Duel::new(10 * 160);
        for round in 0..50u32 {
            for k in 0..12u32 {
                let key = round * 7 + k;
                p.insert(key, 10);
                p.touch(&(key / 2));
            }
            // Alternate the leader so that both orders evict.
            p.leader = (round as usize) % (LRU + 1);
            while p.bytes() > 10 * 160 {
                let v = p.evict_one(|k| k % 5 == 0).expect("a victim");
                assert!(v % 5 != 0 && !p.contains(&v), "{v}");
            }
            assert_eq!(p.bytes(), 10 * p.len() as u64);
        }
        for leader in [0, LRU] {
            p.leader = leader;
            let pinned = |k: &u32| *k != 1000;
            p.insert(1000, 10);
            assert_eq!(p.evict_one(pinned), Some(1000));
            assert!(!p.contains(&1000));
        }
        while p.evict_one(|k| k % 5 == 0).is_some() {}
        assert!(!p.is_empty() && p.evict_one(|_| true).is_none());
    }

    /// Drive a duel as the cache does: hit → touch, miss → insert and evict to capacity.
    fn access(p: &mut Duel<u64>, k: u64, capacity: u64) {
        if p.contains(&k) {
            p.touch(&k);
        } else {
            p.insert(k, 100);
            while p.bytes() > capacity {
                p.evict_one(|_| false);
            }
        }
    }

    /// A loop over more keys than fit: LRU never hits, S3-FIFO keeps part of the
    /// loop in main, so an S3-FIFO candidate leads. A hot set that fits, with a
    /// one-time key between every two hot ones: LRU keeps the hot set as well as
    /// any, and S3-FIFO's small queue (5–40 %) still holds it, so nobody loses
    /// much; what is checked there is only that the leader is a real candidate.
    #[test]
    fn the_leader_follows_the_shadows_hits() {
        let capacity = 64 * SAMPLE * 100;
        let mut p: Duel<u64> = Duel::new(capacity);
        p.hasher = foldhash::fast::SeedableRandomState::fixed(); // the same sample every run
        for _ in 0..40 {
            for k in 0..(80 * SAMPLE) {
                access(&mut p, k, capacity);
            }
        }
        assert!(
            p.leader().is_some(),
            "S3-FIFO leads on a loop larger than the cache: {:?}",
            p.hits
        );
        assert!(p.hits[LRU] < p.hits[p.leader], "{:?}", p.hits);
        // Now a recency-friendly stream: recently used keys come back soon, in a
        // sliding window narrower than the cache. LRU hits as much as any.
        let mut next = 1_000_000u64;
        for i in 0..200_000u64 {
            let k = if i % 2 == 0 { next - (i % 7) * 13 - 1 } else { next };
            if i % 2 == 1 {
                next += 1;
            }
            access(&mut p, k, capacity);
        }
        assert!(
            p.hits[LRU] >= *p.hits.iter().max().unwrap_or(&0) / 2,
            "{:?}",
            p.hits
        );
    }

    /// A shadow scores the blocks before its first miss in a chain, not every
    /// sampled key it holds, and does not touch the blocks behind the miss.
    #[test]
    fn shadows_score_the_prefix_a_chain_would_be_served() {
        let w = 10;
        let mut p: Duel<u32> = Duel::with_seed(4 * SAMPLE * w, Some(1)); // shadows hold 4 keys
        let chain = [(1u64, w), (2, w), (3, w)];
        p.shadow_chain(&chain, true);
        assert_eq!(p.hits, [0; LRU + 1], "first sight: nothing served");
        for sh in &mut p.shadows {
            sh.remove(&2);
        }
        p.shadow_lru.remove(&2);
        p.shadow_chain(&chain, true);
        assert_eq!(p.hits, [1; LRU + 1], "a hole at 2: 3 is held but not served");
        p.shadow_chain(&chain, true);
        assert_eq!(p.hits, [4; LRU + 1], "2 saved again: the whole chain is served");

        // Behind a miss, a held block is not touched: LRU evicts it first.
        let mut p: Duel<u32> = Duel::with_seed(4 * SAMPLE * w, Some(1));
        p.shadow_chain(&[(1, w), (2, w), (3, w)], false); // least recent first: 1, 2, 3
        p.shadow_chain(&[(9, w), (1, w)], false); // 9 misses; 1 stays least recent
        p.shadow_chain(&[(8, w)], false);
        assert!(!p.shadow_lru.contains(&1) && p.shadow_lru.contains(&2));
        assert_eq!(p.hits[LRU], 0);
    }

    /// Between `begin_chain` and `end_chain` the sampled accesses wait and are
    /// scored together, whatever order the caller told them in.
    #[test]
    fn a_chain_told_tail_first_is_scored_in_chain_order() {
        let w = 10;
        let mut p: Duel<u32> = Duel::with_seed(64 * SAMPLE * w, Some(5));
        let sampled: Vec<u32> = (0..10_000u32)
            .filter(|k| Duel::<u32>::in_sample(p.hasher.hash_one(k)))
            .take(3)
            .collect();
        assert_eq!(sampled.len(), 3);
        let save = |p: &mut Duel<u32>| {
            p.begin_chain();
            for k in sampled.iter().rev() {
                p.insert(*k, w);
            }
            p.end_chain(true);
        };
        save(&mut p);
        assert!(p.chain.is_empty() && !p.in_chain);
        assert_eq!(p.hits, [0; LRU + 1]);
        // A lookup that hits all three, told tail first: three served in every shadow.
        p.begin_chain();
        for k in sampled.iter().rev() {
            assert!(p.touch(k));
        }
        assert_eq!(p.hits, [0; LRU + 1], "nothing scored before end_chain");
        p.end_chain(true);
        assert_eq!(p.hits, [3; LRU + 1]);
    }

    /// The spill-ahead list: the leader's cold end, then the other order's,
    /// each key once.
    #[test]
    fn coldest_lists_the_leaders_cold_end_then_the_others() {
        let mut p: Duel<u32> = Duel::with_seed(100 * 10, Some(3));
        for k in 0..100u32 {
            p.insert(k, 10);
        }
        for k in (0..40u32).step_by(3) {
            p.touch(&k);
        }
        // S3-FIFO lists only unhit entries; the recency order lists the hit
        // ones too, after the rest.
        for leader in [1, LRU] {
            p.leader = leader;
            let (first, second) = if leader == LRU {
                (
                    p.s3.coldest_by_recency(u64::MAX, |_| true),
                    p.s3.coldest(u64::MAX, |_| true),
                )
            } else {
                (
                    p.s3.coldest(u64::MAX, |_| true),
                    p.s3.coldest_by_recency(u64::MAX, |_| true),
                )
            };
            assert_ne!(first, second);
            let listed = p.coldest(u64::MAX, |_| true);
            assert_eq!(&listed[..first.len()], &first[..]);
            let mut expected = first.clone();
            expected.extend(second.iter().filter(|k| !first.contains(k)));
            assert_eq!(listed, expected);
            assert_eq!(listed.len(), 100);
        }
    }
}
