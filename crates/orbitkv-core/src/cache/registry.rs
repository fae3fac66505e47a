//! The session and namespace tables: who is connected, which namespaces exist
//! and which generation each fingerprint is in. The bottom layer of
//! [`CacheState`]: it calls no other part of the cache.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use super::concurrent::SessionLeases;
use super::{CacheError, CacheState};
use crate::keys::{BlockKey, Fingerprint, NamespaceKey, NsId, SaveId, SessionId, TierKey};

#[derive(Debug, Clone)]
pub(super) struct NsInfo {
    pub(super) key: NamespaceKey,
    pub(super) block_bytes: u64,
}

#[derive(Debug, Default)]
pub(super) struct SessionInfo {
    pub(super) leases: SessionLeases,
    pub(super) saves: BTreeSet<SaveId>,
    pub(super) quarantined: bool,
}

impl CacheState {
    /// A fresh id for a session, lease or save (one sequence for all three).
    pub(super) fn next(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub fn open_session(&mut self) -> SessionId {
        let id = SessionId(self.next());
        self.sessions.insert(id, SessionInfo::default());
        id
    }

    /// The session, if it exists and is not quarantined (a quarantined session
    /// may not start or end anything: its connection is gone).
    pub(super) fn live_session(&mut self, s: SessionId) -> Result<&mut SessionInfo, CacheError> {
        let info = self.sessions.get_mut(&s).ok_or(CacheError::UnknownSession(s))?;
        if info.quarantined {
            return Err(CacheError::SessionClosed(s));
        }
        Ok(info)
    }

    /// The same check from the shared side.
    pub(super) fn session(&self, s: SessionId) -> Result<&SessionInfo, CacheError> {
        let info = self.sessions.get(&s).ok_or(CacheError::UnknownSession(s))?;
        if info.quarantined {
            return Err(CacheError::SessionClosed(s));
        }
        Ok(info)
    }

    pub fn is_quarantined(&self, s: SessionId) -> bool {
        self.sessions.get(&s).is_some_and(|i| i.quarantined)
    }

    pub(super) fn ns(&self, ns: NsId) -> Result<&NsInfo, CacheError> {
        self.namespaces.get(&ns).ok_or(CacheError::UnknownNamespace(ns))
    }

    pub(super) fn ns_id(&self, key: &NamespaceKey) -> Option<NsId> {
        self.ns_by_key.get(key).copied()
    }

    pub fn generation_of(&self, ns: NsId) -> Result<u64, CacheError> {
        let info = self.ns(ns)?;
        Ok(self.generations.get(&info.key.fingerprint).copied().unwrap_or(0))
    }

    pub fn block_bytes(&self, ns: NsId) -> Result<u64, CacheError> {
        Ok(self.ns(ns)?.block_bytes)
    }

    /// Raise a fingerprint's generation (from persisted state at start).
    pub fn restore_generation(&mut self, fp: Fingerprint, generation: u64) {
        let g = self.generations.entry(fp).or_insert(0);
        *g = (*g).max(generation);
    }

    pub fn generation_table(&self) -> Vec<(Fingerprint, u64)> {
        let mut v: Vec<_> = self.generations.iter().map(|(f, g)| (*f, *g)).collect();
        v.sort();
        v
    }

    /// A block's identity outside this process (on disk).
    pub fn tier_key(&self, k: &BlockKey) -> Option<TierKey> {
        let ns = self.namespaces.get(&k.ns)?;
        Some(TierKey {
            ns: ns.key,
            generation: k.generation,
            hash: k.hash,
        })
    }
}
