//! Tiers below the DRAM arena: the [`Tier`] interface, the guards that end
//! every stage and spill the cache started, the write-behind worker, and the
//! SSD tier behind that interface (opening and recovering its directory,
//! persisting generations, staging reads and spill writes). Cache decisions
//! stay in `orbitkv_core` (`spill_candidates`, `acquire`, `ssd_droppable`,
//! `take_ssd_removals`); this module only moves bytes and reports back.
//!
//! The peer tier (`crate::peer`) fills DRAM on a miss rather than staging
//! blocks the cache already knows, so it is not an `impl Tier`; its byte moves
//! into and out of arena slots are the two functions below.
//!
//! The only `unsafe` of the Manager: borrowing arena slots as slices for the
//! SSD engine and for peer transfers, each under the cache-protocol right that
//! freezes the slot.
#![allow(unsafe_code)]

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use orbitkv_core::{CacheState, Fingerprint, SpillJob, StageJob, TierKey};
use orbitkv_shm::Segment;
use orbitkv_ssd::{RecoveryPhase, RecoveryVerify, SsdConfig, SsdError, SsdKey, SsdStats, SsdTier};

use crate::config::SsdSettings;
use crate::log::Occurrences;
use crate::shared::Shared;

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
    shared: &'a Shared,
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
    pub fn new(shared: &'a Shared, jobs: Vec<J>) -> Self {
        MoveGuard { shared, jobs }
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
        let mut cache = self.shared.cache();
        for (i, j) in jobs.iter().enumerate() {
            J::end(&mut cache, j, ok.get(i).copied().unwrap_or(false));
        }
        drop(cache);
        self.shared.notify_staged();
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

/// Stage a lease's SSD-only blocks into DRAM (from `AcquireStep::Stage`) and
/// report the results to the cache, whatever happens in between.
pub fn stage_for_lease(shared: &Shared, jobs: Vec<StageJob>) {
    let staging = StageGuard::new(shared, jobs);
    let ok = match shared.tier.as_deref() {
        Some(tier) => tier.stage(&shared.segments, staging.jobs()),
        // Unreachable by construction (SSD-only blocks need a tier); fail closed.
        None => Vec::new(),
    };
    staging.finish(&ok);
}

/// Let `fill` write the first `len` bytes of save slot `slot`, then return
/// them read-only with what `fill` returned: the one place the peer tier's
/// receives get at an arena slot (the callers' obligations are those of
/// [`recv_into_save_slot`]).
fn fill_save_slot<T>(
    segments: &[Segment],
    slot: orbitkv_core::Slot,
    len: usize,
    fill: impl FnOnce(&mut [u8]) -> std::io::Result<T>,
) -> std::io::Result<(&[u8], T)> {
    let seg = segments
        .get(slot.segment as usize)
        .ok_or_else(|| std::io::Error::other(format!("no arena segment {}", slot.segment)))?;
    if len as u64 > slot.len {
        return Err(std::io::Error::other("block larger than its slot"));
    }
    // SAFETY: the slot was allocated by `begin_save` to a save of the
    // Manager-internal session that calls this (caller's obligation above): it
    // is invisible, its location was handed to no client, and the cache
    // allocates it to nothing else until that save is committed or aborted, which
    // happens after the returned slice is dropped; so within this process this
    // is the only reference to these bytes (the mutable one ends when it
    // becomes the shared one returned). A client of a trusted uid maps the whole
    // arena read-write and could still write here; it can only damage cache
    // content, which the trust model (same or allowed uid) already grants it,
    // and the bytes are checked against the source's checksum before commit.
    let buf = unsafe { seg.mapping().slice_mut(slot.offset, len) }.map_err(std::io::Error::other)?;
    let out = fill(buf)?;
    Ok((buf, out))
}

/// The peer tier's reads into DRAM: fill the first `len` bytes of `slot` from
/// `r` and return them, for the caller to checksum (on this thread or a
/// helper's).
///
/// The caller must hold `slot` as an allocated, uncommitted save slot of a
/// Manager-internal session (`CacheState::begin_save` in `peer::fill`), and
/// must commit or abort that save only after the returned slice is dropped.
pub fn recv_into_save_slot<'a>(
    segments: &'a [Segment],
    slot: orbitkv_core::Slot,
    len: usize,
    r: &mut impl std::io::Read,
) -> std::io::Result<&'a [u8]> {
    fill_save_slot(segments, slot, len, |buf| r.read_exact(buf)).map(|(bytes, ())| bytes)
}

/// [`recv_into_save_slot`] that also hashes (xxh3-64) the bytes as they land:
/// after each receive (as much as the socket holds, up to the rest of the
/// block) its bytes are folded in while still in cache, instead of one pass
/// over the whole block after it. Returns the bytes and their sum; the same obligations as [`recv_into_save_slot`]. The sum is of the
/// bytes as received: a change to the slot after its part was folded in (only
/// a trusted client could make one) is not seen here, and the bytes were
/// received into a slot no client has been told of.
pub fn recv_into_save_slot_hashed<'a>(
    segments: &'a [Segment],
    slot: orbitkv_core::Slot,
    len: usize,
    r: &mut impl std::io::Read,
) -> std::io::Result<(&'a [u8], u64)> {
    let (bytes, sum) = fill_save_slot(segments, slot, len, |buf| {
        let mut sum = crate::checksum::Progressive::new(len);
        let mut got = 0;
        while got < len {
            match r.read(&mut buf[got..]) {
                Ok(0) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "peer closed mid-block",
                    ));
                }
                Ok(n) => {
                    got += n;
                    sum.update(&buf[..got]);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(sum)
    })?;
    Ok((bytes, sum.finish(bytes)))
}

/// The peer tier's sends: write the first `len` bytes of `slot` to `w` and
/// return them, for the caller to checksum after (on this thread or a
/// helper's: from cache, the socket copy having read them from memory). The
/// caller must hold an acquired lease on the block in `slot`
/// (`AcquireStep::Ready` in `peer::source`) until the returned slice is dropped.
pub fn send_leased_slot<'a>(
    segments: &'a [Segment],
    slot: orbitkv_core::Slot,
    len: usize,
    w: &mut impl std::io::Write,
) -> std::io::Result<&'a [u8]> {
    let seg = segments
        .get(slot.segment as usize)
        .ok_or_else(|| std::io::Error::other(format!("no arena segment {}", slot.segment)))?;
    // SAFETY: the block is pinned by an acquired lease of the caller's session
    // (caller's obligation above): a pinned, visible block's slot is frozen
    // (never freed, reallocated or written by the Manager) until the lease ends,
    // which happens after the returned slice is dropped. A client of a trusted
    // uid could still write into its mapping of this range between the copy
    // and the hash; the reader then finds its checksum of the bytes it received
    // differs from the source's and stores nothing (it stores only what it
    // received and verified).
    let buf = unsafe { seg.mapping().slice(slot.offset, len) }.map_err(std::io::Error::other)?;
    w.write_all(buf)?;
    Ok(buf)
}

/// Blocks per spill batch: several × the ring depth, so the device never idles.
const SPILL_BATCH: usize = 64;
const GENERATIONS_FILE: &str = "generations.v1";

/// The end of the SSD tier's header check after start-up is logged once.
static HEADER_CHECK_LOGGED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Per-block SSD write (spill) failures, e.g. a full disk.
static SPILL_FAILURES: Occurrences = Occurrences::new();
/// Per-block SSD read failures while staging (corrupt or unreadable copies).
static STAGE_FAILURES: Occurrences = Occurrences::new();

pub fn ssd_key(tk: &TierKey) -> SsdKey {
    SsdKey {
        fingerprint: tk.ns.fingerprint.0,
        shard: tk.ns.shard,
        salt: tk.ns.salt,
        generation: tk.generation,
        hash: tk.hash,
    }
}

fn tier_key(k: &SsdKey) -> TierKey {
    TierKey {
        ns: orbitkv_core::NamespaceKey {
            fingerprint: Fingerprint(k.fingerprint),
            shard: k.shard,
            salt: k.salt,
        },
        generation: k.generation,
        hash: k.hash,
    }
}

/// Open (and recover) the SSD directory, restore persisted generations and
/// hand recovered blocks to the cache as dormant entries. `SsdTier::open`
/// creates the directory 0700 and refuses one that others can write.
pub fn open(settings: &SsdSettings, cache: &mut CacheState) -> Result<SsdTier, SsdError> {
    let mut cfg = SsdConfig::new(&settings.dir, settings.capacity);
    cfg.mode = settings.mode;
    cfg.engine = settings.engine;
    // Start-up trusts the checksummed journal and does no per-block I/O; each block's
    // header is checked on a thread afterwards (one random 4 KiB read a block), and
    // what fails is dropped there and forgotten by the cache (`Tier::take_lost`).
    // Every staging read verifies header, key and payload checksum meanwhile, and a
    // failure is a miss (`finish_stage(.., false)` dooms the block): never wrong bytes.
    cfg.verify_on_open = RecoveryVerify::Background;
    let mut last_pct = u64::MAX;
    let mut progress = |p: orbitkv_ssd::RecoveryProgress| {
        if p.total < 10_000 && p.phase != RecoveryPhase::Done {
            return;
        }
        let pct = (p.done * 100).checked_div(p.total).unwrap_or(100);
        if pct / 10 != last_pct / 10 || p.phase == RecoveryPhase::Done {
            last_pct = pct;
            log!(
                Info,
                "SSD recovery {:?}: {}/{} ({pct}%)",
                p.phase,
                p.done,
                p.total
            );
        }
    };
    let (tier, report) = SsdTier::open(cfg, &mut progress)?;
    warn_about_open(&report);
    for (fp, g) in load_generations(&settings.dir) {
        cache.restore_generation(fp, g);
    }
    log!(
        Info,
        "SSD tier {} ({} mode, {} engine{}): recovered {} block(s) in {:.3} s; rejected: {} other format version, {} corrupt, {} torn",
        settings.dir.display(),
        if settings.mode == orbitkv_ssd::IoMode::Direct {
            "direct"
        } else {
            "kernel"
        },
        tier.engine().kind,
        tier.engine()
            .fallback_reason
            .as_deref()
            .map(|r| format!(", fell back: {r}"))
            .unwrap_or_default(),
        report.recovered.len(),
        report.elapsed.as_secs_f64(),
        report.rejected_version,
        report.corrupt,
        report.torn,
    );
    // DRAM and SSD decided as one capacity: the cache's policy also ranks every
    // SSD copy and keeps the tier within `capacity` (the store's own least
    // recently used drops, `make_room`, remain for its per-block overhead).
    cache.enable_ssd_tiers(settings.admit_hits, settings.write_policy, settings.capacity);
    cache.adopt_recovered(report.recovered.iter().map(|(k, len)| (tier_key(k), *len)));
    Ok(tier)
}

/// What recovery changed or put off, once at start-up.
fn warn_about_open(report: &orbitkv_ssd::RecoveryReport) {
    for p in &report.tightened {
        log!(
            Warn,
            "{} was readable by other users (older version); permissions tightened to owner-only",
            p.display()
        );
    }
    for p in &report.removed_temp {
        log!(Info, "removed stale temporary file {}", p.display());
    }
    if let Some(why) = &report.compaction_deferred {
        log!(
            Warn,
            "SSD filesystem is full: journal compaction deferred ({why}); serving recovered blocks, new spills may fail until space is freed"
        );
    }
}

fn load_generations(dir: &Path) -> Vec<(Fingerprint, u64)> {
    let Ok(text) = std::fs::read_to_string(dir.join(GENERATIONS_FILE)) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(hex), Some(g)) = (it.next(), it.next()) else {
            continue;
        };
        let (Some(fp), Ok(g)) = (decode_hex32(hex), g.parse::<u64>()) else {
            log!(Warn, "ignoring malformed line in {GENERATIONS_FILE}: {line:?}");
            continue;
        };
        out.push((Fingerprint(fp), g));
    }
    out
}

fn decode_hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Persist every fingerprint's generation (atomic replace + fsync), so a
/// restart never serves blocks of a generation that was reset.
pub fn persist_generations(dir: &Path, table: &[(Fingerprint, u64)]) -> std::io::Result<()> {
    let tmp: PathBuf = dir.join(format!("{GENERATIONS_FILE}{}", orbitkv_ssd::TEMP_SUFFIX));
    let res = write_generations(&tmp, table).and_then(|()| std::fs::rename(&tmp, dir.join(GENERATIONS_FILE)));
    if let Err(e) = res {
        let _ = std::fs::remove_file(&tmp); // e.g. a full disk: leave nothing behind
        return Err(e);
    }
    std::fs::File::open(dir)?.sync_all()
}

/// Write the table to a new owner-only file and fsync it.
fn write_generations(tmp: &Path, table: &[(Fingerprint, u64)]) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(orbitkv_ssd::FILE_MODE)
        .open(tmp)?;
    for (fp, g) in table {
        let hex: String = fp.0.iter().map(|b| format!("{b:02x}")).collect();
        writeln!(f, "{hex} {g}")?;
    }
    f.sync_all()
}

impl Tier for SsdTier {
    fn stage(&self, segments: &[Segment], jobs: &[StageJob]) -> Vec<bool> {
        ssd_stage(segments, self, jobs)
    }

    fn spill(&self, segments: &[Segment], jobs: &[SpillJob]) -> Vec<Spilled> {
        ssd_spill(segments, self, jobs)
    }

    fn remove(&self, keys: &[TierKey]) {
        for tk in keys {
            SsdTier::remove(self, &ssd_key(tk));
        }
    }

    fn oldest(&self, n: usize) -> Vec<TierKey> {
        SsdTier::oldest(self, n).iter().map(tier_key).collect()
    }

    fn take_lost(&self) -> Vec<TierKey> {
        let lost: Vec<TierKey> = self.take_header_check_drops().iter().map(tier_key).collect();
        let hc = self.header_check();
        if !lost.is_empty() {
            log!(
                Warn,
                "SSD header check: {} recovered block(s) dropped (header torn or not the journal's write); misses from now on",
                lost.len()
            );
        }
        if hc.finished
            && hc.total > 0
            && !HEADER_CHECK_LOGGED.swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            log!(
                Info,
                "SSD header check finished: {} block(s) checked, {} dropped",
                hc.checked,
                hc.dropped
            );
        }
        lost
    }

    fn status(&self) -> TierStatus {
        TierStatus {
            stats: self.stats(),
            engine: self.engine().kind,
            fallback_reason: self.engine().fallback_reason.clone(),
        }
    }
}

/// Read SSD copies into staging slots. Returns per job whether the block is
/// now in DRAM, verified (checksum, key and length).
fn ssd_stage(segments: &[Segment], ssd: &SsdTier, jobs: &[StageJob]) -> Vec<bool> {
    let mut items: Vec<(SsdKey, &mut [u8])> = Vec::with_capacity(jobs.len());
    let mut usable = Vec::with_capacity(jobs.len());
    for j in jobs {
        let Some(seg) = segments.get(j.slot.segment as usize) else {
            usable.push(false);
            continue;
        };
        // SAFETY: the slot was allocated for this job by `CacheState::acquire`
        // (Busy::Staging) and the job is held by a `StageGuard` until
        // `finish_stage`: the Manager has handed its location to no client and
        // allocates it to nothing else meanwhile, and jobs are distinct slots
        // (the cache stages each block once), so within this process this is the
        // only reference to these bytes. Every client maps the whole arena
        // read-write, so a client of a trusted uid that writes outside the slots
        // it was given can still race this read; it can only damage cache
        // content (the bytes are checksummed against the SSD header before the
        // block becomes visible), which the trust model (same or allowed uid)
        // already grants it.
        match unsafe { seg.mapping().slice_mut(j.slot.offset, j.slot.len as usize) } {
            Ok(buf) => {
                items.push((ssd_key(&j.tier_key), buf));
                usable.push(true);
            }
            Err(_) => usable.push(false),
        }
    }
    let results = ssd.read_batch(&mut items);
    let mut results = results.into_iter();
    jobs.iter()
        .zip(usable)
        .map(|(j, usable)| {
            if !usable {
                return false;
            }
            match results.next() {
                Some(Ok(n)) if n as u64 == j.block_bytes => true,
                Some(Ok(n)) => {
                    warn_sampled!(
                        STAGE_FAILURES.inc(),
                        "SSD block {}: {n} bytes, expected {}; dropped",
                        short(&j.tier_key),
                        j.block_bytes
                    );
                    false
                }
                Some(Err(e)) => {
                    warn_sampled!(
                        STAGE_FAILURES.inc(),
                        "SSD block {} not served: {e}; dropped (a miss from now on)",
                        short(&j.tier_key)
                    );
                    false
                }
                None => false,
            }
        })
        .collect()
}

fn short(tk: &TierKey) -> String {
    tk.hash[..6].iter().map(|b| format!("{b:02x}")).collect()
}

/// The write-behind worker: deletions first, then spills, until shutdown.
pub fn worker(shared: Arc<Shared>) {
    let Some(tier) = shared.tier.as_deref() else {
        return;
    };
    while !shared.is_shutting_down() {
        // Copies the tier dropped itself (header check after start-up): the cache
        // forgets them (SSD-only blocks leave the index, so lookups miss; a block
        // with a DRAM copy keeps it); busy or pinned ones are skipped here and fail
        // their staging read instead. What it returns is deleted (already gone, or a
        // copy spilled again since, which the cache no longer counts).
        let lost = tier.take_lost();
        if !lost.is_empty() {
            let forgotten = shared.cache().ssd_droppable(&lost);
            tier.remove(&forgotten);
        }
        let removals = shared.cache().take_ssd_removals();
        tier.remove(&removals);
        let jobs = shared.cache().spill_candidates(SPILL_BATCH);
        // Copies the policy gave up to make room for these spills go first.
        let made_room = shared.cache().take_ssd_removals();
        tier.remove(&made_room);
        if jobs.is_empty() {
            if removals.is_empty() {
                std::thread::sleep(Duration::from_millis(10));
            }
            continue;
        }
        spill_batch(&shared, tier, jobs);
    }
}

/// Spill one batch from `spill_candidates` and report it, whatever happens in
/// between. A full tier gets one chance to make room, then the rest fail.
fn spill_batch(shared: &Shared, tier: &dyn Tier, jobs: Vec<SpillJob>) {
    let spilling = SpillGuard::new(shared, jobs);
    let jobs = spilling.jobs();
    let mut ok = vec![false; jobs.len()];
    let mut todo: Vec<usize> = (0..jobs.len()).collect();
    for attempt in 0..2 {
        let batch: Vec<SpillJob> = todo.iter().map(|&i| jobs[i]).collect();
        let results = tier.spill(&shared.segments, &batch);
        let mut full = Vec::new();
        for (&i, r) in todo.iter().zip(results) {
            match r {
                Spilled::Durable => ok[i] = true,
                Spilled::Full => full.push(i),
                Spilled::Failed => {}
            }
        }
        if full.is_empty() || attempt == 1 {
            break;
        }
        make_room(shared, tier, full.len() * 2);
        todo = full;
    }
    spilling.finish(&ok);
}

/// Write spill jobs to SSD: one outcome per job.
fn ssd_spill(segments: &[Segment], ssd: &SsdTier, jobs: &[SpillJob]) -> Vec<Spilled> {
    let mut out = vec![Spilled::Failed; jobs.len()];
    let mut items: Vec<(SsdKey, &[u8])> = Vec::with_capacity(jobs.len());
    let mut idx = Vec::with_capacity(jobs.len());
    for (i, j) in jobs.iter().enumerate() {
        let Some(seg) = segments.get(j.slot.segment as usize) else {
            continue;
        };
        // SAFETY: the block is visible (committed blocks are never written
        // again through the protocol) and Busy::Spilling, held by a `SpillGuard`
        // until `spill_done`, keeps its slot from being freed or reallocated
        // meanwhile. A client that breaks the protocol and writes a committed
        // slot (every client maps the arena read-write) can race this read: a
        // copy torn by such a write fails its checksum on read-back and is
        // dropped; bytes changed before the checksum was taken are the same
        // bytes the DRAM copy already serves (damage the trust model grants).
        if let Ok(buf) = unsafe { seg.mapping().slice(j.slot.offset, j.block_bytes as usize) } {
            items.push((ssd_key(&j.tier_key), buf));
            idx.push(i);
        }
    }
    let results = ssd.write_batch(&items);
    for (i, r) in idx.into_iter().zip(results) {
        out[i] = match r {
            Ok(()) => Spilled::Durable,
            Err(SsdError::Full { .. }) => Spilled::Full,
            Err(e) => {
                warn_sampled!(
                    SPILL_FAILURES.inc(),
                    "SSD spill of {} failed: {e}",
                    short(&jobs[i].tier_key)
                );
                Spilled::Failed
            }
        };
    }
    out
}

/// The tier is full: delete copies the cache can spare.
fn make_room(shared: &Shared, tier: &dyn Tier, n: usize) {
    // The policy's order first (the copies DRAM + SSD value least), then the
    // store's least recently used (without tiers, or none left to give up).
    let ranked = shared.cache().ssd_make_room(n.max(8));
    if !ranked.is_empty() {
        tier.remove(&ranked);
        return;
    }
    let proposed = tier.oldest(n.max(8));
    let droppable = shared.cache().ssd_droppable(&proposed);
    tier.remove(&droppable);
}

#[cfg(test)]
mod tests {
    use std::panic::{AssertUnwindSafe, catch_unwind};

    use orbitkv_core::{AcquireStep, BlockHash, NamespaceKey, NsId, SaveStatus, SessionId, SpillPolicy};
    use orbitkv_shm::PageSize;

    use super::*;
    use crate::config::ManagerConfig;

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
        let segment = Segment::create("orbitkv-tier-test", slots * BLOCK, PageSize::Base).expect("memfd");
        let mut cache = CacheState::new(&[slots * BLOCK]);
        cache.enable_ssd_with(0, SpillPolicy::Eager);
        let s = cache.open_session();
        let key = NamespaceKey {
            fingerprint: Fingerprint([9; 32]),
            shard: 0,
            salt: [0; 32],
        };
        let (ns, _) = cache.register_namespace(key, BLOCK).expect("namespace");
        let shared = Shared::new(config, vec![segment], cache, Some(Box::new(PanickingTier)));
        (shared, s, ns)
    }

    fn save(c: &mut CacheState, s: SessionId, ns: NsId, hs: &[BlockHash]) {
        let (id, _) = c.begin_save(s, ns, hs).expect("begin");
        c.commit_save(s, id).expect("commit");
    }

    #[test]
    fn a_panic_while_staging_leaves_no_block_staging() {
        let (shared, s, ns) = shared(2);
        let lease = {
            let mut c = shared.cache();
            save(&mut c, s, ns, &[h(1)]);
            for j in c.spill_candidates(8) {
                c.spill_done(&j, true);
            }
            save(&mut c, s, ns, &[h(2), h(3)]); // demotes h(1) to SSD-only
            c.lookup(s, ns, &[h(1)]).expect("lookup").lease.expect("hit")
        };
        let jobs = match shared.cache().acquire(s, lease).expect("acquire") {
            AcquireStep::Stage(jobs) => jobs,
            other => panic!("stage expected, got {other:?}"),
        };
        let r = catch_unwind(AssertUnwindSafe(|| stage_for_lease(&shared, jobs)));
        assert!(r.is_err(), "the injected panic propagates");
        let mut c = shared.cache();
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
        save(&mut shared.cache(), s, ns, &[h(1)]);
        let jobs = shared.cache().spill_candidates(8);
        assert_eq!(jobs.len(), 1);
        let r = catch_unwind(AssertUnwindSafe(|| spill_batch(&shared, &PanickingTier, jobs)));
        assert!(r.is_err(), "the injected panic propagates");
        let mut c = shared.cache();
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

#[cfg(test)]
mod ssd_file_tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::os::unix::fs::MetadataExt;

    use super::*;

    #[test]
    fn generations_file_is_private_and_leaves_no_temporary() {
        let d = tempfile::tempdir().expect("tempdir");
        let table = [(Fingerprint([7; 32]), 3u64)];
        persist_generations(d.path(), &table).expect("persist");
        let md = std::fs::metadata(d.path().join(GENERATIONS_FILE)).expect("stat");
        assert_eq!(md.mode() & 0o777, 0o600, "mode {:o}", md.mode() & 0o777);
        assert_eq!(load_generations(d.path()), table.to_vec());
        let names: Vec<_> = std::fs::read_dir(d.path())
            .expect("list")
            .map(|e| e.expect("e").file_name())
            .collect();
        assert_eq!(names, [GENERATIONS_FILE]);
    }
}
