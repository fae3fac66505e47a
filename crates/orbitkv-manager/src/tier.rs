//! The SSD tier's I/O: opening and recovering the directory, the write-behind
//! worker (spills and deletions) and staging reads for leases. Cache decisions
//! stay in `orbitkv_core` (`spill_candidates`, `acquire`, `ssd_droppable`,
//! `take_ssd_removals`); this module only moves bytes and reports back.
//!
//! The only `unsafe` of the Manager: borrowing arena slots as slices for the
//! SSD engine, each under the cache-protocol right that freezes the slot.
#![allow(unsafe_code)]

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use orbitkv_core::{CacheState, Fingerprint, SpillJob, StageJob, TierKey};
use orbitkv_ssd::{RecoveryPhase, SsdConfig, SsdError, SsdKey, SsdTier};

use crate::config::SsdSettings;
use crate::shared::Shared;

/// Blocks per spill batch: several × the ring depth, so the device never idles.
const SPILL_BATCH: usize = 64;
const GENERATIONS_FILE: &str = "generations.v1";

/// Counts one kind of repeated warning and says when to log it: the 1st, 2nd, 4th,
/// 8th … occurrence, so a failing disk cannot flood the log (as Busy refusals).
pub struct RateLimitedWarn(AtomicU64);

impl RateLimitedWarn {
    pub const fn new() -> Self {
        RateLimitedWarn(AtomicU64::new(0))
    }

    /// Count one occurrence; `Some(n)` when this, the n-th, should be logged.
    pub fn hit(&self) -> Option<u64> {
        let n = self.0.fetch_add(1, Ordering::Relaxed) + 1;
        n.is_power_of_two().then_some(n)
    }
}

/// Per-block SSD write (spill) failures, e.g. a full disk.
static SPILL_FAILURES: RateLimitedWarn = RateLimitedWarn::new();

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
    cache.enable_ssd_with(settings.admit_hits, settings.write_policy);
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

/// Read SSD copies into staging slots. Returns per job whether the block is
/// now in DRAM, verified (checksum, key and length).
pub fn stage(shared: &Shared, ssd: &SsdTier, jobs: &[StageJob]) -> Vec<bool> {
    let mut items: Vec<(SsdKey, &mut [u8])> = Vec::with_capacity(jobs.len());
    let mut usable = Vec::with_capacity(jobs.len());
    for j in jobs {
        let Some(seg) = shared.segments.get(j.slot.segment as usize) else {
            usable.push(false);
            continue;
        };
        // SAFETY: the slot was allocated for this job by `CacheState::acquire`
        // (Busy::Staging): no client knows its location and nothing else can
        // allocate it until `finish_stage`, so this is the only reference.
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
                    log!(
                        Warn,
                        "SSD block {}: {n} bytes, expected {}; dropped",
                        short(&j.tier_key),
                        j.block_bytes
                    );
                    false
                }
                Some(Err(e)) => {
                    log!(
                        Warn,
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
    let Some(ssd) = shared.ssd.as_ref() else { return };
    while !shared.is_shutting_down() {
        let removals = shared.cache().take_ssd_removals();
        for tk in &removals {
            ssd.remove(&ssd_key(tk));
        }
        let jobs = shared.cache().spill_candidates(SPILL_BATCH);
        if jobs.is_empty() {
            if removals.is_empty() {
                std::thread::sleep(Duration::from_millis(10));
            }
            continue;
        }
        let ok = spill(&shared, ssd, &jobs);
        let mut cache = shared.cache();
        for (j, ok) in jobs.iter().zip(ok) {
            cache.spill_done(j, ok);
        }
    }
}

fn spill(shared: &Shared, ssd: &SsdTier, jobs: &[SpillJob]) -> Vec<bool> {
    let mut ok = vec![false; jobs.len()];
    let mut todo: Vec<usize> = (0..jobs.len()).collect();
    for attempt in 0..2 {
        let mut items: Vec<(SsdKey, &[u8])> = Vec::with_capacity(todo.len());
        let mut idx = Vec::with_capacity(todo.len());
        for &i in &todo {
            let j = &jobs[i];
            let Some(seg) = shared.segments.get(j.slot.segment as usize) else {
                continue;
            };
            // SAFETY: the block is visible (committed blocks are never written
            // again) and Busy::Spilling keeps its slot from being freed or
            // reallocated until `spill_done`.
            if let Ok(buf) = unsafe { seg.mapping().slice(j.slot.offset, j.block_bytes as usize) } {
                items.push((ssd_key(&j.tier_key), buf));
                idx.push(i);
            }
        }
        let results = ssd.write_batch(&items);
        let mut full = Vec::new();
        for (i, r) in idx.into_iter().zip(results) {
            match r {
                Ok(()) => ok[i] = true,
                Err(SsdError::Full { .. }) => full.push(i),
                Err(e) => {
                    if let Some(n) = SPILL_FAILURES.hit() {
                        log!(
                            Warn,
                            "SSD spill of {} failed: {e} (spill failure {n}; logging the 1st, 2nd, 4th, 8th …)",
                            short(&jobs[i].tier_key)
                        );
                    }
                }
            }
        }
        if full.is_empty() || attempt == 1 {
            break;
        }
        make_room(shared, ssd, full.len() * 2);
        todo = full;
    }
    ok
}

/// The SSD is full: delete least recently used copies the cache can spare.
fn make_room(shared: &Shared, ssd: &SsdTier, n: usize) {
    let proposed: Vec<TierKey> = ssd.oldest(n.max(8)).iter().map(tier_key).collect();
    let droppable = shared.cache().ssd_droppable(&proposed);
    for tk in &droppable {
        ssd.remove(&ssd_key(tk));
    }
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn rate_limited_warning_fires_on_powers_of_two() {
        let w = RateLimitedWarn::new();
        let fired: Vec<u64> = (0..100).filter_map(|_| w.hit()).collect();
        assert_eq!(fired, [1, 2, 4, 8, 16, 32, 64]);
    }
}
