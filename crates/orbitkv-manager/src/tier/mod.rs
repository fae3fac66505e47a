//! Tiers below the DRAM arena: the [`Tier`] interface and the guards that end
//! every stage and spill the cache started. Cache decisions stay in
//! `orbitkv_core` (`spill_candidates`, `acquire`, `ssd_droppable`,
//! `take_ssd_removals`); this module only moves bytes and reports back.
//!
//! - `ssd.rs`: the SSD tier behind that interface (opening and recovering its
//!   directory, staging reads and spill writes);
//! - `generations.rs`: the generations file (persisted generations);
//! - `write_behind.rs`: the write-behind worker (deletions, spills, making room);
//! - `peer_slots.rs`: the peer and remote tiers' slot borrowing.
//!
//! The peer tier (`peer/`) and the remote tier (`remote.rs`) fill DRAM on a
//! miss rather than staging blocks the cache already knows, so they are not an
//! `impl Tier`; their byte moves into and out of arena slots are the functions
//! of `peer_slots.rs`.
//!
//! The only `unsafe` of the Manager, in `ssd.rs` and `peer_slots.rs`: borrowing
//! arena slots as slices for the SSD engine and for peer transfers, each under
//! the cache-protocol right that freezes the slot.

mod generations;
mod peer_slots;
mod ssd;
mod write_behind;

use std::time::{Duration, Instant};

use orbitkv_core::{
    AcquireStep, CacheError, CacheState, LeaseId, LeasedSlot, SessionId, SpillJob, StageJob, TierKey,
};
use orbitkv_shm::Segment;
use orbitkv_ssd::SsdStats;

use crate::latency::Histogram;
use crate::parts::{Arena, Cache};
pub use generations::persist_generations;
pub use peer_slots::{recv_into_save_slot, recv_into_save_slot_hashed, send_leased_slot};
pub use ssd::{open, ssd_key};
pub use write_behind::{WriteBehind, worker};

/// What became of one block handed to [`Tier::spill`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spilled {
    /// The tier holds a durable copy.
    Durable,
    /// The tier had no room; the worker makes room and tries once more.
    Full,
    /// Any other failure (already logged by the tier).
    Failed,
}

/// What `orbitkv status` and `/metrics` report about a tier.
#[derive(Debug, Clone, Default)]
pub struct TierStatus {
    pub stats: SsdStats,
    /// The I/O engine in use (`"io_uring"`, `"psync"`).
    pub engine: &'static str,
    /// Why the preferred engine was not used, if it was not.
    pub fallback_reason: Option<String>,
}

/// A storage tier below the DRAM arena (the SSD today, peer Managers later).
///
/// The tier only moves bytes. Which blocks move, and when a slot may be
/// read or written, is decided by `orbitkv_core::CacheState`: every job a tier
/// sees comes from the cache, and its slot is frozen until the guard that
/// carries the job reports back ([`StageGuard`], [`SpillGuard`]).
pub trait Tier: Send + Sync {
    /// Read each job's copy into its staging slot: per job, whether the slot
    /// now holds the block, verified (checksum, key and length).
    fn stage(&self, segments: &[Segment], jobs: &[StageJob]) -> Vec<bool>;
    /// Copy each job's slot into the tier: one outcome per job.
    fn spill(&self, segments: &[Segment], jobs: &[SpillJob]) -> Vec<Spilled>;
    /// Delete copies (only keys the cache gave up: `take_ssd_removals`, `ssd_droppable`).
    fn remove(&self, keys: &[TierKey]);
    /// Up to `n` least recently used copies, proposed to the cache when full.
    fn oldest(&self, n: usize) -> Vec<TierKey>;
    /// Copies the tier lost on its own since the last call (the SSD tier's header
    /// check after start-up drops blocks whose header disagrees with the journal):
    /// the cache forgets them, so they stop being reported present.
    fn take_lost(&self) -> Vec<TierKey> {
        Vec::new()
    }
    fn status(&self) -> TierStatus;
}

/// A move between DRAM and a tier that the cache started and must hear the end
/// of exactly once: a staging read (`AcquireStep::Stage`) or a spill
/// (`spill_candidates`).
pub trait TierMove {
    /// For the log line of a move dropped without a result.
    const WHAT: &'static str;
    /// Report the move's outcome to the cache.
    fn end(cache: &mut CacheState, job: &Self, ok: bool);
}

impl TierMove for StageJob {
    const WHAT: &'static str = "staging";
    fn end(cache: &mut CacheState, job: &Self, ok: bool) {
        cache.finish_stage(job, ok);
    }
}

impl TierMove for SpillJob {
    const WHAT: &'static str = "spill";
    fn end(cache: &mut CacheState, job: &Self, ok: bool) {
        cache.spill_done(job, ok);
    }
}

/// Moves the cache started, ended exactly once: with the I/O's results through
/// [`MoveGuard::finish`], or, if the guard is dropped first (a panic between
/// the two), as failures, so no block is left staging forever with other
/// leases waiting on it and no slot stays frozen (`Busy::Spilling` cannot be
/// evicted).
pub struct MoveGuard<'a, J: TierMove> {
    cache: &'a Cache,
    jobs: Vec<J>,
}

/// Staging reads of a lease's SSD-only blocks.
pub type StageGuard<'a> = MoveGuard<'a, StageJob>;
/// Write-behind spills of one batch.
pub type SpillGuard<'a> = MoveGuard<'a, SpillJob>;

impl<'a, J: TierMove> MoveGuard<'a, J> {
    /// `jobs` must come from the cache (`AcquireStep::Stage` / `spill_candidates`);
    /// the cache lock must not be held by this thread while the guard lives (its
    /// drop takes it).
    pub fn new(cache: &'a Cache, jobs: Vec<J>) -> Self {
        MoveGuard { cache, jobs }
    }

    pub fn jobs(&self) -> &[J] {
        &self.jobs
    }

    /// Report the moves (`ok[i]` for `jobs()[i]`; missing results are failures)
    /// and wake the acquires waiting on staged blocks.
    pub fn finish(mut self, ok: &[bool]) {
        self.report(ok);
    }

    fn report(&mut self, ok: &[bool]) {
        let jobs = std::mem::take(&mut self.jobs);
        if jobs.is_empty() {
            return;
        }
        let mut cache = self.cache.write();
        for (i, j) in jobs.iter().enumerate() {
            J::end(&mut cache, j, ok.get(i).copied().unwrap_or(false));
        }
        drop(cache);
        self.cache.notify_staged();
    }
}

impl<J: TierMove> Drop for MoveGuard<'_, J> {
    fn drop(&mut self) {
        if !self.jobs.is_empty() {
            log!(
                Error,
                "{} of {} block(s) ended without a result (a panic?); treated as failed",
                J::WHAT,
                self.jobs.len()
            );
            self.report(&[]);
        }
    }
}

/// A Manager-internal session (the peer and remote tiers' fills and sends),
/// ended when dropped: its open saves aborted, its leases released. Only the
/// Manager's own thread writes its slots, and it has stopped when this drops,
/// so the end is `Clean`.
pub struct InternalSession<'a> {
    pub arena: Arena<'a>,
    pub id: orbitkv_core::SessionId,
}

impl<'a> InternalSession<'a> {
    pub fn open(arena: Arena<'a>) -> Self {
        Self::open_locked(arena, &mut arena.cache.write())
    }

    /// [`InternalSession::open`] for a caller that holds the exclusive lock.
    pub fn open_locked(arena: Arena<'a>, cache: &mut orbitkv_core::CacheState) -> Self {
        InternalSession {
            arena,
            id: cache.open_session(),
        }
    }
}

impl Drop for InternalSession<'_> {
    fn drop(&mut self) {
        let _ = self
            .arena
            .cache
            .write()
            .end_session(self.id, orbitkv_core::SessionEnd::Clean);
    }
}

/// The blocks one lookup's fills stored (peers, then the remote tier), pinned until
/// the lookup that follows the fills holds them: a fill commits group after group, and
/// fresh blocks are the policy's first victims (S3-FIFO's small queue), so without the
/// pins a later group's allocation (or the remote fill after a peer fill) could evict
/// the head of the chain being filled and the second lookup would miss what was just
/// read. A session is opened only at the first pin; dropping this ends it (its leases
/// released): after the caller's second lookup, and with no cache lock held.
pub struct FillPins<'a> {
    arena: Arena<'a>,
    session: Option<InternalSession<'a>>,
}

impl<'a> FillPins<'a> {
    pub fn new(arena: Arena<'a>) -> Self {
        FillPins { arena, session: None }
    }

    /// The session the pins (and a fill's saves) belong to, opened at the first call
    /// under the caller's exclusive lock.
    pub fn session(&mut self, cache: &mut orbitkv_core::CacheState) -> orbitkv_core::SessionId {
        let arena = self.arena;
        self.session
            .get_or_insert_with(|| InternalSession::open_locked(arena, cache))
            .id
    }

    /// Pin the leading run of `hashes` visible in `ns` (no hit counted, the policy not
    /// touched: `CacheState::pin_for_copy`), with the caller's exclusive lock; how many
    /// blocks that run holds.
    pub fn pin(
        &mut self,
        cache: &mut orbitkv_core::CacheState,
        ns: orbitkv_core::NsId,
        hashes: &[orbitkv_core::BlockHash],
    ) -> usize {
        let s = self.session(cache);
        cache
            .pin_for_copy(s, ns, hashes)
            .map_or(0, |r| r.hit_blocks as usize)
    }
}

/// What a tier below DRAM keys namespace `ns`'s blocks by: its namespace key,
/// current generation and block size (`first`: any of its hashes). `None`
/// when `ns` is not registered.
pub fn tier_namespace(
    arena: Arena<'_>,
    ns: orbitkv_core::NsId,
    first: &orbitkv_core::BlockHash,
) -> Option<(orbitkv_core::NamespaceKey, u64, u64)> {
    let cache = arena.cache.read();
    let generation = cache.generation_of(ns).ok()?;
    let block_bytes = cache.block_bytes(ns).ok()?;
    let tk = cache.tier_key(&orbitkv_core::BlockKey {
        ns,
        generation,
        hash: *first,
    })?;
    Some((tk.ns, generation, block_bytes))
}

/// How long an acquire waits for spills in flight to free DRAM for its staging
/// reads when every slot is pinned or being spilled, before it fails.
pub const STAGING_SPACE_WAIT: Duration = Duration::from_secs(2);

/// Why [`acquire_slots`] handed out no slots.
#[derive(Debug)]
pub enum AcquireFailed {
    /// Blocks failed their integrity checks on SSD and were dropped (a miss from
    /// now on); the cache retired the lease.
    Lost { blocks: usize },
    /// The cache refused; `released`: the lease was released (no DRAM for the
    /// staging reads within [`STAGING_SPACE_WAIT`]).
    Cache { err: CacheError, released: bool },
}

/// Hand out a lease's source slots, staging SSD-only blocks into DRAM first (each
/// batch of staging reads timed in `ssd_read`). With no DRAM for the staging reads
/// it waits while spills are in flight (their slots become evictable as each
/// ends), up to [`STAGING_SPACE_WAIT`]. Every acquire takes this path: a client's
/// restore, a peer's fetch and the remote tier's writer.
pub fn acquire_slots(
    arena: Arena<'_>,
    below: Option<&dyn Tier>,
    ssd_read: &Histogram,
    s: SessionId,
    l: LeaseId,
) -> Result<Vec<LeasedSlot>, AcquireFailed> {
    let mut no_space_since: Option<Instant> = None;
    loop {
        let mut cache = arena.cache.write();
        match cache.acquire(s, l) {
            Ok(AcquireStep::Ready(slots)) => return Ok(slots),
            Ok(AcquireStep::Wait) => arena.cache.wait_staged(cache),
            Ok(AcquireStep::Lost { blocks }) => return Err(AcquireFailed::Lost { blocks }),
            Ok(AcquireStep::Stage(jobs)) => {
                drop(cache); // the reads run outside the lock; the guard inside reports back
                let t = Instant::now();
                stage_for_lease(arena, below, jobs);
                ssd_read.since(t);
            }
            Err(err @ CacheError::NoStagingSpace { .. }) => {
                let since = *no_space_since.get_or_insert_with(Instant::now);
                if cache.spills_in_flight() > 0 && since.elapsed() < STAGING_SPACE_WAIT {
                    arena.cache.wait_staged(cache); // woken as moves end, 100 ms at most
                    continue;
                }
                let _ = cache.release(s, l);
                return Err(AcquireFailed::Cache { err, released: true });
            }
            Err(err) => return Err(AcquireFailed::Cache { err, released: false }),
        }
    }
}

impl AcquireFailed {
    /// For a Manager-internal session (a peer's fetch, the remote tier's writer),
    /// which serves nothing from a lease it could not acquire: release it if the
    /// failure left it held.
    pub fn release_held(&self, cache: &Cache, s: SessionId, l: LeaseId) {
        if matches!(self, AcquireFailed::Cache { released: false, .. }) {
            let _ = cache.write().release(s, l);
        }
    }
}

/// Stage a lease's SSD-only blocks into DRAM (from `AcquireStep::Stage`) from
/// `tier` and report the results to the cache, whatever happens in between.
pub fn stage_for_lease(arena: Arena<'_>, tier: Option<&dyn Tier>, jobs: Vec<StageJob>) {
    let staging = StageGuard::new(arena.cache, jobs);
    let ok = match tier {
        Some(tier) => tier.stage(arena.segments, staging.jobs()),
        // Unreachable by construction (SSD-only blocks need a tier); fail closed.
        None => Vec::new(),
    };
    staging.finish(&ok);
}

#[cfg(test)]
mod tests {
    use std::panic::{AssertUnwindSafe, catch_unwind};

    use orbitkv_core::{AcquireStep, BlockHash, NsId, SaveStatus, SessionId, SpillPolicy};

    use super::write_behind::spill_batch;
    use super::*;
    use crate::config::ManagerConfig;
    use crate::shared::Shared;

    /// A tier whose every operation panics: fault injection for the guards.
    struct PanickingTier;

    impl Tier for PanickingTier {
        fn stage(&self, _: &[Segment], _: &[StageJob]) -> Vec<bool> {
            panic!("injected: staging read panicked")
        }
        fn spill(&self, _: &[Segment], _: &[SpillJob]) -> Vec<Spilled> {
            panic!("injected: spill write panicked")
        }
        fn remove(&self, _: &[TierKey]) {}
        fn oldest(&self, _: usize) -> Vec<TierKey> {
            Vec::new()
        }
        fn status(&self) -> TierStatus {
            TierStatus::default()
        }
    }

    const BLOCK: u64 = 4096;

    fn h(i: u8) -> BlockHash {
        [i; 32]
    }

    /// A Manager state with `slots` DRAM slots of one block, the SSD tier
    /// bookkeeping on (every block spilled eagerly) and a panicking tier.
    fn shared(slots: u64) -> (Shared, SessionId, NsId) {
        let config =
            ManagerConfig::from_argv(["x", "--socket", "/nonexistent/orbitkv-test.sock"]).expect("config");
        Shared::for_test(config, slots, BLOCK, |cache| {
            cache.enable_ssd_with(0, SpillPolicy::Eager);
            Box::new(PanickingTier)
        })
    }

    fn save(c: &mut CacheState, s: SessionId, ns: NsId, hs: &[BlockHash]) {
        let (id, _) = c.begin_save(s, ns, hs).expect("begin");
        c.commit_save(s, id).expect("commit");
    }

    #[test]
    fn a_panic_while_staging_leaves_no_block_staging() {
        let (shared, s, ns) = shared(2);
        let lease = {
            let mut c = shared.cache().write();
            save(&mut c, s, ns, &[h(1)]);
            for j in c.spill_candidates(8) {
                c.spill_done(&j, true);
            }
            save(&mut c, s, ns, &[h(2), h(3)]); // demotes h(1) to SSD-only
            c.lookup(s, ns, &[h(1)]).expect("lookup").lease.expect("hit")
        };
        let jobs = match shared.cache().write().acquire(s, lease).expect("acquire") {
            AcquireStep::Stage(jobs) => jobs,
            other => panic!("stage expected, got {other:?}"),
        };
        let r = catch_unwind(AssertUnwindSafe(|| {
            stage_for_lease(shared.arena(), shared.tier.as_deref(), jobs)
        }));
        assert!(r.is_err(), "the injected panic propagates");
        let mut c = shared.cache().write();
        // Not `Wait` (the block would be staging forever): the unfinished read
        // counts as failed, the block is dropped and the lease retired.
        assert!(
            matches!(
                c.acquire(s, lease).expect("acquire"),
                AcquireStep::Lost { blocks: 1 }
            ),
            "a block whose staging did not finish must not stay staging"
        );
        assert!(!c.is_visible(ns, &h(1)));
        assert_eq!(c.counters().stage_failures, 1);
        c.check_invariants().expect("invariants");
    }

    #[test]
    fn a_panic_while_spilling_leaves_no_slot_frozen() {
        let (shared, s, ns) = shared(1);
        save(&mut shared.cache().write(), s, ns, &[h(1)]);
        let jobs = shared.cache().write().spill_candidates(8);
        assert_eq!(jobs.len(), 1);
        let wb = WriteBehind {
            arena: shared.arena(),
            tier: &PanickingTier,
        };
        let r = catch_unwind(AssertUnwindSafe(|| spill_batch(wb, jobs)));
        assert!(r.is_err(), "the injected panic propagates");
        let mut c = shared.cache().write();
        assert_eq!(c.counters().spill_failures, 1);
        // A spilling slot cannot be evicted: the next save would be refused.
        let (id, st) = c.begin_save(s, ns, &[h(2)]).expect("begin");
        assert!(
            matches!(st[..], [SaveStatus::Allocated(_)]),
            "the slot of a spill that did not finish must be evictable again, got {st:?}"
        );
        c.commit_save(s, id).expect("commit");
        c.check_invariants().expect("invariants");
    }
}
