//! What a lookup, an acquire of DRAM-resident blocks and a release change while
//! the Manager holds its cache lock *shared* (many sessions at once): the lease
//! table (sharded), the hot counters (atomic) and the touch log. Pins and hit
//! counts are atomics in [`super::entries::Entry`]. Everything else in
//! [`super::CacheState`] changes only under the exclusive lock.
//!
//! The touch log keeps the policy current without making lookups wait on it: a
//! lookup records its chain here, and the chains are replayed into the policy
//! in grant order (lease ids come from one counter) by whoever holds the
//! policy's own mutex — the Manager's policy thread every millisecond, a
//! lookup that finds [`DRAIN_AT`] chains waiting (with `try_lock`: never
//! waiting for another replay), and every holder of the exclusive lock before
//! anything else. The log holds at
//! most [`LOG_CAP`] chains (see there: past it, touches are dropped, counted). The policy's set
//! of blocks changes only under the exclusive lock, which first replays
//! everything logged, so a replay under the shared lock only reorders blocks
//! the policy tracks; and with one session at a time the policy sees exactly
//! the sequence of exclusive lookups (`tests/concurrent.rs`).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::Counters;
use crate::keys::{BlockKey, LeaseId, SessionId};
use crate::policy::Policy;
use crate::table::BlockRef;

/// Chains waiting in the touch log at which a lookup replays them itself: the
/// Manager's policy thread replays every millisecond, so only a lookup that
/// finds it far behind does (1,024 chains, a few milliseconds of policy work).
pub(super) const DRAIN_AT: usize = 1024;

/// Chains the log holds at most. When lookups outpace the replays (hundreds of
/// thousands of lookups a second on many cores), a lookup that finds the log
/// full does not log its touch (counted in `policy_touches_dropped`): the
/// policy misses some recency, no lookup waits for it, and memory stays
/// bounded. A touch that makes a block due for an eager spill is always logged.
pub(super) const LOG_CAP: usize = 4096;

/// A poisoned shard only means a panic elsewhere; the data is consistent at
/// every method boundary (each critical section here is a single map call).
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(super) fn get_mut<T>(m: &mut Mutex<T>) -> &mut T {
    m.get_mut().unwrap_or_else(|p| p.into_inner())
}

/// Shards of the lease table and of the touch log: enough that sessions
/// running at once rarely meet on one.
pub(super) const SHARDS: usize = 64;

pub(super) fn shards<T: Default>() -> Box<[Mutex<T>]> {
    (0..SHARDS).map(|_| Mutex::new(T::default())).collect()
}

/// The leases of one session. Only that session's thread adds to it under the
/// shared lock, so its mutex is uncontended; the exclusive side uses `get_mut`.
#[derive(Debug, Default)]
pub(super) struct SessionLeases(Mutex<BTreeSet<LeaseId>>);

impl SessionLeases {
    pub(super) fn add(&self, l: LeaseId) {
        lock(&self.0).insert(l);
    }

    pub(super) fn drop_lease(&self, l: LeaseId) {
        lock(&self.0).remove(&l);
    }

    pub(super) fn get_mut(&mut self) -> &mut BTreeSet<LeaseId> {
        get_mut(&mut self.0)
    }

    pub(super) fn contains(&self, l: &LeaseId) -> bool {
        lock(&self.0).contains(l)
    }

    pub(super) fn is_empty(&self) -> bool {
        lock(&self.0).is_empty()
    }

    pub(super) fn snapshot(&self) -> Vec<LeaseId> {
        lock(&self.0).iter().copied().collect()
    }

    pub(super) fn into_inner(self) -> BTreeSet<LeaseId> {
        self.0.into_inner().unwrap_or_else(|p| p.into_inner())
    }
}

/// Counters that shared-lock operations move.
#[derive(Debug, Default)]
pub(super) struct HotCounters {
    pub(super) lookups: AtomicU64,
    pub(super) lookup_blocks: AtomicU64,
    pub(super) hit_blocks: AtomicU64,
    pub(super) ssd_hit_blocks: AtomicU64,
    pub(super) leases_granted: AtomicU64,
    pub(super) leases_retired: AtomicU64,
    pub(super) policy_touches_dropped: AtomicU64,
    pub(super) remote_due_dropped: AtomicU64,
}

impl HotCounters {
    pub(super) fn add(c: &AtomicU64, n: u64) {
        if n > 0 {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Take back `n` (saturating at 0).
    pub(super) fn sub(c: &AtomicU64, n: u64) {
        let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
            Some(v.saturating_sub(n))
        });
    }

    /// `base` (the exclusive-side counters) with these filled in.
    pub(super) fn merged(&self, base: &Counters) -> Counters {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Counters {
            lookups: get(&self.lookups),
            lookup_blocks: get(&self.lookup_blocks),
            hit_blocks: get(&self.hit_blocks),
            ssd_hit_blocks: get(&self.ssd_hit_blocks),
            leases_granted: get(&self.leases_granted),
            leases_retired: get(&self.leases_retired),
            policy_touches_dropped: get(&self.policy_touches_dropped),
            remote_due_dropped: get(&self.remote_due_dropped),
            ..base.clone()
        }
    }
}

/// One granted lease's effect on the policy, replayed later in grant order.
#[derive(Debug)]
pub(super) struct Touch {
    /// The lease id: grant order.
    pub(super) seq: u64,
    pub(super) chain: Vec<BlockRef>,
    /// Blocks whose hit count reached the SSD admission threshold with this
    /// grant (eager spill policy only).
    pub(super) spill: Vec<BlockKey>,
}

/// Chains granted under the shared lock, not yet applied to the policy.
#[derive(Debug)]
pub(super) struct TouchLog {
    shards: Box<[Mutex<Vec<Touch>>]>,
    pending: AtomicUsize,
}

impl Default for TouchLog {
    fn default() -> Self {
        TouchLog {
            shards: shards(),
            pending: AtomicUsize::new(0),
        }
    }
}

impl TouchLog {
    /// Log `t` unless the log is full and `t` carries no spill (`false`: dropped).
    pub(super) fn push(&self, s: SessionId, t: Touch) -> bool {
        if t.spill.is_empty() && self.pending() >= LOG_CAP {
            return false;
        }
        let mut shard = lock(&self.shards[(s.0 % SHARDS as u64) as usize]);
        shard.push(t);
        // Counted under the shard lock, so a drain's decrement never comes first.
        self.pending.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Every touch logged so far, in grant order, from the shared side.
    pub(super) fn take_shared(&self) -> Vec<Touch> {
        let mut all = Vec::new();
        for s in self.shards.iter() {
            let mut shard = lock(s);
            self.pending.fetch_sub(shard.len(), Ordering::Relaxed);
            all.append(&mut shard);
        }
        all.sort_unstable_by_key(|t| t.seq);
        all
    }

    pub(super) fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }

    /// Every recorded touch, in grant order.
    pub(super) fn take(&mut self) -> Vec<Touch> {
        if *self.pending.get_mut() == 0 {
            return Vec::new();
        }
        *self.pending.get_mut() = 0;
        let mut all: Vec<Touch> = self
            .shards
            .iter_mut()
            .flat_map(|s| get_mut(s).drain(..))
            .collect();
        all.sort_unstable_by_key(|t| t.seq);
        all
    }
}

/// The policy behind its own mutex: replays under the shared cache lock take
/// it; the exclusive side reaches it without locking.
#[derive(Debug)]
pub(super) struct PolicyCell {
    policy: Mutex<Policy<BlockRef>>,
    /// Blocks found due for an eager spill by replays under the shared lock;
    /// the exclusive side queues them (the spill queue is exclusive state).
    due_spills: Mutex<Vec<BlockKey>>,
}

impl PolicyCell {
    pub(super) fn new(policy: Policy<BlockRef>) -> Self {
        PolicyCell {
            policy: Mutex::new(policy),
            due_spills: Mutex::new(Vec::new()),
        }
    }

    pub(super) fn get(&mut self) -> &mut Policy<BlockRef> {
        get_mut(&mut self.policy)
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Policy<BlockRef>> {
        lock(&self.policy)
    }

    pub(super) fn policy_heap(&self) -> crate::policy::PolicyHeap {
        lock(&self.policy).heap_bytes()
    }

    /// Replay `log` into the policy unless another replay is running (`false`).
    pub(super) fn replay_shared(&self, log: &TouchLog) -> bool {
        let mut p = match self.policy.try_lock() {
            Ok(p) => p,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return false,
        };
        let mut due = Vec::new();
        for t in log.take_shared() {
            p.touch_chain(&t.chain);
            due.extend(t.spill);
        }
        drop(p);
        if !due.is_empty() {
            lock(&self.due_spills).extend(due);
        }
        true
    }

    /// Replay `log` (exclusive side); returns every block due for a spill,
    /// from this replay and from earlier shared ones, in order.
    pub(super) fn replay(&mut self, log: &mut TouchLog) -> Vec<BlockKey> {
        let mut due = std::mem::take(get_mut(&mut self.due_spills));
        let p = get_mut(&mut self.policy);
        for t in log.take() {
            p.touch_chain(&t.chain);
            due.extend(t.spill);
        }
        due
    }
}
