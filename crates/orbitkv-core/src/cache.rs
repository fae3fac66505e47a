//! The Manager's cache state as a sans-I/O state machine.
//!
//! One owner per fact:
//! - `index` owns visible blocks and their arena slots; only [`CacheState::evict_for`],
//!   [`CacheState::purge_generation`] and nothing else free a visible block's slot.
//! - `saves` own allocated-but-invisible slots; commit moves a slot into `index`,
//!   abort (or the end of the owning session) frees it.
//! - `leases` own pins on visible blocks; a pinned block is never evicted.
//! - `sessions` own their leases and saves. A session that vanished without a
//!   clean close is *quarantined*: its acquired pins and its save slots stay
//!   held until the Manager has proof that the peer process is gone (contract
//!   L2: a vanished connection proves nothing about physical drain). Leases it
//!   never acquired handed out no address, so they are released at once.

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::arena::{ArenaAllocator, aligned_len};
use crate::keys::{BlockHash, BlockKey, Fingerprint, LeaseId, NamespaceKey, NsId, SaveId, SessionId, Slot};
use crate::map::Map;
use crate::policy::S3Fifo;

/// Largest block the arena accepts (a single extent).
pub const MAX_BLOCK_BYTES: u64 = 1 << 30;

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum CacheError {
    #[error("unknown session {0:?}")]
    UnknownSession(SessionId),
    #[error("session {0:?} is closed")]
    SessionClosed(SessionId),
    #[error("unknown namespace {0:?}")]
    UnknownNamespace(NsId),
    #[error(
        "namespace already registered with block_bytes={existing}, not {requested}: the fingerprint does not bind the layout"
    )]
    BlockBytesMismatch { existing: u64, requested: u64 },
    #[error("block_bytes must be between 1 and {MAX_BLOCK_BYTES}, got {0}")]
    BadBlockBytes(u64),
    #[error("unknown lease {0:?}")]
    UnknownLease(LeaseId),
    #[error("unknown pending save {0:?}")]
    UnknownSave(SaveId),
    #[error("{what} {id} belongs to another session")]
    NotOwner { what: &'static str, id: u64 },
    #[error(
        "generation reset refused: {leases} lease(s) and {saves} pending save(s) still live on this fingerprint"
    )]
    Busy { leases: usize, saves: usize },
    #[error("no DRAM space to stage {blocks} block(s) from SSD: every slot is pinned")]
    NoStagingSpace { blocks: usize },
}

/// How a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEnd {
    /// The client said its copies drained, then closed.
    Clean,
    /// The peer process is proven gone (e.g. its pidfd became readable).
    ProcessGone,
    /// The connection dropped; the process may still be copying. Quarantine.
    Vanished,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaveStatus {
    Allocated(Slot),
    /// An equal key is already visible (or appears twice in this request).
    Present,
    /// Admission said no: no space could be made without evicting pinned blocks.
    Refused,
}

#[derive(Debug, Clone)]
pub struct LookupResult {
    pub lease: Option<LeaseId>,
    pub hit_blocks: u32,
    pub generation: u64,
}

#[derive(Debug, Clone)]
pub(crate) struct NsInfo {
    pub(crate) key: NamespaceKey,
    pub(crate) block_bytes: u64,
}

/// One visible (or doomed) block. Residency: DRAM (`slot`), SSD (`on_ssd`), or both.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// DRAM residency; `None` while the block lives on SSD only.
    pub(crate) slot: Option<Slot>,
    /// Block bytes as registered by the namespace (not rounded).
    pub(crate) block_bytes: u64,
    pub(crate) on_ssd: bool,
    pub(crate) pins: u32,
    pub(crate) hits: u32,
    pub(crate) busy: Busy,
    /// Invisible to lookups; freed (DRAM slot and SSD copy) once unpinned and idle.
    pub(crate) doomed: bool,
}

impl Entry {
    pub(crate) fn in_dram(slot: Slot, block_bytes: u64) -> Entry {
        Entry {
            slot: Some(slot),
            block_bytes,
            on_ssd: false,
            pins: 0,
            hits: 0,
            busy: Busy::Idle,
            doomed: false,
        }
    }

    /// May eviction take this entry's DRAM slot?
    pub(crate) fn evictable(&self) -> bool {
        self.pins == 0 && self.busy == Busy::Idle && !self.doomed
    }
}

/// Tier work in flight on an entry (the Manager's workers do the I/O).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Busy {
    Idle,
    /// A worker is copying the DRAM slot to SSD: the slot must not be freed.
    Spilling,
    /// A worker is reading the SSD copy into this newly allocated slot.
    Staging(Slot),
}

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
pub(crate) struct Lease {
    pub(crate) session: SessionId,
    pub(crate) ns: NsId,
    pub(crate) keys: Vec<BlockKey>,
    pub(crate) state: LeaseState,
}

#[derive(Debug, Clone)]
struct PendingSave {
    session: SessionId,
    ns: NsId,
    generation: u64,
    items: Vec<(BlockHash, SaveStatus)>,
}

#[derive(Debug, Clone, Default)]
struct SessionInfo {
    leases: BTreeSet<LeaseId>,
    saves: BTreeSet<SaveId>,
    quarantined: bool,
}

/// Monotonic counters, exported as metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    pub lookups: u64,
    pub lookup_blocks: u64,
    pub hit_blocks: u64,
    pub leases_granted: u64,
    pub leases_retired: u64,
    pub saves_begun: u64,
    pub blocks_committed: u64,
    pub blocks_present: u64,
    pub blocks_refused: u64,
    pub blocks_aborted: u64,
    pub blocks_duplicate_on_commit: u64,
    pub evictions: u64,
    pub evicted_bytes: u64,
    pub generation_bumps: u64,
    pub generation_purged_blocks: u64,
    pub sessions_quarantined: u64,
    pub sessions_released_from_quarantine: u64,
    /// DRAM slots freed while an SSD copy keeps the block visible.
    pub demotions: u64,
    pub spilled_blocks: u64,
    pub spill_failures: u64,
    pub staged_blocks: u64,
    pub stage_failures: u64,
    pub ssd_dropped_blocks: u64,
    pub ssd_adopted_blocks: u64,
    pub ssd_rejected_blocks: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gauges {
    pub capacity_bytes: u64,
    pub free_bytes: u64,
    pub visible_blocks: u64,
    pub visible_bytes: u64,
    pub pinned_blocks: u64,
    pub pending_save_bytes: u64,
    pub live_leases: u64,
    pub live_saves: u64,
    pub sessions: u64,
    pub quarantined_sessions: u64,
    pub quarantined_bytes: u64,
    pub namespaces: u64,
    pub ssd_only_blocks: u64,
    pub ssd_resident_blocks: u64,
    pub dormant_ssd_blocks: u64,
}

#[derive(Debug)]
pub struct CacheState {
    pub(crate) arena: ArenaAllocator,
    pub(crate) policy: S3Fifo<BlockKey>,
    pub(crate) index: Map<BlockKey, Entry>,
    pub(crate) namespaces: HashMap<NsId, NsInfo>,
    ns_by_key: HashMap<NamespaceKey, NsId>,
    pub(crate) generations: HashMap<Fingerprint, u64>,
    pub(crate) leases: Map<LeaseId, Lease>,
    saves: Map<SaveId, PendingSave>,
    sessions: Map<SessionId, SessionInfo>,
    next_id: u64,
    pub(crate) counters: Counters,
    pub(crate) tier: crate::tier::TierState,
}

impl CacheState {
    pub fn new(segment_sizes: &[u64]) -> Self {
        let arena = ArenaAllocator::new(segment_sizes);
        let policy = S3Fifo::new(arena.capacity());
        CacheState {
            arena,
            policy,
            index: Map::default(),
            namespaces: HashMap::new(),
            ns_by_key: HashMap::new(),
            generations: HashMap::new(),
            leases: Map::default(),
            saves: Map::default(),
            sessions: Map::default(),
            next_id: 0,
            counters: Counters::default(),
            tier: crate::tier::TierState::default(),
        }
    }

    fn next(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    pub fn segment_sizes(&self) -> &[u64] {
        self.arena.segment_sizes()
    }

    // ---- sessions -------------------------------------------------------

    pub fn open_session(&mut self) -> SessionId {
        let id = SessionId(self.next());
        self.sessions.insert(id, SessionInfo::default());
        id
    }

    fn live_session(&self, s: SessionId) -> Result<&SessionInfo, CacheError> {
        let info = self.sessions.get(&s).ok_or(CacheError::UnknownSession(s))?;
        if info.quarantined {
            return Err(CacheError::SessionClosed(s));
        }
        Ok(info)
    }

    /// End a session. `Clean` and `ProcessGone` release everything it owns.
    /// `Vanished` releases at once the leases still `Granted` (no source
    /// address was handed out, so no copy can be in flight) and quarantines
    /// acquired leases and pending saves until [`Self::process_gone`].
    pub fn end_session(&mut self, s: SessionId, how: SessionEnd) -> Result<(), CacheError> {
        let info = self.sessions.get(&s).ok_or(CacheError::UnknownSession(s))?;
        if how == SessionEnd::Vanished && !info.quarantined {
            let granted: Vec<LeaseId> = info
                .leases
                .iter()
                .copied()
                .filter(|l| self.leases.get(l).is_some_and(|x| x.state == LeaseState::Granted))
                .collect();
            for l in granted {
                self.drop_lease(l);
            }
        }
        let info = self.sessions.get_mut(&s).ok_or(CacheError::UnknownSession(s))?;
        if how == SessionEnd::Vanished {
            if !info.quarantined && (!info.leases.is_empty() || !info.saves.is_empty()) {
                info.quarantined = true;
                self.counters.sessions_quarantined += 1;
                return Ok(());
            }
            if info.quarantined {
                return Ok(());
            }
        }
        let was_quarantined = info.quarantined;
        let info = self.sessions.remove(&s).unwrap_or_default();
        for l in info.leases {
            self.drop_lease(l);
        }
        for sv in info.saves {
            self.drop_save(sv);
        }
        if was_quarantined {
            self.counters.sessions_released_from_quarantine += 1;
        }
        Ok(())
    }

    /// Proof that a quarantined session's process is gone: release its holds.
    pub fn process_gone(&mut self, s: SessionId) -> Result<(), CacheError> {
        self.end_session(s, SessionEnd::ProcessGone)
    }

    pub fn is_quarantined(&self, s: SessionId) -> bool {
        self.sessions.get(&s).is_some_and(|i| i.quarantined)
    }

    // ---- namespaces -----------------------------------------------------

    pub fn register_namespace(
        &mut self,
        key: NamespaceKey,
        block_bytes: u64,
    ) -> Result<(NsId, u64), CacheError> {
        if block_bytes == 0 || block_bytes > MAX_BLOCK_BYTES {
            return Err(CacheError::BadBlockBytes(block_bytes));
        }
        let generation = *self.generations.entry(key.fingerprint).or_insert(0);
        if let Some(&id) = self.ns_by_key.get(&key) {
            let existing = self.namespaces[&id].block_bytes;
            if existing != block_bytes {
                return Err(CacheError::BlockBytesMismatch {
                    existing,
                    requested: block_bytes,
                });
            }
            return Ok((id, generation));
        }
        let id = NsId(u32::try_from(self.namespaces.len() + 1).unwrap_or(u32::MAX));
        self.namespaces.insert(id, NsInfo { key, block_bytes });
        self.ns_by_key.insert(key, id);
        self.adopt_dormant(id);
        Ok((id, generation))
    }

    pub(crate) fn ns_id(&self, key: &NamespaceKey) -> Option<&NsId> {
        self.ns_by_key.get(key)
    }

    fn ns(&self, ns: NsId) -> Result<&NsInfo, CacheError> {
        self.namespaces.get(&ns).ok_or(CacheError::UnknownNamespace(ns))
    }

    pub fn generation_of(&self, ns: NsId) -> Result<u64, CacheError> {
        let info = self.ns(ns)?;
        Ok(self.generations.get(&info.key.fingerprint).copied().unwrap_or(0))
    }

    pub fn block_bytes(&self, ns: NsId) -> Result<u64, CacheError> {
        Ok(self.ns(ns)?.block_bytes)
    }

    /// Move every namespace of `ns`'s fingerprint to a fresh generation
    /// (contract L5). Refused while any lease or pending save is live on the
    /// fingerprint, quarantined ones included. Old-generation blocks are freed.
    pub fn bump_generation(&mut self, ns: NsId) -> Result<u64, CacheError> {
        let fp = self.ns(ns)?.key.fingerprint;
        let on_fp = |n: &NsId| self.namespaces.get(n).is_some_and(|i| i.key.fingerprint == fp);
        let leases = self.leases.values().filter(|l| on_fp(&l.ns)).count();
        let saves = self.saves.values().filter(|s| on_fp(&s.ns)).count();
        if leases > 0 || saves > 0 {
            return Err(CacheError::Busy { leases, saves });
        }
        let g = self.generations.entry(fp).or_insert(0);
        *g += 1;
        let new_gen = *g;
        self.counters.generation_bumps += 1;
        self.purge_generation(fp, new_gen);
        Ok(new_gen)
    }

    fn purge_generation(&mut self, fp: Fingerprint, current: u64) {
        let stale: Vec<BlockKey> = self
            .index
            .iter()
            .filter(|(k, e)| {
                k.generation != current
                    && !e.doomed
                    && self
                        .namespaces
                        .get(&k.ns)
                        .is_some_and(|i| i.key.fingerprint == fp)
            })
            .map(|(k, _)| *k)
            .collect();
        for k in stale {
            debug_assert_eq!(
                self.index.get(&k).map(|e| e.pins),
                Some(0),
                "bump_generation checked for leases"
            );
            self.doom(k);
            self.counters.generation_purged_blocks += 1;
        }
    }

    // ---- lookup / leases ------------------------------------------------

    /// Longest contiguous prefix of `hashes` that is visible, pinned under a
    /// new lease (none when the hit is empty).
    pub fn lookup(
        &mut self,
        s: SessionId,
        ns: NsId,
        hashes: &[BlockHash],
    ) -> Result<LookupResult, CacheError> {
        self.live_session(s)?;
        let generation = self.generation_of(ns)?;
        self.counters.lookups += 1;
        self.counters.lookup_blocks += hashes.len() as u64;
        let mut keys = Vec::new();
        for h in hashes {
            let key = BlockKey {
                ns,
                generation,
                hash: *h,
            };
            match self.index.get_mut(&key) {
                Some(e) if !e.doomed => {
                    e.pins += 1;
                    e.hits = e.hits.saturating_add(1);
                    keys.push(key);
                }
                _ => break,
            }
        }
        for k in &keys {
            self.policy.touch(k);
            self.note_hit(*k);
        }
        let hit_blocks = keys.len() as u32;
        self.counters.hit_blocks += u64::from(hit_blocks);
        if keys.is_empty() {
            return Ok(LookupResult {
                lease: None,
                hit_blocks: 0,
                generation,
            });
        }
        let id = LeaseId(self.next());
        self.leases.insert(
            id,
            Lease {
                session: s,
                ns,
                keys,
                state: LeaseState::Granted,
            },
        );
        if let Some(info) = self.sessions.get_mut(&s) {
            info.leases.insert(id);
        }
        self.counters.leases_granted += 1;
        Ok(LookupResult {
            lease: Some(id),
            hit_blocks,
            generation,
        })
    }

    fn owned_lease(&self, s: SessionId, l: LeaseId) -> Result<&Lease, CacheError> {
        let lease = self.leases.get(&l).ok_or(CacheError::UnknownLease(l))?;
        if lease.session != s {
            return Err(CacheError::NotOwner {
                what: "lease",
                id: l.0,
            });
        }
        Ok(lease)
    }

    pub(crate) fn check_owned_lease(&self, s: SessionId, l: LeaseId) -> Result<(), CacheError> {
        self.live_session(s)?;
        self.owned_lease(s, l).map(|_| ())
    }

    pub fn lease_state(&self, l: LeaseId) -> Option<LeaseState> {
        self.leases.get(&l).map(|x| x.state)
    }

    /// The client reports that every copy out of this lease has drained:
    /// the sources are retired (unpinned).
    pub fn release(&mut self, s: SessionId, l: LeaseId) -> Result<(), CacheError> {
        self.live_session(s)?;
        self.owned_lease(s, l)?;
        if let Some(info) = self.sessions.get_mut(&s) {
            info.leases.remove(&l);
        }
        self.drop_lease(l);
        Ok(())
    }

    pub(crate) fn drop_lease(&mut self, l: LeaseId) {
        if let Some(lease) = self.leases.remove(&l) {
            for k in &lease.keys {
                if let Some(e) = self.index.get_mut(k) {
                    e.pins = e.pins.saturating_sub(1);
                }
                self.reap_if_doomed(*k);
            }
            if let Some(info) = self.sessions.get_mut(&lease.session) {
                info.leases.remove(&l);
            }
            self.counters.leases_retired += 1;
        }
    }

    // ---- saves ----------------------------------------------------------

    /// Allocate invisible slots for the blocks of `hashes` that are not yet
    /// visible. Evicts unpinned blocks under pressure; refuses a block when
    /// no space can be made.
    pub fn begin_save(
        &mut self,
        s: SessionId,
        ns: NsId,
        hashes: &[BlockHash],
    ) -> Result<(SaveId, Vec<SaveStatus>), CacheError> {
        self.live_session(s)?;
        let generation = self.generation_of(ns)?;
        let block_bytes = self.block_bytes(ns)?;
        let mut seen = HashSet::new();
        let mut items = Vec::with_capacity(hashes.len());
        for h in hashes {
            let key = BlockKey {
                ns,
                generation,
                hash: *h,
            };
            let existing = self.index.get(&key).map(|e| e.doomed);
            let status = if existing == Some(true) {
                // A corrupt or purged copy is still being torn down: not storable yet.
                self.counters.blocks_refused += 1;
                SaveStatus::Refused
            } else if !seen.insert(*h) || existing.is_some() {
                self.counters.blocks_present += 1;
                SaveStatus::Present
            } else {
                match self.alloc_or_evict(block_bytes) {
                    Some(slot) => SaveStatus::Allocated(slot),
                    None => {
                        self.counters.blocks_refused += 1;
                        SaveStatus::Refused
                    }
                }
            };
            items.push((*h, status));
        }
        let id = SaveId(self.next());
        let statuses = items.iter().map(|(_, st)| *st).collect();
        self.saves.insert(
            id,
            PendingSave {
                session: s,
                ns,
                generation,
                items,
            },
        );
        if let Some(info) = self.sessions.get_mut(&s) {
            info.saves.insert(id);
        }
        self.counters.saves_begun += 1;
        Ok((id, statuses))
    }

    pub(crate) fn alloc_or_evict(&mut self, bytes: u64) -> Option<Slot> {
        loop {
            if let Some(slot) = self.arena.alloc(bytes) {
                return Some(slot);
            }
            if !self.evict_for(aligned_len(bytes)) {
                return None;
            }
        }
    }

    /// Take one DRAM slot from an evictable block: the block stays visible on
    /// SSD when it has a copy there (demotion), otherwise it is dropped.
    /// `false` when every DRAM-resident block is pinned or busy.
    fn evict_for(&mut self, _needed: u64) -> bool {
        let index = &self.index;
        let victim = self
            .policy
            .evict_one(|k| !index.get(k).is_some_and(Entry::evictable));
        let Some(key) = victim else {
            return false;
        };
        let Some(e) = self.index.get_mut(&key) else {
            return true; // the policy only tracks indexed blocks; nothing to free
        };
        let Some(slot) = e.slot.take() else {
            return true;
        };
        self.arena.free(slot);
        self.counters.evicted_bytes += slot.len;
        if e.on_ssd {
            self.counters.demotions += 1;
        } else {
            self.index.remove(&key);
            self.counters.evictions += 1;
        }
        true
    }

    fn take_owned_save(&mut self, s: SessionId, id: SaveId) -> Result<PendingSave, CacheError> {
        self.live_session(s)?;
        let save = self.saves.get(&id).ok_or(CacheError::UnknownSave(id))?;
        if save.session != s {
            return Err(CacheError::NotOwner {
                what: "save",
                id: id.0,
            });
        }
        if let Some(info) = self.sessions.get_mut(&s) {
            info.saves.remove(&id);
        }
        self.saves.remove(&id).ok_or(CacheError::UnknownSave(id))
    }

    /// Make a save's blocks visible. Returns the number of blocks committed.
    pub fn commit_save(&mut self, s: SessionId, id: SaveId) -> Result<u32, CacheError> {
        let save = self.take_owned_save(s, id)?;
        let mut committed = 0;
        for (hash, st) in save.items {
            let SaveStatus::Allocated(slot) = st else {
                continue;
            };
            let key = BlockKey {
                ns: save.ns,
                generation: save.generation,
                hash,
            };
            if self.index.contains_key(&key) {
                // Another session committed the same block first.
                self.arena.free(slot);
                self.counters.blocks_duplicate_on_commit += 1;
                continue;
            }
            let block_bytes = self.namespaces.get(&save.ns).map_or(slot.len, |n| n.block_bytes);
            self.index.insert(key, Entry::in_dram(slot, block_bytes));
            let readmitted = self.policy.insert(key, slot.len);
            self.note_committed(key, readmitted);
            committed += 1;
        }
        self.counters.blocks_committed += u64::from(committed);
        Ok(committed)
    }

    /// Discard a save: its slots are freed, nothing becomes visible.
    pub fn abort_save(&mut self, s: SessionId, id: SaveId) -> Result<(), CacheError> {
        let save = self.take_owned_save(s, id)?;
        self.free_save_items(save);
        Ok(())
    }

    fn drop_save(&mut self, id: SaveId) {
        if let Some(save) = self.saves.remove(&id) {
            self.free_save_items(save);
        }
    }

    fn free_save_items(&mut self, save: PendingSave) {
        for (_, st) in save.items {
            if let SaveStatus::Allocated(slot) = st {
                self.arena.free(slot);
                self.counters.blocks_aborted += 1;
            }
        }
    }

    // ---- observation ----------------------------------------------------

    /// Is the block visible (committed, current generation)?
    pub fn is_visible(&self, ns: NsId, hash: &BlockHash) -> bool {
        let Ok(generation) = self.generation_of(ns) else {
            return false;
        };
        self.index
            .get(&BlockKey {
                ns,
                generation,
                hash: *hash,
            })
            .is_some_and(|e| !e.doomed)
    }

    pub fn gauges(&self) -> Gauges {
        let quarantined: Vec<&SessionInfo> = self.sessions.values().filter(|i| i.quarantined).collect();
        let mut quarantined_bytes = 0;
        for info in &quarantined {
            for sv in &info.saves {
                if let Some(save) = self.saves.get(sv) {
                    quarantined_bytes += save_bytes(save);
                }
            }
        }
        Gauges {
            capacity_bytes: self.arena.capacity(),
            free_bytes: self.arena.free_bytes(),
            visible_blocks: self.index.values().filter(|e| !e.doomed).count() as u64,
            visible_bytes: self.index.values().filter_map(|e| e.slot.map(|s| s.len)).sum(),
            pinned_blocks: self.index.values().filter(|e| e.pins > 0).count() as u64,
            pending_save_bytes: self.saves.values().map(save_bytes).sum(),
            live_leases: self.leases.len() as u64,
            live_saves: self.saves.len() as u64,
            sessions: self.sessions.len() as u64,
            quarantined_sessions: quarantined.len() as u64,
            quarantined_bytes,
            namespaces: self.namespaces.len() as u64,
            ssd_only_blocks: self
                .index
                .values()
                .filter(|e| e.slot.is_none() && !e.doomed)
                .count() as u64,
            ssd_resident_blocks: self.index.values().filter(|e| e.on_ssd && !e.doomed).count() as u64,
            dormant_ssd_blocks: self.tier.dormant_len() as u64,
        }
    }

    /// Cross-check every ownership invariant; used by tests and debug builds.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut pins: HashMap<BlockKey, u32> = HashMap::new();
        for (id, l) in &self.leases {
            let owner = self
                .sessions
                .get(&l.session)
                .ok_or(format!("lease {id:?} without session"))?;
            if !owner.leases.contains(id) {
                return Err(format!("lease {id:?} not listed by its session"));
            }
            for k in &l.keys {
                if !self.index.contains_key(k) {
                    return Err(format!("lease {id:?} pins a block that is not visible"));
                }
                *pins.entry(*k).or_default() += 1;
            }
        }
        let mut tracked = 0;
        for (k, e) in &self.index {
            if e.pins != pins.get(k).copied().unwrap_or(0) {
                return Err(format!("pin count mismatch on {k:?}"));
            }
            let should_track = e.slot.is_some() && !e.doomed;
            if should_track != self.policy.contains(k) {
                return Err(format!("policy tracking of {k:?} should be {should_track}"));
            }
            tracked += usize::from(should_track);
            if e.slot.is_none() && !e.on_ssd && !matches!(e.busy, Busy::Staging(_)) && !e.doomed {
                return Err(format!("{k:?} is visible with no copy anywhere"));
            }
            if e.doomed && e.pins == 0 && e.busy == Busy::Idle {
                return Err(format!("{k:?} is doomed, unpinned and idle but was not reaped"));
            }
        }
        if self.policy.len() != tracked {
            return Err("policy tracks blocks that are not DRAM-resident".into());
        }
        let staging: u64 = self
            .index
            .values()
            .filter_map(|e| match e.busy {
                Busy::Staging(s) => Some(s.len),
                _ => None,
            })
            .sum();
        let used: u64 = self
            .index
            .values()
            .filter_map(|e| e.slot.map(|s| s.len))
            .sum::<u64>()
            + staging
            + self.saves.values().map(save_bytes).sum::<u64>();
        if used + self.arena.free_bytes() != self.arena.capacity() {
            return Err(format!(
                "arena accounting: used {used} + free {} != capacity {}",
                self.arena.free_bytes(),
                self.arena.capacity()
            ));
        }
        Ok(())
    }
}

fn save_bytes(save: &PendingSave) -> u64 {
    save.items
        .iter()
        .map(|(_, st)| match st {
            SaveStatus::Allocated(s) => s.len,
            _ => 0,
        })
        .sum()
}
