//! What a lookup, an acquire of DRAM-resident blocks and a release change while
//! the Manager holds its cache lock *shared* (many sessions at once): the lease
//! table (sharded), the hot counters (atomic) and the touch log. Pins and hit
//! counts are atomics in [`super::entries::Entry`]. Everything else in
//! [`super::CacheState`] changes only under the exclusive lock.
//!
//! The touch log keeps the policy exact: a lookup under the shared lock cannot
//! reorder the policy's queues, so it records its chain here and
//! [`super::CacheState::apply_touches`] replays every recorded chain in grant
//! order (lease ids come from one counter) before anything else changes. Since
//! only shared-lock work happens between two exclusive sections, the policy
//! sees the same sequence as if every lookup had taken the exclusive lock.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::Counters;
use super::leases::Lease;
use crate::keys::{BlockKey, LeaseId, SessionId};
use crate::map::Map;

/// A poisoned shard only means a panic elsewhere; the data is consistent at
/// every method boundary (each critical section here is a single map call).
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn get_mut<T>(m: &mut Mutex<T>) -> &mut T {
    m.get_mut().unwrap_or_else(|p| p.into_inner())
}

/// Shards of the lease table and of the touch log: enough that sessions
/// running at once rarely meet on one.
const SHARDS: usize = 64;

fn shards<T: Default>() -> Box<[Mutex<T>]> {
    (0..SHARDS).map(|_| Mutex::new(T::default())).collect()
}

/// Every live lease, sharded by id. Under the exclusive lock the shards are
/// reached without locking (`&mut self`).
#[derive(Debug)]
pub(super) struct LeaseTable {
    shards: Box<[Mutex<Map<LeaseId, Lease>>]>,
}

impl Default for LeaseTable {
    fn default() -> Self {
        LeaseTable { shards: shards() }
    }
}

impl LeaseTable {
    fn shard(&self, id: LeaseId) -> &Mutex<Map<LeaseId, Lease>> {
        &self.shards[(id.0 % SHARDS as u64) as usize]
    }

    pub(super) fn insert(&self, id: LeaseId, lease: Lease) {
        lock(self.shard(id)).insert(id, lease);
    }

    pub(super) fn remove(&mut self, id: LeaseId) -> Option<Lease> {
        let i = (id.0 % SHARDS as u64) as usize;
        get_mut(&mut self.shards[i]).remove(&id)
    }

    pub(super) fn get_mut(&mut self, id: LeaseId) -> Option<&mut Lease> {
        let i = (id.0 % SHARDS as u64) as usize;
        get_mut(&mut self.shards[i]).get_mut(&id)
    }

    /// Run `f` on the lease under its shard's lock (`None`: no such lease).
    pub(super) fn with<R>(&self, id: LeaseId, f: impl FnOnce(&mut Lease) -> R) -> Option<R> {
        lock(self.shard(id)).get_mut(&id).map(f)
    }

    /// Remove the lease if `f` says so, deciding under its shard's lock (so no
    /// other shared-lock caller can end it in between). `Ok(None)`: kept.
    pub(super) fn take_if<E>(
        &self,
        id: LeaseId,
        unknown: E,
        f: impl FnOnce(&Lease) -> Result<bool, E>,
    ) -> Result<Option<Lease>, E> {
        let mut shard = lock(self.shard(id));
        let lease = shard.get(&id).ok_or(unknown)?;
        if f(lease)? {
            Ok(shard.remove(&id))
        } else {
            Ok(None)
        }
    }

    pub(super) fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }

    /// Every lease (exclusive lock held: no shard lock taken).
    pub(super) fn iter(&mut self) -> impl Iterator<Item = (&LeaseId, &Lease)> {
        self.shards.iter_mut().flat_map(|s| get_mut(s).iter())
    }

    /// Visit every lease from `&self` (each shard locked in turn).
    pub(super) fn try_for_each<E>(
        &self,
        mut f: impl FnMut(LeaseId, &Lease) -> Result<(), E>,
    ) -> Result<(), E> {
        for s in self.shards.iter() {
            for (id, l) in lock(s).iter() {
                f(*id, l)?;
            }
        }
        Ok(())
    }
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
}

impl HotCounters {
    pub(super) fn add(c: &AtomicU64, n: u64) {
        if n > 0 {
            c.fetch_add(n, Ordering::Relaxed);
        }
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
            ..base.clone()
        }
    }
}

/// One granted lease's effect on the policy, replayed later in grant order.
#[derive(Debug)]
pub(super) struct Touch {
    /// The lease id: grant order.
    pub(super) seq: u64,
    pub(super) chain: Vec<BlockKey>,
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
    pub(super) fn push(&self, s: SessionId, t: Touch) {
        lock(&self.shards[(s.0 % SHARDS as u64) as usize]).push(t);
        self.pending.fetch_add(1, Ordering::Relaxed);
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
