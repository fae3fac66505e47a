//! The Manager's cache state as a sans-I/O state machine.
//!
//! [`CacheState`] is the facade: one struct, one mutex in the Manager, every
//! cache decision a method of it. Its methods are split by what they own, and
//! calls only go down this list (a module never calls one above it):
//!
//! 1. `mod.rs` (this file): operations that span owners — ending a session
//!    (its leases and saves), registering a namespace (adopting its dormant
//!    SSD blocks), generation reset (dooming old blocks) — and observation
//!    (`gauges`, `check_invariants`).
//! 2. `tp.rs`: tensor-parallel leases — one lookup over every shard of a TP
//!    group pins the common prefix under a token each rank's worker redeems.
//! 3. `leases.rs`: pins — `lookup`, `acquire`, `release` and [`CacheState::end_lease`] /
//!    [`CacheState::try_release_shared`], the only places a lease ends (its
//!    `records.rs` holds what a lease is and the lease table, whose removals only
//!    `leases` can call); and `saves.rs`: allocated-but-invisible
//!    slots — `begin_save`, `commit_save`, `abort_save` and `end_save`.
//! 4. `spill.rs`: which blocks are copied to SSD and when (`SpillJob`,
//!    admission on commit and hit, `spill_candidates`, `spill_done`); then
//!    `tiers.rs`: the tiers' state, staging SSD-only blocks back (`StageJob`)
//!    and *doomed* blocks, which are reaped once unpinned and idle; and
//!    `ssd_capacity.rs`: the SSD byte budget, making room, dropping copies;
//!    then `adopt.rs`: recovered SSD blocks adopted at namespace registration.
//! 5. `entries.rs`: the index of visible blocks and their DRAM slots —
//!    allocation with eviction and [`CacheState::free_slot`], the only place a
//!    slot returns to the arena (`entries/slots.rs`: the arena's `Slots`, whose
//!    `alloc` and `free` only `entries` can call).
//! 6. `registry.rs`: the session and namespace tables (liveness checks,
//!    generations, on-disk block identity).
//!
//! One owner per fact:
//! - `index` owns visible blocks and their arena slots;
//! - `saves` own allocated-but-invisible slots; commit moves a slot into `index`,
//!   abort (or the end of the owning session) frees it;
//! - `leases` own pins on visible blocks; a pinned block is never evicted;
//! - `sessions` own their leases and saves. A session that vanished without a
//!   clean close is *quarantined*: its acquired pins and its save slots stay
//!   held until the Manager has proof that the peer process is gone (contract
//!   L2: a vanished connection proves nothing about physical drain). Leases it
//!   never acquired handed out no address, so they are released at once.

mod adopt;
mod concurrent;
mod entries;
mod explain;
mod hints;
mod jobs;
mod leases;
mod registry;
mod remote_due;
mod saves;
mod spill;
mod ssd_capacity;
mod tiers;
mod tp;

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;

use crate::keys::{BlockKey, Fingerprint, LeaseId, NamespaceKey, NsId, SaveId, SessionId};
use crate::map::Map;
use crate::policy::{Policy, PolicyHeap, PolicyKind};
pub use crate::table::BlockRef;
use crate::table::SlabMap;
use concurrent::{HotCounters, PolicyCell, TouchLog};

pub use entries::PresenceSink;
use entries::{Busy, Entry, Slots};
pub use explain::MissReason;
pub use hints::{HintStats, MAX_PENDING_HINTS, MAX_RETAIN_TTL_MS, Retain, RetainOutcome};
pub use leases::{LeaseState, LookupResult, TpPart, TpToken};
use leases::{LeaseTable, TpLeaseRecord};
use registry::{NsInfo, SessionInfo};
use saves::OpenSave;
pub use saves::SaveStatus;
use tiers::TierState;
pub use tiers::{AcquireStep, LeasedSlot, SaveSlot, SpillJob, SpillPolicy, StageJob};
pub use tp::{MAX_TP_SHARDS, TpLookupResult, TpRedeemed};

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
    #[error(
        "block_bytes {block_bytes} exceeds the largest arena segment ({segment} bytes): no block of this \
         size could ever be stored; use smaller blocks or start the Manager with a larger --segment-size"
    )]
    BlockLargerThanSegment { block_bytes: u64, segment: u64 },
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
    #[error(
        "no DRAM space to stage {blocks} block(s) from SSD: every slot is pinned by a lease or being written to SSD"
    )]
    NoStagingSpace { blocks: usize },
    #[error("TP lookup refused: {0}")]
    TpGroup(String),
    #[error("unknown TP lease token (never granted, ended or expired)")]
    UnknownTpLease,
    #[error("retention hints are off on this Manager (started with --retain-share 0)")]
    RetentionOff,
    #[error("bad retention hint: {0}")]
    BadHint(String),
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

/// Monotonic counters, exported as metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    pub lookups: u64,
    pub lookup_blocks: u64,
    pub hit_blocks: u64,
    /// Of `hit_blocks`, those on SSD only at lookup time (the lookup reply names them).
    pub ssd_hit_blocks: u64,
    pub leases_granted: u64,
    pub leases_retired: u64,
    /// Hits the policy never saw: lookups outpaced the replay of the touch
    /// log and found it full (see `concurrent.rs`); recency only, never bytes.
    pub policy_touches_dropped: u64,
    /// Blocks due for the remote tier by reuse that found its due list full.
    pub remote_due_dropped: u64,
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
    /// With DRAM and SSD decided as one capacity: DRAM evictions of blocks the
    /// tiers' policy still kept but the SSD had no copy of yet (the spill came
    /// too late; the block is lost). With `--ssd-admit-hits` N > 0 this also
    /// counts blocks below N hits, which would not have been spilled anyway.
    pub evicted_unspilled: u64,
    pub spilled_blocks: u64,
    pub spill_failures: u64,
    /// Walks of DRAM's cold end that planned the spill queue (`evict` policy).
    pub spill_plans: u64,
    pub staged_blocks: u64,
    pub stage_failures: u64,
    pub ssd_dropped_blocks: u64,
    pub ssd_adopted_blocks: u64,
    pub ssd_rejected_blocks: u64,
    /// TP lookups (one per request over every shard; see `tp.rs`).
    pub tp_lookups: u64,
    pub tp_leases_granted: u64,
    pub tp_parts_redeemed: u64,
    /// TP leases ended because every rank reported done.
    pub tp_leases_completed: u64,
    /// TP leases ended by their owner (or with its session).
    pub tp_leases_released: u64,
    /// TP leases ended by their deadline with parts never redeemed.
    pub tp_leases_expired: u64,
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
    pub live_tp_leases: u64,
}

/// Approximate heap bytes of the cache state, by structure
/// ([`CacheState::heap_bytes`]): allocated capacity, not only what is in use,
/// so a table just past a resize shows its empty half.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeapBytes {
    /// The block index (visible blocks and their slots).
    pub index: u64,
    /// The eviction policy, both tiers' instances when enabled.
    pub policy: PolicyHeap,
    /// The arena allocator's free-extent trees.
    pub arena: u64,
    /// Live leases (the sharded table and each lease's keys).
    pub leases: u64,
    /// Pending saves, sessions, namespaces, TP leases and SSD-tier queues.
    pub other: u64,
}

impl HeapBytes {
    pub fn total(&self) -> u64 {
        self.index + self.policy.total() + self.arena + self.leases + self.other
    }
}

#[derive(Debug)]
pub struct CacheState {
    /// The arena's slots: taken and given back only in `entries.rs`.
    arena: Slots,
    policy: PolicyCell,
    index: SlabMap<BlockKey, Entry>,
    namespaces: HashMap<NsId, NsInfo>,
    ns_by_key: HashMap<NamespaceKey, NsId>,
    generations: HashMap<Fingerprint, u64>,
    leases: LeaseTable,
    saves: Map<SaveId, OpenSave>,
    sessions: Map<SessionId, SessionInfo>,
    tp: Map<TpToken, TpLeaseRecord>,
    next_id: AtomicU64,
    /// Counters of the exclusive side; `hot` holds those the shared side moves.
    counters: Counters,
    hot: HotCounters,
    /// Policy touches of leases granted under the shared lock (see `concurrent.rs`).
    touches: TouchLog,
    tier: TierState,
    /// Blocks due for a remote tier by reuse (`remote_due.rs`).
    remote: remote_due::RemoteAdmission,
    /// Hints on blocks not visible yet (`hints.rs`).
    hints: hints::PendingHints,
    presence: Option<Box<dyn PresenceSink>>,
}

impl CacheState {
    pub fn new(segment_sizes: &[u64]) -> Self {
        Self::with_policy(segment_sizes, PolicyKind::default())
    }

    /// A cache whose DRAM eviction follows `kind`.
    pub fn with_policy(segment_sizes: &[u64], kind: PolicyKind) -> Self {
        Self::with_policy_seed(segment_sizes, kind, None)
    }

    /// A cache whose DRAM eviction follows `kind`, `duel`'s sample drawn with
    /// `seed` (`None`: random per process; see [`Policy::seeded`]).
    pub fn with_policy_seed(segment_sizes: &[u64], kind: PolicyKind, seed: Option<u64>) -> Self {
        let capacity = Slots::new(segment_sizes).capacity();
        Self::with_policy_instance(segment_sizes, Policy::seeded(kind, capacity, seed))
    }

    /// A cache with a policy built by the caller (the simulator's parameter
    /// sweeps). The policy knows blocks by [`BlockRef`]; the index hashes with
    /// its [`Policy::block_seed`].
    pub fn with_policy_instance(segment_sizes: &[u64], policy: Policy<BlockRef>) -> Self {
        let arena = Slots::new(segment_sizes);
        let index = SlabMap::with_seed(policy.block_seed());
        CacheState {
            arena,
            policy: PolicyCell::new(policy),
            index,
            namespaces: HashMap::new(),
            ns_by_key: HashMap::new(),
            generations: HashMap::new(),
            leases: LeaseTable::default(),
            saves: Map::default(),
            sessions: Map::default(),
            tp: Map::default(),
            next_id: AtomicU64::new(0),
            counters: Counters::default(),
            hot: HotCounters::default(),
            touches: TouchLog::default(),
            tier: TierState::default(),
            remote: remote_due::RemoteAdmission::default(),
            hints: hints::PendingHints::default(),
            presence: None,
        }
    }

    /// Install the sink told every visibility change from now on, after being
    /// told every block visible now (so it starts in step with the index).
    pub fn set_presence_sink(&mut self, mut sink: Box<dyn PresenceSink>) {
        for (k, e) in self.index.iter().filter(|(_, e)| !e.doomed) {
            sink.changed(k, true, e.dram_slot().is_some());
        }
        self.presence = Some(sink);
    }

    pub fn counters(&self) -> Counters {
        self.hot.merged(&self.counters)
    }

    pub fn segment_sizes(&self) -> &[u64] {
        self.arena.segment_sizes()
    }

    // ---- session end: leases and saves ----------------------------------

    /// End a session. `Clean` and `ProcessGone` release everything it owns.
    /// `Vanished` releases at once the leases still `Granted` (no source
    /// address was handed out, so no copy can be in flight) and quarantines
    /// acquired leases and pending saves until [`Self::process_gone`].
    pub fn end_session(&mut self, s: SessionId, how: SessionEnd) -> Result<(), CacheError> {
        self.sessions.get(&s).ok_or(CacheError::UnknownSession(s))?;
        // Its TP leases end (their unredeemed parts are granted leases of `s`).
        self.end_tp_of_session(s);
        let info = self.sessions.get(&s).ok_or(CacheError::UnknownSession(s))?;
        if how == SessionEnd::Vanished {
            if info.quarantined {
                return Ok(());
            }
            let granted: Vec<LeaseId> = info
                .leases
                .snapshot()
                .into_iter()
                .filter(|l| self.leases.with(*l, |x| x.state == LeaseState::Granted) == Some(true))
                .collect();
            for l in granted {
                self.end_lease(l);
            }
            let info = self.sessions.get_mut(&s).ok_or(CacheError::UnknownSession(s))?;
            if !info.leases.is_empty() || !info.saves.is_empty() {
                info.quarantined = true;
                self.counters.sessions_quarantined += 1;
                return Ok(());
            }
        }
        let info = self.sessions.remove(&s).unwrap_or_default();
        for l in info.leases.into_inner() {
            self.end_lease(l);
        }
        for sv in info.saves {
            self.end_save(sv);
        }
        if info.quarantined {
            self.counters.sessions_released_from_quarantine += 1;
        }
        Ok(())
    }

    /// Proof that a quarantined session's process is gone: release its holds.
    pub fn process_gone(&mut self, s: SessionId) -> Result<(), CacheError> {
        self.end_session(s, SessionEnd::ProcessGone)
    }

    // ---- namespaces and generations -------------------------------------

    pub fn register_namespace(
        &mut self,
        key: NamespaceKey,
        block_bytes: u64,
    ) -> Result<(NsId, u64), CacheError> {
        if block_bytes == 0 || block_bytes > MAX_BLOCK_BYTES {
            return Err(CacheError::BadBlockBytes(block_bytes));
        }
        let segment = self.arena.largest_segment();
        if crate::arena::aligned_len(block_bytes) > segment {
            return Err(CacheError::BlockLargerThanSegment { block_bytes, segment });
        }
        let generation = *self.generations.entry(key.fingerprint).or_insert(0);
        if let Some(&id) = self.ns_by_key.get(&key) {
            let existing = self.ns(id)?.block_bytes;
            if existing != block_bytes {
                return Err(CacheError::BlockBytesMismatch {
                    existing,
                    requested: block_bytes,
                });
            }
            return Ok((id, generation));
        }
        // The arena holds at most this many blocks of this size: room for them
        // in the index now, not a re-index of millions under the lock later.
        let fit = self.arena.capacity() / crate::arena::aligned_len(block_bytes);
        let fit = usize::try_from(fit).unwrap_or(usize::MAX);
        self.index.reserve_index(fit);
        self.policy.get().reserve(fit);
        let id = NsId(u32::try_from(self.namespaces.len() + 1).unwrap_or(u32::MAX));
        self.namespaces.insert(id, NsInfo { key, block_bytes });
        self.ns_by_key.insert(key, id);
        self.adopt_dormant(id);
        Ok((id, generation))
    }

    /// Move every namespace of `ns`'s fingerprint to a fresh generation
    /// (contract L5). Refused while any lease or pending save is live on the
    /// fingerprint, quarantined ones included. Old-generation blocks are doomed
    /// (invisible at once; nothing pins them, so they are freed at once too).
    pub fn bump_generation(&mut self, ns: NsId) -> Result<u64, CacheError> {
        let fp = self.ns(ns)?.key.fingerprint;
        let on_fp = |n: &NsId| self.namespaces.get(n).is_some_and(|i| i.key.fingerprint == fp);
        let lease_ns: Vec<NsId> = self.leases.iter().map(|(_, l)| l.ns).collect();
        let leases = lease_ns.iter().filter(|n| on_fp(n)).count();
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
                self.index.get(&k).map(Entry::pins),
                Some(0),
                "bump_generation checked for leases"
            );
            self.doom(k);
            self.counters.generation_purged_blocks += 1;
        }
    }

    // ---- observation ----------------------------------------------------

    /// Is the block visible (committed, current generation)?
    pub fn is_visible(&self, ns: NsId, hash: &crate::keys::BlockHash) -> bool {
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

    /// Every block visible to lookups (any order).
    pub fn visible_blocks(&self) -> Vec<BlockKey> {
        self.index
            .iter()
            .filter(|(_, e)| !e.doomed)
            .map(|(k, _)| *k)
            .collect()
    }

    /// Approximate heap bytes by structure (capacity × entry size: cheap, no walk
    /// of the big tables). For memory budgets at millions of blocks
    /// (`benches/index_scale.rs`); the process's real figure also holds the
    /// allocator's slack.
    pub fn heap_bytes(&self) -> HeapBytes {
        use crate::map::table_bytes;
        let saves: u64 = table_bytes::<SaveId, OpenSave>(self.saves.capacity())
            + self.saves.values().map(OpenSave::item_bytes).sum::<u64>();
        let sessions = table_bytes::<SessionId, SessionInfo>(self.sessions.capacity())
            + table_bytes::<TpToken, TpLeaseRecord>(self.tp.capacity())
            + table_bytes::<NsId, NsInfo>(self.namespaces.capacity())
            + table_bytes::<NamespaceKey, NsId>(self.ns_by_key.capacity());
        HeapBytes {
            index: self.index.heap_bytes(),
            policy: self.policy.policy_heap(),
            arena: self.arena.heap_bytes(),
            leases: self.leases.lease_bytes(),
            other: saves + sessions + self.tier.queue_bytes(),
        }
    }

    pub fn gauges(&self) -> Gauges {
        let quarantined: Vec<&SessionInfo> = self.sessions.values().filter(|i| i.quarantined).collect();
        let mut quarantined_bytes = 0;
        for info in &quarantined {
            for sv in &info.saves {
                if let Some(save) = self.saves.get(sv) {
                    quarantined_bytes += save.bytes();
                }
            }
        }
        Gauges {
            capacity_bytes: self.arena.capacity(),
            free_bytes: self.arena.free_bytes(),
            visible_blocks: self.index.values().filter(|e| !e.doomed).count() as u64,
            visible_bytes: self
                .index
                .values()
                .filter_map(|e| e.dram_slot().map(|s| s.len))
                .sum(),
            pinned_blocks: self.index.values().filter(|e| e.pins() > 0).count() as u64,
            pending_save_bytes: self.saves.values().map(OpenSave::bytes).sum(),
            live_leases: self.leases.len() as u64,
            live_saves: self.saves.len() as u64,
            sessions: self.sessions.len() as u64,
            quarantined_sessions: quarantined.len() as u64,
            quarantined_bytes,
            namespaces: self.namespaces.len() as u64,
            ssd_only_blocks: self
                .index
                .values()
                .filter(|e| e.dram_slot().is_none() && !e.doomed)
                .count() as u64,
            ssd_resident_blocks: self.index.values().filter(|e| e.on_ssd && !e.doomed).count() as u64,
            dormant_ssd_blocks: self.tier.dormant_len() as u64,
            live_tp_leases: self.tp.len() as u64,
        }
    }

    /// Cross-check every ownership invariant; used by tests and debug builds.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut pins: HashMap<BlockKey, u32> = HashMap::new();
        self.leases.try_for_each(|id, l| {
            let owner = self
                .sessions
                .get(&l.session)
                .ok_or(format!("lease {id:?} without session"))?;
            if !owner.leases.contains(&id) {
                return Err(format!("lease {id:?} not listed by its session"));
            }
            for k in &l.keys {
                if !self.index.contains_key(k) {
                    return Err(format!("lease {id:?} pins a block that is not visible"));
                }
                *pins.entry(*k).or_default() += 1;
            }
            Ok(())
        })?;
        for (id, sv) in &self.saves {
            let owner = self
                .sessions
                .get(&sv.session)
                .ok_or(format!("save {id:?} without session"))?;
            if !owner.saves.contains(id) {
                return Err(format!("save {id:?} not listed by its session"));
            }
        }
        let policy = self.policy.lock();
        let mut tracked = 0;
        for (r, k, e) in self.index.iter_refs() {
            if e.pins() != pins.get(k).copied().unwrap_or(0) {
                return Err(format!("pin count mismatch on {k:?}"));
            }
            let should_track = e.dram_slot().is_some() && !e.doomed;
            if should_track != policy.contains(&r) {
                return Err(format!("policy tracking of {k:?} should be {should_track}"));
            }
            tracked += usize::from(should_track);
            if e.dram_slot().is_none() && !e.on_ssd && !matches!(e.busy, Busy::Staging) && !e.doomed {
                return Err(format!("{k:?} is visible with no copy anywhere"));
            }
            if e.doomed && e.pins() == 0 && e.busy == Busy::Idle {
                return Err(format!("{k:?} is doomed, unpinned and idle but was not reaped"));
            }
        }
        self.check_tp_invariants()?;
        if policy.len() != tracked {
            return Err("policy tracks blocks that are not DRAM-resident".into());
        }
        let staging: u64 = self
            .index
            .values()
            .filter_map(|e| match e.busy {
                Busy::Staging => Some(crate::arena::aligned_len(e.data_bytes())),
                _ => None,
            })
            .sum();
        let used: u64 = self
            .index
            .values()
            .filter_map(|e| e.dram_slot().map(|s| s.len))
            .sum::<u64>()
            + staging
            + self.saves.values().map(OpenSave::bytes).sum::<u64>();
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
