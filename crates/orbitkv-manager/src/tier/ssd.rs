//! The SSD tier behind the [`Tier`] interface: opening and recovering its
//! directory, staging reads of SSD copies into DRAM and spill writes from DRAM.
#![allow(unsafe_code)]

use orbitkv_core::{CacheState, Fingerprint, SpillJob, StageJob, TierKey};
use orbitkv_shm::Segment;
use orbitkv_ssd::{RecoveryPhase, RecoveryVerify, SsdConfig, SsdError, SsdKey, SsdTier};

use super::generations::load_generations;
use super::{Spilled, Tier, TierStatus};
use crate::config::SsdSettings;
use crate::log::Occurrences;

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
        let Some(seg) = segments.get(j.slot().segment as usize) else {
            usable.push(false);
            continue;
        };
        // SAFETY: the slot was allocated for this job by `CacheState::acquire`
        // (Busy::Staging; only the cache can make a `StageJob`) and the job is held by a `StageGuard` until
        // `finish_stage`: the Manager has handed its location to no client and
        // allocates it to nothing else meanwhile, and jobs are distinct slots
        // (the cache stages each block once), so within this process this is the
        // only reference to these bytes. Every client maps the whole arena
        // read-write, so a client of a trusted uid that writes outside the slots
        // it was given can still race this read; it can only damage cache
        // content (the bytes are checksummed against the SSD header before the
        // block becomes visible), which the trust model (same or allowed uid)
        // already grants it.
        match unsafe { seg.mapping().slice_mut(j.slot().offset, j.slot().len as usize) } {
            Ok(buf) => {
                items.push((ssd_key(&j.tier_key()), buf));
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
                Some(Ok(n)) if n as u64 == j.block_bytes() => true,
                Some(Ok(n)) => {
                    warn_sampled!(
                        STAGE_FAILURES.inc(),
                        "SSD block {}: {n} bytes, expected {}; dropped",
                        short(&j.tier_key()),
                        j.block_bytes()
                    );
                    false
                }
                Some(Err(e)) => {
                    warn_sampled!(
                        STAGE_FAILURES.inc(),
                        "SSD block {} not served: {e}; dropped (a miss from now on)",
                        short(&j.tier_key())
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

/// Write spill jobs to SSD: one outcome per job.
fn ssd_spill(segments: &[Segment], ssd: &SsdTier, jobs: &[SpillJob]) -> Vec<Spilled> {
    let mut out = vec![Spilled::Failed; jobs.len()];
    let mut items: Vec<(SsdKey, &[u8])> = Vec::with_capacity(jobs.len());
    let mut idx = Vec::with_capacity(jobs.len());
    for (i, j) in jobs.iter().enumerate() {
        let Some(seg) = segments.get(j.slot().segment as usize) else {
            continue;
        };
        // SAFETY: the block is visible (committed blocks are never written
        // again through the protocol) and Busy::Spilling (only the cache can
        // make a `SpillJob`, and only for such a block), held by a `SpillGuard`
        // until `spill_done`, keeps its slot from being freed or reallocated
        // meanwhile. A client that breaks the protocol and writes a committed
        // slot (every client maps the arena read-write) can race this read: a
        // copy torn by such a write fails its checksum on read-back and is
        // dropped; bytes changed before the checksum was taken are the same
        // bytes the DRAM copy already serves (damage the trust model grants).
        if let Ok(buf) = unsafe { seg.mapping().slice(j.slot().offset, j.block_bytes() as usize) } {
            items.push((ssd_key(&j.tier_key()), buf));
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
                    short(&jobs[i].tier_key())
                );
                Spilled::Failed
            }
        };
    }
    out
}
