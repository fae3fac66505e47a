//! What a lease is, and the table that holds the live ones: the records that
//! `leases.rs` (plain leases) and `tp.rs` (tensor-parallel leases) work on.
//!
//! A lease leaves the table only through [`LeaseTable::remove`] and
//! [`LeaseTable::take_if`], which are visible to `cache::leases` alone: the
//! compiler, not a convention, keeps [`CacheState::end_lease`] and
//! [`CacheState::try_release_shared`] the only places a lease ends (each unpins
//! its blocks, forgets it in its session and counts it).
//!
//! [`CacheState::end_lease`]: crate::cache::CacheState::end_lease
//! [`CacheState::try_release_shared`]: crate::cache::CacheState::try_release_shared

use std::sync::Mutex;

use crate::cache::concurrent::{SHARDS, get_mut, lock, shards};
use crate::keys::{BlockKey, LeaseId, NsId, SessionId};
use crate::map::Map;

/// Lifecycle of a lease as the Manager can observe it (contract L2). The
/// client-side facts (enqueue, per-layer readiness) are tracked by the client;
/// the Manager sees "sources handed out" and "drained → retired".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// Hit blocks pinned; no copy may have started yet.
    Granted,
    /// Source locations handed to the client: copies may be in flight.
    Acquired,
}

#[derive(Debug, Clone)]
pub(in crate::cache) struct LeaseRecord {
    pub(in crate::cache) session: SessionId,
    pub(in crate::cache) ns: NsId,
    pub(in crate::cache) keys: Vec<BlockKey>,
    pub(in crate::cache) state: LeaseState,
    /// The TP lease this is one shard's part of (see `tp.rs`).
    pub(in crate::cache) tp: Option<TpToken>,
}

/// Every live lease, sharded by id. Under the exclusive lock the shards are
/// reached without locking (`&mut self`).
#[derive(Debug)]
pub(in crate::cache) struct LeaseTable {
    shards: Box<[Mutex<Map<LeaseId, LeaseRecord>>]>,
}

impl Default for LeaseTable {
    fn default() -> Self {
        LeaseTable { shards: shards() }
    }
}

impl LeaseTable {
    fn shard(&self, id: LeaseId) -> &Mutex<Map<LeaseId, LeaseRecord>> {
        &self.shards[(id.0 % SHARDS as u64) as usize]
    }

    pub(in crate::cache) fn insert(&self, id: LeaseId, lease: LeaseRecord) {
        lock(self.shard(id)).insert(id, lease);
    }

    pub(in crate::cache::leases) fn remove(&mut self, id: LeaseId) -> Option<LeaseRecord> {
        let i = (id.0 % SHARDS as u64) as usize;
        get_mut(&mut self.shards[i]).remove(&id)
    }

    pub(in crate::cache) fn get_mut(&mut self, id: LeaseId) -> Option<&mut LeaseRecord> {
        let i = (id.0 % SHARDS as u64) as usize;
        get_mut(&mut self.shards[i]).get_mut(&id)
    }

    /// Run `f` on the lease under its shard's lock (`None`: no such lease).
    pub(in crate::cache) fn with<R>(&self, id: LeaseId, f: impl FnOnce(&mut LeaseRecord) -> R) -> Option<R> {
        lock(self.shard(id)).get_mut(&id).map(f)
    }

    /// Remove the lease if `f` says so, deciding under its shard's lock (so no
    /// other shared-lock caller can end it in between). `Ok(None)`: kept.
    pub(in crate::cache::leases) fn take_if<E>(
        &self,
        id: LeaseId,
        unknown: E,
        f: impl FnOnce(&LeaseRecord) -> Result<bool, E>,
    ) -> Result<Option<LeaseRecord>, E> {
        let mut shard = lock(self.shard(id));
        let lease = shard.get(&id).ok_or(unknown)?;
        if f(lease)? {
            Ok(shard.remove(&id))
        } else {
            Ok(None)
        }
    }

    pub(in crate::cache) fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }

    /// Approximate heap bytes: the shards' tables and each lease's key list.
    pub(in crate::cache) fn lease_bytes(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| {
                let s = lock(s);
                crate::map::table_bytes::<LeaseId, LeaseRecord>(s.capacity())
                    + s.values()
                        .map(|l| crate::map::vec_bytes::<BlockKey>(l.keys.capacity()))
                        .sum::<u64>()
            })
            .sum()
    }

    /// Every lease (exclusive lock held: no shard lock taken).
    pub(in crate::cache) fn iter(&mut self) -> impl Iterator<Item = (&LeaseId, &LeaseRecord)> {
        self.shards.iter_mut().flat_map(|s| get_mut(s).iter())
    }

    /// Visit every lease from `&self` (each shard locked in turn).
    pub(in crate::cache) fn try_for_each<E>(
        &self,
        mut f: impl FnMut(LeaseId, &LeaseRecord) -> Result<(), E>,
    ) -> Result<(), E> {
        for s in self.shards.iter() {
            for (id, l) in lock(s).iter() {
                f(*id, l)?;
            }
        }
        Ok(())
    }
}

/// The unforgeable name of a TP lease: 128 random bits drawn by the Manager.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TpToken(pub [u8; 16]);

impl std::fmt::Debug for TpToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print a whole token: it is a capability.
        write!(f, "TpToken({:02x}{:02x}…)", self.0[0], self.0[1])
    }
}

/// The part of one declared shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TpPart {
    /// Pinned under the owner's lease; no worker took it yet.
    Pending(LeaseId),
    /// Redeemed: the lease belongs to the redeeming worker session.
    Redeemed(LeaseId),
    /// The rank reported done (its lease ended).
    Done,
}

#[derive(Debug, Clone)]
pub(in crate::cache) struct TpLeaseRecord {
    pub(in crate::cache) owner: SessionId,
    /// The uid whose sessions may redeem parts (`None`: pinned for a peer
    /// Manager; any session of this Manager holding the token).
    pub(in crate::cache) uid: Option<u32>,
    /// One per declared shard: in shard order (`nss[i]` has shard `i`) for a
    /// whole group, the shards this Manager holds for a group across Managers.
    pub(in crate::cache) nss: Vec<NsId>,
    pub(in crate::cache) parts: Vec<TpPart>,
    /// Caller's clock (milliseconds): after it, parts still pending are released.
    pub(in crate::cache) expires_at_ms: u64,
}

impl TpLeaseRecord {
    /// The part whose lease is `l` is done (its rank reported, or its lease
    /// ended); `true` when every part is done, so the TP lease ends too.
    pub(in crate::cache) fn part_ended(&mut self, l: LeaseId) -> bool {
        for part in &mut self.parts {
            if matches!(*part, TpPart::Pending(x) | TpPart::Redeemed(x) if x == l) {
                *part = TpPart::Done;
            }
        }
        self.parts.iter().all(|p| *p == TpPart::Done)
    }
}
