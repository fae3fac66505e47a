//! Which DRAM-resident blocks leave first. The cache (`CacheState`) tells the
//! policy what happens to blocks (committed, hit, removed) in chain order (a
//! save's or a lookup's blocks, prefix first) and asks it for victims; the
//! policy never frees anything itself.
//!
//! Candidates are compared on real traces by `benches/trace_sim.rs`, which drives
//! `CacheState` with each [`PolicyKind`]; `docs/performance.md` has the figures
//! that chose the default.

mod duel;
mod ghost;
mod inner;
mod lru;
mod retention;
mod s3fifo;
mod slab;
mod tinylfu;

use std::fmt;
use std::hash::Hash;
use std::str::FromStr;

pub use duel::Duel;
use inner::{Inner, Recipe};
pub use lru::Lru;
use retention::{Held, Retention};
pub use retention::{Hold, RetentionStats};
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

/// Approximate heap bytes of a [`Policy`], by part (both instances with tiers).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PolicyHeap {
    /// Entries of tracked blocks: maps, slabs, queues, recency links.
    pub tracked: u64,
    /// Ghost histories of evicted keys (S3-FIFO kinds, `duel`'s real policy) or
    /// the frequency sketch (`tinylfu`).
    pub ghost: u64,
    /// `duel`'s sampled shadow caches, their ghosts included.
    pub shadows: u64,
}

impl PolicyHeap {
    pub fn total(&self) -> u64 {
        self.tracked + self.ghost + self.shadows
    }
}

/// One position of a cold order (the order eviction reaches entries in):
/// `Some((key, weight))` for an entry that may be listed, `None` for one that
/// never is (a stale queue element, an S3-FIFO entry with hits).
pub type ColdItem<K> = Option<(K, u64)>;

/// A cold order of one policy, walked from the end eviction reaches first.
pub type ColdOrder<'a, K> = Box<dyn Iterator<Item = ColdItem<K>> + 'a>;

/// One step of a walk over a cold order ([`Policy::coldest_step`]).
#[derive(Debug)]
pub struct ColdChunk<K> {
    /// Entries `wanted` accepted, coldest first.
    pub keys: Vec<K>,
    /// Their weight.
    pub bytes: u64,
    /// Positions of the order this step went through.
    pub visited: usize,
    /// The order ended or `limit_bytes` was reached: the walk of it is complete.
    pub end: bool,
}

/// The positions of `order` after the first `skip` (passed over without a
/// look), at most `max_visit` of them, listing those `wanted` accepts until
/// their weight reaches `limit_bytes`.
pub fn walk_cold<K>(
    order: impl Iterator<Item = ColdItem<K>>,
    skip: usize,
    max_visit: usize,
    limit_bytes: u64,
    mut wanted: impl FnMut(&K) -> bool,
) -> ColdChunk<K> {
    let mut c = ColdChunk {
        keys: Vec::new(),
        bytes: 0,
        visited: 0,
        end: false,
    };
    let mut order = order.skip(skip);
    loop {
        if c.bytes >= limit_bytes {
            c.end = true;
            break;
        }
        if c.visited == max_visit {
            break;
        }
        let Some(item) = order.next() else {
            c.end = true;
            break;
        };
        c.visited += 1;
        if let Some((k, w)) = item
            && wanted(&k)
        {
            c.bytes += w;
            c.keys.push(k);
        }
    }
    c
}

/// The policy instance a `CacheState` owns: one over the DRAM-resident blocks
/// (which leave DRAM first) and, once an SSD tier is enabled
/// ([`Policy::enable_tiers`]), a second of the same kind over every visible
/// block with the capacity of DRAM + SSD (which blocks the two tiers keep at
/// all). Both are told the same saves and hits in the same order, so the SSD
/// admits what the combined policy still holds when DRAM lets it go, and drops
/// what that policy evicts: the two tiers decided as one capacity.
#[derive(Debug, Clone)]
pub struct Policy<K> {
    dram: Inner<K>,
    deepest_first: bool,
    recipe: Recipe,
    /// The seed of `duel`'s sample and `tinylfu`'s sketch (`None`: random per
    /// process); the tiers' policy uses it too.
    seed: Option<u64>,
    /// The seed of the block index's hash (see [`Self::block_seed`]).
    block_seed: u64,
    tiers: Option<Tiers<K>>,
    /// Blocks held by retention hints, out of both inner policies.
    retention: Retention<K>,
}

#[derive(Debug, Clone)]
struct Tiers<K> {
    p: Inner<K>,
    capacity: u64,
}

impl<K: Copy + Eq + Hash + Ord> Policy<K> {
    fn from_recipe(recipe: Recipe, capacity_bytes: u64, deepest_first: bool, seed: Option<u64>) -> Self {
        Policy {
            dram: Inner::build(recipe, capacity_bytes, seed),
            deepest_first,
            recipe,
            seed,
            block_seed: seed.unwrap_or_else(|| {
                use std::hash::BuildHasher;
                std::collections::hash_map::RandomState::new().hash_one(0x0b17_u64)
            }),
            tiers: None,
            retention: Retention::new(),
        }
    }

    /// The seed the cache's block index hashes with: the policy knows blocks
    /// by references that carry the top bits of that hash (`BlockRef`), and
    /// its sample and history hash those bits, so the index must hash alike
    /// wherever the policy should decide alike. `seed` when given, else
    /// random, drawn once: a clone hashes as the original does.
    pub fn block_seed(&self) -> u64 {
        self.block_seed
    }

    /// An S3-FIFO with explicit parameters (the simulator's parameter sweeps).
    pub fn s3fifo_tuned(capacity_bytes: u64, small_pct: u64, ghost_bytes: u64, deepest_first: bool) -> Self {
        let ghost_x100 = ghost_bytes.saturating_mul(100) / capacity_bytes.max(1);
        Self::from_recipe(
            Recipe::S3Fifo {
                small_pct,
                ghost_x100,
            },
            capacity_bytes,
            deepest_first,
            None,
        )
    }

    /// A W-TinyLFU with explicit parameters (window share in percent, sketch aging
    /// period as a multiple of the capacity in entries).
    pub fn tinylfu_tuned(capacity_bytes: u64, window_pct: u64, sample_x: u64, deepest_first: bool) -> Self {
        Self::from_recipe(
            Recipe::TinyLfu { window_pct, sample_x },
            capacity_bytes,
            deepest_first,
            None,
        )
    }

    /// A policy of `kind`; `duel`'s sample and `tinylfu`'s sketch hash with a
    /// random per-process seed.
    pub fn new(kind: PolicyKind, capacity_bytes: u64) -> Self {
        Self::seeded(kind, capacity_bytes, None)
    }

    /// A policy of `kind` whose random choices (`duel`'s key sample, `tinylfu`'s
    /// sketch hash) are drawn with `seed` (`None`: random per process); the
    /// other kinds draw no random numbers, so with a seed every kind decides the
    /// same in every run.
    pub fn seeded(kind: PolicyKind, capacity_bytes: u64, seed: Option<u64>) -> Self {
        let deepest_first = !matches!(kind, PolicyKind::S3Fifo | PolicyKind::Lru);
        Self::from_recipe(Recipe::Kind(kind), capacity_bytes, deepest_first, seed)
    }

    /// Decide the SSD tier with the DRAM tier: a second policy of the same kind
    /// over `total_bytes` (DRAM + SSD) tracks every visible block from now on;
    /// `visible` are the blocks visible already, `(key, weight)`.
    pub fn enable_tiers(&mut self, total_bytes: u64, visible: impl IntoIterator<Item = (K, u64)>) {
        let mut p = Inner::build(self.recipe, total_bytes, self.seed);
        for (k, w) in visible {
            p.insert(k, w);
        }
        self.tiers = Some(Tiers {
            p,
            capacity: total_bytes,
        });
    }

    pub fn tiers_enabled(&self) -> bool {
        self.tiers.is_some()
    }

    /// Approximate heap bytes of both instances (DRAM, and the tiers' when enabled).
    pub fn heap_bytes(&self) -> PolicyHeap {
        let mut h = self.dram.heap_bytes();
        if let Some(t) = &self.tiers {
            let th = t.p.heap_bytes();
            h.tracked += th.tracked;
            h.ghost += th.ghost;
            h.shadows += th.shadows;
        }
        h.tracked += self.retention.heap_bytes();
        h
    }

    /// Room for `n` DRAM-resident blocks (S3-FIFO kinds and `duel`: their
    /// index and ghost history), so that no table grows under load.
    pub fn reserve(&mut self, n: usize) {
        self.dram.reserve(n);
    }

    /// DRAM-resident blocks tracked.
    pub fn len(&self) -> usize {
        self.dram.len() + self.retention.dram_len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Is `key` tracked as DRAM-resident?
    pub fn contains(&self, key: &K) -> bool {
        self.dram.contains(key) || self.retention.get(key).is_some_and(|h| h.in_dram)
    }

    /// Newly visible blocks of one save, `(key, weight)` in chain order (prefix
    /// first). Returns, per block in the same order, whether the policy had seen it
    /// evicted recently (evidence of reuse).
    pub fn insert_chain(&mut self, blocks: &[(K, u64)]) -> Vec<bool> {
        let n = blocks.len();
        let mut readmitted = vec![false; n];
        self.begin_chain();
        for j in 0..n {
            let i = if self.deepest_first { n - 1 - j } else { j };
            let (k, w) = blocks[i];
            if self.retention.set_in_dram(&k, true) {
                continue;
            }
            readmitted[i] = self.dram.insert(k, w);
            if let Some(t) = self.tiers.as_mut() {
                t.p.insert(k, w);
            }
        }
        self.end_chain();
        readmitted
    }

    /// One block made DRAM-resident outside a save (a block staged back from
    /// SSD): the tiers' policy already knows it (the lookup's hit told it).
    pub fn insert(&mut self, key: K, weight: u64) -> bool {
        if self.retention.set_in_dram(&key, true) {
            return false;
        }
        if let Some(t) = self.tiers.as_mut()
            && !t.p.contains(&key)
        {
            t.p.insert(key, weight);
        }
        self.dram.insert(key, weight)
    }

    /// A lookup's hit blocks (DRAM-resident or not), in chain order.
    pub fn touch_chain(&mut self, keys: &[K]) {
        // A hit on a done block: another request still uses it. A hit on a
        // kept one is remembered for its release.
        let held = if self.retention.is_empty() { &[][..] } else { keys };
        for k in held {
            match self.retention.get(k).map(|h| h.hold) {
                Some(Hold::Done) => {
                    self.release(k);
                    self.retention.count().done_revived_total += 1;
                }
                Some(Hold::Keep { .. }) => self.retention.hit(k),
                None => {}
            }
        }
        self.begin_chain();
        let (dram, tiers) = (&mut self.dram, &mut self.tiers);
        let mut touch = |k: &K| {
            dram.touch(k);
            if let Some(t) = tiers.as_mut()
                && !t.p.touch(k)
                && let Some(w) = dram.weight(k)
            {
                // The tiers had given it up while DRAM still held it: a hit is
                // evidence of reuse, so they keep it again.
                t.p.insert(*k, w);
            }
        };
        if self.deepest_first {
            keys.iter().rev().for_each(&mut touch);
        } else {
            keys.iter().for_each(&mut touch);
        }
        self.end_chain();
    }

    fn begin_chain(&mut self) {
        self.dram.begin_chain();
        if let Some(t) = self.tiers.as_mut() {
            t.p.begin_chain();
        }
    }

    fn end_chain(&mut self) {
        self.dram.end_chain(self.deepest_first);
        if let Some(t) = self.tiers.as_mut() {
            t.p.end_chain(self.deepest_first);
        }
    }

    /// Stop tracking a block in DRAM (explicit removal, not eviction).
    pub fn remove(&mut self, key: &K) {
        if !self.retention.set_in_dram(key, false) {
            self.dram.remove(key);
        }
    }

    /// The block is no longer visible at all: forget it in both policies.
    pub fn forget(&mut self, key: &K) {
        self.retention.take(key);
        self.dram.remove(key);
        if let Some(t) = self.tiers.as_mut() {
            t.p.remove(key);
        }
    }

    /// Choose and forget one DRAM victim that `pinned` does not protect.
    /// Done blocks leave first, kept blocks last (expected back last first).
    pub fn evict_one(&mut self, mut pinned: impl FnMut(&K) -> bool) -> Option<K> {
        if let Some(k) = self.retention.done_victim_dram(&mut pinned) {
            self.retention.set_in_dram(&k, false);
            self.retention.count().done_evicted_total += 1;
            return Some(k);
        }
        if let Some(k) = self.dram.evict_one(&mut pinned) {
            return Some(k);
        }
        let k = self.retention.kept_victim(|h| h.in_dram, &mut pinned)?;
        self.retention.set_in_dram(&k, false);
        self.retention.count().kept_evicted_total += 1;
        Some(k)
    }

    /// The coldest DRAM blocks for which `wanted` holds, up to `limit_bytes` of
    /// them, in the order eviction would take them.
    pub fn coldest(&self, limit_bytes: u64, wanted: impl FnMut(&K) -> bool) -> Vec<K> {
        self.dram.coldest(limit_bytes, wanted)
    }

    /// The cold orders [`Self::coldest`] lists, in its listing order (`duel`:
    /// the leading policy's, then the other's), for a walk in steps.
    pub fn cold_orders(&self) -> Vec<usize> {
        self.dram.cold_orders()
    }

    /// One step of a walk of DRAM's cold end in cold order `order` (from
    /// [`Self::cold_orders`]): see [`walk_cold`]. Walking each order in steps
    /// until its chunk ends, with `limit_bytes` less the weight listed so far,
    /// lists what [`Self::coldest`] lists when nothing changes in between.
    pub fn coldest_step(
        &self,
        order: usize,
        skip: usize,
        max_visit: usize,
        limit_bytes: u64,
        wanted: impl FnMut(&K) -> bool,
    ) -> ColdChunk<K> {
        walk_cold(self.dram.cold_order(order), skip, max_visit, limit_bytes, wanted)
    }

    /// Do the two tiers together still keep `key` (so DRAM should demote it to
    /// SSD rather than drop it)? Always true without tiers.
    pub fn tiers_keep(&self, key: &K) -> bool {
        match self.retention.get(key) {
            // A held block the tiers tracked stays ranked (done ones go first).
            Some(h) => self.tiers.is_none() || h.in_tiers,
            None => self.tiers.as_ref().is_none_or(|t| t.p.contains(key)),
        }
    }

    /// Track a visible block that is not DRAM-resident (adopted from SSD at start).
    pub fn tiers_insert(&mut self, key: K, weight: u64) {
        if let Some(t) = self.tiers.as_mut()
            && self.retention.get(&key).is_none()
            && !t.p.contains(&key)
        {
            t.p.insert(key, weight);
        }
    }

    /// Weight the tiers' policy tracks above its capacity (0 without tiers).
    pub fn tiers_excess(&self) -> u64 {
        self.tiers.as_ref().map_or(0, |t| {
            (t.p.bytes() + self.retention.tiers_bytes()).saturating_sub(t.capacity)
        })
    }

    /// Choose and forget one block the two tiers together no longer keep
    /// (`None` without tiers or when every tracked block is pinned).
    /// Done blocks go first, kept blocks last (expected back last first).
    pub fn tiers_evict_one(&mut self, mut pinned: impl FnMut(&K) -> bool) -> Option<K> {
        let t = self.tiers.as_mut()?;
        if let Some(k) = self.retention.done_victim_tiers(&mut pinned) {
            self.retention.clear_in_tiers(&k);
            return Some(k);
        }
        if let Some(k) = t.p.evict_one(&mut pinned) {
            return Some(k);
        }
        let k = self.retention.kept_victim(|h| h.in_tiers, &mut pinned)?;
        self.retention.clear_in_tiers(&k);
        Some(k)
    }

    /// Blocks the tiers' policy tracks (0 without tiers).
    pub fn tiers_len(&self) -> usize {
        self.tiers.as_ref().map_or(0, |t| t.p.len())
    }

    // ---- retention hints (see `retention.rs`) ------------------------------

    /// Cap the bytes kept by hints (0: hints are off and every keep is refused).
    pub fn set_retention_cap(&mut self, bytes: u64) {
        self.retention.set_cap(bytes);
    }

    pub fn retention_stats(&self) -> RetentionStats {
        self.retention.stats()
    }

    /// How `key` is held by a hint, if it is.
    pub fn hold_of(&self, key: &K) -> Option<Hold> {
        self.retention.get(key).map(|h| h.hold)
    }

    /// The earliest deadline of a kept block.
    pub fn next_hint_deadline(&self) -> Option<u64> {
        self.retention.next_deadline()
    }

    /// Keep the tracked blocks of `chain` (prefix first) until `until_ms`
    /// for `owner`; blocks already kept keep the later deadline. Returns how
    /// many blocks it applied to and how many it refused (the cap reached
    /// with nothing of `owner`'s expected back later); untracked blocks count
    /// as neither.
    pub fn hint_keep(&mut self, chain: &[K], owner: u32, until_ms: u64) -> (u32, u32) {
        let (mut applied, mut refused) = (0u32, 0u32);
        let keep = Hold::Keep { until_ms, owner };
        for k in chain {
            let weight = match self.retention.get(k) {
                Some(h) => match h.hold {
                    Hold::Keep {
                        until_ms: t,
                        owner: o,
                    } if o == owner => {
                        if t < until_ms {
                            self.retention.rehold(*k, keep);
                        }
                        applied += 1;
                        continue;
                    }
                    // Another owner's keys never meet this owner's chain (keys
                    // carry their namespace); refuse rather than take it over.
                    Hold::Keep { .. } => {
                        refused += 1;
                        continue;
                    }
                    Hold::Done => h.weight,
                },
                None => match self.tracked_weight(k) {
                    Some(w) => w,
                    None => continue,
                },
            };
            if !self.make_keep_room(owner, until_ms, weight) {
                refused += 1;
                continue;
            }
            if self.retention.get(k).is_some() {
                self.retention.rehold(*k, keep);
            } else {
                self.hold(*k, keep, weight);
            }
            applied += 1;
        }
        let c = self.retention.count();
        c.kept_total += u64::from(applied);
        c.refused_total += u64::from(refused);
        (applied, refused)
    }

    /// The tracked blocks of `chain` (prefix first) are not expected back:
    /// they leave before anything else, deepest first. Returns how many.
    pub fn hint_done(&mut self, chain: &[K]) -> u32 {
        let mut applied = 0u32;
        for k in chain.iter().rev() {
            match self.retention.get(k).map(|h| h.hold) {
                Some(Hold::Done) => {}
                Some(Hold::Keep { .. }) => self.retention.rehold(*k, Hold::Done),
                None => {
                    let Some(weight) = self.tracked_weight(k) else {
                        continue;
                    };
                    self.hold(*k, Hold::Done, weight);
                }
            }
            applied += 1;
        }
        self.retention.count().done_total += u64::from(applied);
        applied
    }

    /// Drop the hints on `chain`'s blocks: they return to the inner policies.
    pub fn hint_clear(&mut self, chain: &[K]) -> u32 {
        chain.iter().filter(|k| self.release(k)).count() as u32
    }

    /// Release kept blocks whose deadline is at or before `now_ms`.
    pub fn expire_hints(&mut self, now_ms: u64) -> usize {
        let due = self.retention.due(now_ms);
        for k in &due {
            self.release(k);
        }
        self.retention.count().expired_total += due.len() as u64;
        due.len()
    }

    /// Take a tracked block out of both inner policies into the retention table.
    fn hold(&mut self, k: K, hold: Hold, weight: u64) {
        let in_dram = self.dram.contains(&k);
        let in_tiers = self.tiers.as_ref().is_some_and(|t| t.p.contains(&k));
        self.dram.remove(&k);
        if let Some(t) = self.tiers.as_mut() {
            t.p.remove(&k);
        }
        let h = Held {
            hold,
            weight,
            in_dram,
            in_tiers,
            hits: 0,
        };
        self.retention.hold(k, h);
    }

    /// The weight of a block either inner policy tracks.
    fn tracked_weight(&self, k: &K) -> Option<u64> {
        self.dram
            .weight(k)
            .or_else(|| self.tiers.as_ref().and_then(|t| t.p.weight(k)))
    }

    /// Room under the cap for `weight` more bytes kept by `owner` until
    /// `until_ms`, displacing only `owner`'s blocks expected back later.
    fn make_keep_room(&mut self, owner: u32, until_ms: u64, weight: u64) -> bool {
        let cap = self.retention.cap();
        while self.retention.kept_bytes() + weight > cap {
            if self.retention.kept_of(owner) == 0 {
                return false;
            }
            let Some(v) = self.retention.displaceable(owner, until_ms) else {
                return false;
            };
            self.release(&v);
            self.retention.count().displaced_total += 1;
        }
        true
    }

    /// Stop holding `key` and give it back to the inner policies it was taken
    /// from as a block referenced again: a kept block is inserted and touched
    /// once for the hint and once per hit while held (at most 3 in all); a
    /// done block that was hit again is inserted and touched once. Returns
    /// whether it was held.
    fn release(&mut self, key: &K) -> bool {
        let Some(h) = self.retention.take(key) else {
            return false;
        };
        let touches = match h.hold {
            Hold::Keep { .. } => 1 + u32::from(h.hits).min(2),
            Hold::Done => 1,
        };
        if h.in_dram {
            self.dram.insert(*key, h.weight);
            (0..touches).for_each(|_| {
                self.dram.touch(key);
            });
        }
        if h.in_tiers
            && let Some(t) = self.tiers.as_mut()
        {
            t.p.insert(*key, h.weight);
            (0..touches).for_each(|_| {
                t.p.touch(key);
            });
        }
        true
    }
}

/// One xorshift64 step of the tests' pseudo-random streams: advances `x`
/// and returns its new value.
#[cfg(test)]
pub(crate) fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

#[cfg(test)]
mod tests;
