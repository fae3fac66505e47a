//! Set dueling between adaptive S3-FIFO and LRU (Qureshi et al., "Adaptive
//! Insertion Policies", ISCA'07, applied to whole policies): both track every
//! resident entry, and the one whose *shadow* has served more recently decides
//! each eviction; the other is told of the removal.
//!
//! The shadows are two small independent caches (one S3-FIFO, one LRU) of
//! 1/`SAMPLE` of the capacity that see only the keys whose hash falls in a
//! 1/`SAMPLE` sample: each save or hit of a sampled key is one access to both.
//! `score` moves toward the shadow that hit (saturating at ±`SCORE_MAX`), so the
//! choice follows the workload within about `SCORE_MAX` sampled accesses. S3-FIFO
//! wins where one-time entries crowd out returning ones (small caches); LRU where
//! the cache holds most of the reuse and S3-FIFO's small queue drops first
//! returns after long gaps (large caches).
//!
//! Cost: every operation is done by both policies, and 1 in `SAMPLE` keys also by
//! both shadows.

use std::hash::{BuildHasher, Hash};

use super::{Lru, S3Fifo};

const SAMPLE: u64 = 16;
const SCORE_MAX: i64 = 512;

#[derive(Debug, Clone)]
pub struct Duel<K> {
    s3: S3Fifo<K>,
    lru: Lru<K>,
    shadow_s3: S3Fifo<K>,
    shadow_lru: Lru<K>,
    shadow_capacity: u64,
    hasher: foldhash::fast::RandomState,
    /// > 0: LRU's shadow has been hitting more; ≤ 0: S3-FIFO decides.
    score: i64,
}

impl<K: Copy + Eq + Hash + Ord> Duel<K> {
    pub fn new(capacity_bytes: u64) -> Self {
        let shadow_capacity = (capacity_bytes / SAMPLE).max(1);
        Duel {
            s3: S3Fifo::adaptive(capacity_bytes, capacity_bytes),
            lru: Lru::new(),
            shadow_s3: S3Fifo::adaptive(shadow_capacity, shadow_capacity),
            shadow_lru: Lru::new(),
            shadow_capacity,
            hasher: foldhash::fast::RandomState::default(),
            score: 0,
        }
    }

    /// Whether LRU currently decides evictions.
    pub fn lru_leads(&self) -> bool {
        self.score > 0
    }

    pub fn len(&self) -> usize {
        self.s3.len()
    }

    pub fn is_empty(&self) -> bool {
        self.s3.is_empty()
    }

    pub fn contains(&self, key: &K) -> bool {
        self.s3.contains(key)
    }

    /// One access of a sampled key to both shadows.
    fn shadow_access(&mut self, key: K, weight: u64) {
        if self.hasher.hash_one(key) % SAMPLE != 0 {
            return;
        }
        let s3_hit = self.shadow_s3.contains(&key);
        if s3_hit {
            self.shadow_s3.touch(&key);
        } else {
            self.shadow_s3.insert(key, weight);
            while self.shadow_s3.bytes() > self.shadow_capacity
                && self.shadow_s3.evict_one(|_| false).is_some()
            {}
        }
        let lru_hit = self.shadow_lru.contains(&key);
        if lru_hit {
            self.shadow_lru.touch(&key);
        } else {
            self.shadow_lru.insert(key, weight);
            while self.shadow_lru.bytes() > self.shadow_capacity
                && self.shadow_lru.evict_one(|_| false).is_some()
            {}
        }
        match (lru_hit, s3_hit) {
            (true, false) => self.score = (self.score + 1).min(SCORE_MAX),
            (false, true) => self.score = (self.score - 1).max(-SCORE_MAX),
            _ => {}
        }
    }

    /// Track a newly visible entry (a save). Returns `true` when S3-FIFO's ghost
    /// remembered it (evidence of reuse).
    pub fn insert(&mut self, key: K, weight: u64) -> bool {
        if self.s3.contains(&key) {
            return false;
        }
        self.shadow_access(key, weight);
        self.lru.insert(key, weight);
        self.s3.insert(key, weight)
    }

    /// Record a hit.
    pub fn touch(&mut self, key: &K) {
        if !self.s3.contains(key) {
            return;
        }
        let weight = self.lru.weight(key).unwrap_or(1);
        self.shadow_access(*key, weight);
        self.s3.touch(key);
        self.lru.touch(key);
    }

    /// Forget an entry (explicit removal, not eviction).
    pub fn remove(&mut self, key: &K) {
        self.s3.remove(key);
        self.lru.remove(key);
    }

    /// Choose and forget one victim that `pinned` does not protect.
    pub fn evict_one(&mut self, pinned: impl FnMut(&K) -> bool) -> Option<K> {
        let victim = if self.lru_leads() {
            self.lru.evict_one(pinned)?
        } else {
            self.s3.evict_one(pinned)?
        };
        // The other policy forgets it without a ghost: it was not its choice.
        self.s3.remove(&victim);
        self.lru.remove(&victim);
        Some(victim)
    }

    /// The entries the leading policy would evict first (see the policies).
    pub fn coldest(&self, limit_bytes: u64, wanted: impl FnMut(&K) -> bool) -> Vec<K> {
        if self.lru_leads() {
            self.lru.coldest(limit_bytes, wanted)
        } else {
            self.s3.coldest(limit_bytes, wanted)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_policies_track_the_same_entries_whoever_evicts() {
        let mut p = Duel::new(10 * 160);
        for round in 0..50u32 {
            for k in 0..12u32 {
                let key = round * 7 + k;
                p.insert(key, 10);
                p.touch(&(key / 2));
            }
            while p.lru.bytes() > 10 * 160 {
                p.evict_one(|k| k % 5 == 0).expect("a victim");
            }
            assert_eq!(p.s3.len(), p.lru.len());
            assert_eq!(p.s3.bytes(), p.lru.bytes());
        }
        let pinned = |k: &u32| *k != 1000;
        p.insert(1000, 10);
        assert_eq!(p.evict_one(pinned), Some(1000));
        assert!(!p.s3.contains(&1000) && !p.lru.contains(&1000));
        assert_eq!(p.evict_one(|_| true), None);
    }

    /// A loop over slightly more keys than fit: LRU misses every time, S3-FIFO keeps
    /// part of the loop in main. Then a recency-friendly pattern: a small hot set
    /// among a stream where LRU and S3-FIFO both hit, so the score stays put; and
    /// the score leans to S3-FIFO on the loop.
    #[test]
    fn the_score_follows_the_shadow_that_hits() {
        let mut p: Duel<u64> = Duel::new(64 * SAMPLE * 100);
        for _ in 0..40 {
            for k in 0..(80 * SAMPLE) {
                if p.contains(&k) {
                    p.touch(&k);
                } else {
                    p.insert(k, 100);
                    while p.lru.bytes() > 64 * SAMPLE * 100 {
                        p.evict_one(|_| false);
                    }
                }
            }
        }
        assert!(
            p.score < 0,
            "S3-FIFO leads on a loop larger than the cache: {}",
            p.score
        );
        assert!(!p.lru_leads());
    }
}
