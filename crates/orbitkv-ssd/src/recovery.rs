//! Opening the tier: directory lock, space check, engine choice, journal replay,
//! extent placement, header verification, data-file sizing and the journal rewrite.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::alloc::ExtentAllocator;
use crate::bgverify::Background;
use crate::config::{EnginePref, IoMode, RecoveryVerify, SsdConfig, check_direct_supported, free_space};
use crate::dir::{self, FILE_MODE};
use crate::error::{Result, SsdError};
use crate::format::{
    FORMAT_VERSION, HEADER_SIZE, JOURNAL_RECORD_SIZE, JournalRecord, RecordKind, SECTOR, extent_bytes,
};
use crate::header::{HeaderVerdict, header_verdict};
use crate::journal::{self, Journal};
use crate::key::SsdKey;
use crate::state::State;
use crate::tier::{Counters, DATA_FILE, EngineInfo, SsdTier};
use crate::uring::{AlignedBuf, Bufs, Engine, IoReq};

const LOCK_FILE: &str = "LOCK";
/// Header reads per batch during recovery.
const VERIFY_CHUNK: usize = 1024;

/// Phase of recovery reported to the progress callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoveryPhase {
    /// Reading journal records.
    Journal,
    /// Reading and checking block headers.
    VerifyHeaders,
    /// Finished.
    Done,
}

/// Progress of [`SsdTier::open`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryProgress {
    /// Current phase.
    pub phase: RecoveryPhase,
    /// Items done in this phase.
    pub done: u64,
    /// Items in this phase.
    pub total: u64,
}

/// What [`SsdTier::open`] recovered and what it dropped.
#[derive(Debug, Clone, Default)]
pub struct RecoveryReport {
    /// Recovered blocks and their payload lengths, oldest first.
    pub recovered: Vec<(SsdKey, u64)>,
    /// Journal records read.
    pub journal_records: u64,
    /// Journal records or block headers of another format version (not served).
    pub rejected_version: u64,
    /// Journal records or block headers that failed checksums, or headers whose key,
    /// length or payload checksum disagree with the journal.
    pub corrupt: u64,
    /// Torn journal tail, and blocks whose extent lies beyond the end of the data file.
    pub torn: u64,
    /// Older extents overlapped by a newer write (their space was reused).
    pub overlapped: u64,
    /// Blocks beyond a reduced `capacity_bytes`.
    pub out_of_capacity: u64,
    /// Wall time of `open`.
    pub elapsed: Duration,
    /// Paths whose modes were tightened to 0700 (directory) or 0600 (files): left open
    /// by an older version.
    pub tightened: Vec<PathBuf>,
    /// Stale temporary files (`*.tmp`) removed.
    pub removed_temp: Vec<PathBuf>,
    /// Why the journal rewrite at open was deferred (the filesystem is full); the tier
    /// appends to the journal as it was and retries the rewrite later.
    pub compaction_deferred: Option<String>,
    /// Wall time of each step of `open`, in order (`setup`, `replay`, `place`,
    /// `verify_headers`, `size_file`, `journal`, `index`, `start_check`).
    pub timings: Vec<(&'static str, Duration)>,
}

type Progress<'a> = &'a mut dyn FnMut(RecoveryProgress);

impl SsdTier {
    /// Open (or create) the tier in `cfg.dir` and recover the blocks written earlier.
    pub fn open(cfg: SsdConfig, progress: Progress<'_>) -> Result<(SsdTier, RecoveryReport)> {
        let t0 = Instant::now();
        cfg.validate()?;
        let capacity = cfg.capacity_bytes / SECTOR * SECTOR;
        let mut tightened = dir::secure_dir(&cfg.dir)?;
        let lock = lock_dir(&cfg)?;
        let tidied = dir::tidy_files(&cfg.dir)?;
        tightened.extend(tidied.tightened);
        if cfg.mode == IoMode::Direct {
            check_direct_supported(&cfg.dir)?;
        }
        check_space(&cfg, capacity)?;
        let data = open_data_file(&cfg)?;
        let orig_len = data
            .metadata()
            .map_err(|e| SsdError::io("stat data file", e))?
            .len();
        let (engine, info) = make_engine(&cfg)?;
        let mut lap = Lap::new(t0);
        lap.mark("setup");

        // 1. Journal.
        let mut rp = journal::replay(&cfg.dir, &mut |done, total| {
            progress(RecoveryProgress {
                phase: RecoveryPhase::Journal,
                done,
                total,
            })
        })
        .map_err(|e| SsdError::io("reading journal", e))?;
        lap.mark("replay");
        let mut report = RecoveryReport {
            journal_records: rp.records,
            rejected_version: rp.rejected_version,
            corrupt: rp.corrupt,
            torn: rp.torn,
            tightened,
            removed_temp: tidied.removed_temp,
            ..Default::default()
        };
        // 2. Place extents; 3. verify their headers; 4. size the data file.
        let cands = std::mem::take(&mut rp.entries);
        let mut dropped: Vec<SsdKey> = Vec::new();
        let (mut alloc, mut placed) = place_extents(cands, capacity, orig_len, &mut report, &mut dropped);
        lap.mark("place");
        if cfg.verify_on_open == RecoveryVerify::Headers && !placed.is_empty() {
            let mut v = Verifier {
                data: &data,
                engine: &engine,
                alloc: &mut alloc,
                report: &mut report,
                dropped: &mut dropped,
            };
            placed = v.run(placed, progress)?;
            lap.mark("verify_headers");
        }
        size_data_file(&data, orig_len, capacity)?;
        lap.mark("size_file");

        // 5. Index, oldest first, and the journal: kept and appended to, or rewritten.
        // Sequence order as positions (the records themselves are not moved).
        let mut by_seq: Vec<(u64, u32)> = placed.iter().zip(0u32..).map(|(r, i)| (r.seq, i)).collect();
        if !by_seq.is_sorted() {
            by_seq.sort_unstable();
        }
        let oldest_first = || by_seq.iter().filter_map(|&(_, i)| placed.get(i as usize));
        let (journal, seq) = open_journal(&cfg, &rp, oldest_first(), placed.len(), &dropped, &mut report)?;
        lap.mark("journal");
        let (st, recovered) = State::load(alloc, seq, journal, oldest_first(), placed.len());
        report.recovered = recovered;
        let st = Arc::new(Mutex::new(st));
        lap.mark("index");
        let engine = Arc::new(engine);
        let background = if cfg.verify_on_open == RecoveryVerify::Background {
            let fd = data
                .try_clone()
                .map_err(|e| SsdError::io("duplicating the data file handle", e))?;
            Background::start(placed, fd, Arc::clone(&engine), Arc::clone(&st))
                .map_err(|e| SsdError::io("starting the header check thread", e))?
        } else {
            Background::none()
        };
        lap.mark("start_check");
        progress(RecoveryProgress {
            phase: RecoveryPhase::Done,
            done: report.recovered.len() as u64,
            total: report.recovered.len() as u64,
        });
        report.timings = lap.done;
        report.elapsed = t0.elapsed();
        let tier = SsdTier {
            cfg,
            capacity,
            data,
            engine,
            info,
            state: st,
            counters: Counters::default(),
            background,
            _lock: lock,
        };
        Ok((tier, report))
    }
}

/// Step timer for [`RecoveryReport::timings`].
struct Lap {
    at: Instant,
    done: Vec<(&'static str, Duration)>,
}

impl Lap {
    fn new(t0: Instant) -> Lap {
        Lap {
            at: t0,
            done: Vec::with_capacity(8),
        }
    }
    fn mark(&mut self, step: &'static str) {
        let now = Instant::now();
        self.done.push((step, now - self.at));
        self.at = now;
    }
}

/// Take the directory's flock, so that one tier at a time uses it.
fn lock_dir(cfg: &SsdConfig) -> Result<File> {
    let lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        .open(cfg.dir.join(LOCK_FILE))
        .map_err(|e| SsdError::io("opening LOCK", e))?;
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).map_err(|e| {
        if e == rustix::io::Errno::WOULDBLOCK {
            SsdError::Locked { dir: cfg.dir.clone() }
        } else {
            SsdError::io("locking LOCK", e.into())
        }
    })?;
    Ok(lock)
}

/// Refuse a capacity that the filesystem cannot hold (beyond what the data file holds).
fn check_space(cfg: &SsdConfig, capacity: u64) -> Result<()> {
    let allocated = std::fs::metadata(cfg.dir.join(DATA_FILE))
        .map(|m| m.blocks().saturating_mul(512))
        .unwrap_or(0);
    let free = free_space(&cfg.dir)?;
    if capacity > free.saturating_add(allocated) {
        return Err(SsdError::InsufficientSpace {
            dir: cfg.dir.clone(),
            capacity,
            available: free.saturating_add(allocated),
        });
    }
    Ok(())
}

fn open_data_file(cfg: &SsdConfig) -> Result<File> {
    let path = cfg.dir.join(DATA_FILE);
    let mut oo = OpenOptions::new();
    oo.read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE);
    if cfg.mode == IoMode::Direct {
        oo.custom_flags(libc::O_DIRECT);
    }
    oo.open(&path).map_err(|e| {
        if cfg.mode == IoMode::Direct && e.raw_os_error() == Some(libc::EINVAL) {
            SsdError::DirectUnsupported {
                dir: cfg.dir.clone(),
                reason: format!("open with O_DIRECT failed: {e}"),
            }
        } else {
            SsdError::io(format!("opening {}", path.display()), e)
        }
    })
}

fn make_engine(cfg: &SsdConfig) -> Result<(Engine, EngineInfo)> {
    choose_engine(cfg, || Engine::uring(cfg.io_threads, cfg.queue_depth))
}

fn engine_info(kind: &'static str, fallback_reason: Option<String>) -> EngineInfo {
    EngineInfo {
        kind,
        fallback_reason,
    }
}

fn choose_engine(
    cfg: &SsdConfig,
    uring: impl FnOnce() -> io::Result<Engine>,
) -> Result<(Engine, EngineInfo)> {
    let psync = || Engine::psync(cfg.psync_threads).map_err(|e| SsdError::io("starting psync threads", e));
    match cfg.engine {
        EnginePref::Psync => Ok((psync()?, engine_info("psync", None))),
        EnginePref::Uring => match uring() {
            Ok(e) => Ok((e, engine_info("io_uring", None))),
            Err(e) => Err(SsdError::EngineUnavailable(e.to_string())),
        },
        EnginePref::Auto => match uring() {
            Ok(e) => Ok((e, engine_info("io_uring", None))),
            Err(err) => Ok((
                psync()?,
                engine_info("psync", Some(format!("io_uring setup failed: {err}"))),
            )),
        },
    }
}

/// Place extents: drop what lies outside the file or the capacity, and of extents that
/// overlap, keep the newest (greedily, newest sequence first: an older extent survives
/// if no newer kept one overlaps it). Returns the allocator with the placed extents
/// reserved, and the placed records in their input order; keys dropped go to `dropped`.
///
/// Sorted by offset, the extents fall into groups that overlap nothing outside the
/// group. Almost every group is a single extent (overlaps need a lost remove record
/// and a reused extent), so the greedy rule runs only inside the few larger groups,
/// and the free list is built in one pass over the sorted extents.
fn place_extents(
    cands: Vec<JournalRecord>,
    capacity: u64,
    orig_len: u64,
    report: &mut RecoveryReport,
    dropped: &mut Vec<SsdKey>,
) -> (ExtentAllocator, Vec<JournalRecord>) {
    let total = capacity / SECTOR;
    // (offset, end, index) of every record whose extent is well-formed and in bounds.
    let mut ext: Vec<(u64, u64, u32)> = Vec::with_capacity(cands.len());
    let mut keep = vec![false; cands.len()];
    for (i, r) in cands.iter().enumerate() {
        let end = r.offset.checked_add(extent_bytes(r.len));
        match end {
            Some(_) if r.file != 0 || !r.offset.is_multiple_of(SECTOR) => report.corrupt += 1,
            None => report.corrupt += 1,
            Some(e) if e > capacity => report.out_of_capacity += 1,
            Some(_) if r.offset.saturating_add(HEADER_SIZE as u64).saturating_add(r.len) > orig_len => {
                report.torn += 1
            }
            Some(e) => ext.push((r.offset, e, i as u32)),
        }
    }
    // Stable: journal order is mostly offset order already.
    ext.sort_by_key(|&(off, _, _)| off);
    let mut used: Vec<(u64, u64)> = Vec::with_capacity(ext.len());
    let mut g = 0;
    while g < ext.len() {
        let mut end = ext[g].1;
        let mut h = g + 1;
        while h < ext.len() && ext[h].0 < end {
            end = end.max(ext[h].1);
            h += 1;
        }
        if h == g + 1 {
            let (off, e, i) = ext[g];
            keep[i as usize] = true;
            used.push((off / SECTOR, (e - off) / SECTOR));
        } else {
            place_group(&mut ext[g..h], &cands, &mut keep, &mut used);
        }
        g = h;
    }
    for &(_, _, i) in &ext {
        if !keep[i as usize] {
            report.overlapped += 1;
        }
    }
    dropped.extend(cands.iter().zip(&keep).filter(|(_, k)| !**k).map(|(r, _)| r.key));
    // In place: nothing moves while every record is kept (the common case).
    let mut placed = cands;
    let mut kept = keep.iter();
    placed.retain(|_| kept.next().copied().unwrap_or(false));
    let alloc = match ExtentAllocator::from_used(total, used.iter().copied()) {
        Some(a) => a,
        // Unreachable: `used` is sorted and disjoint by construction. Fall back to
        // reserving one by one, which refuses overlaps itself.
        None => {
            let mut a = ExtentAllocator::new(total);
            placed.retain(|r| a.reserve(r.offset / SECTOR, extent_bytes(r.len) / SECTOR));
            a
        }
    };
    (alloc, placed)
}

/// Greedy placement inside one group of mutually reachable overlapping extents: newest
/// sequence first, each kept unless it overlaps one kept before it. Appends the kept
/// extents to `used` in offset order.
fn place_group(
    group: &mut [(u64, u64, u32)],
    cands: &[JournalRecord],
    keep: &mut [bool],
    used: &mut Vec<(u64, u64)>,
) {
    group.sort_by_key(|&(_, _, i)| std::cmp::Reverse(cands[i as usize].seq));
    // start -> end of the kept extents (disjoint, so only the one starting last before
    // an extent's end can overlap it).
    let mut kept: std::collections::BTreeMap<u64, u64> = std::collections::BTreeMap::new();
    for &(off, end, i) in group.iter() {
        let clash = kept.range(..end).next_back().is_some_and(|(_, &e)| e > off);
        if !clash {
            kept.insert(off, end);
            keep[i as usize] = true;
        }
    }
    used.extend(kept.into_iter().map(|(s, e)| (s / SECTOR, (e - s) / SECTOR)));
}

/// Step 3 of recovery: read every placed block's header sector, in batches.
struct Verifier<'a> {
    data: &'a File,
    engine: &'a Engine,
    alloc: &'a mut ExtentAllocator,
    report: &'a mut RecoveryReport,
    dropped: &'a mut Vec<SsdKey>,
}

impl Verifier<'_> {
    fn run(&mut self, placed: Vec<JournalRecord>, progress: Progress<'_>) -> Result<Vec<JournalRecord>> {
        let total = placed.len() as u64;
        let mut keep: Vec<JournalRecord> = Vec::with_capacity(placed.len());
        let mut hdrs = AlignedBuf::zeroed(HEADER_SIZE * VERIFY_CHUNK.min(placed.len()))
            .map_err(|e| SsdError::io("allocating header buffers", e))?;
        let mut done = 0u64;
        for chunk in placed.chunks(VERIFY_CHUNK) {
            progress(RecoveryProgress {
                phase: RecoveryPhase::VerifyHeaders,
                done,
                total,
            });
            let results = {
                let mut reqs: Vec<IoReq<'_>> = chunk
                    .iter()
                    .zip(hdrs.as_mut_slice().chunks_mut(HEADER_SIZE))
                    .map(|(r, h)| IoReq {
                        fd: self.data.as_fd(),
                        offset: r.offset,
                        bufs: Bufs::Read(h, &mut []),
                        hash_len: 0,
                    })
                    .collect();
                self.engine.submit(&mut reqs)
            };
            for ((r, h), res) in chunk.iter().zip(hdrs.as_slice().chunks(HEADER_SIZE)).zip(results) {
                self.judge(r, header_verdict(r, h, res), &mut keep);
            }
            done += chunk.len() as u64;
        }
        progress(RecoveryProgress {
            phase: RecoveryPhase::VerifyHeaders,
            done: total,
            total,
        });
        Ok(keep)
    }

    fn judge(&mut self, r: &JournalRecord, v: HeaderVerdict, keep: &mut Vec<JournalRecord>) {
        match v {
            HeaderVerdict::Keep => {
                keep.push(*r);
                return;
            }
            HeaderVerdict::Corrupt => self.report.corrupt += 1,
            HeaderVerdict::Torn => self.report.torn += 1,
            HeaderVerdict::OtherVersion => self.report.rejected_version += 1,
        }
        self.dropped.push(r.key);
        self.alloc.free(r.offset / SECTOR, extent_bytes(r.len) / SECTOR);
    }
}

/// Step 4: grow (preallocate) or shrink the data file to the capacity.
fn size_data_file(data: &File, orig_len: u64, capacity: u64) -> Result<()> {
    if orig_len < capacity {
        if let Err(e) = rustix::fs::fallocate(data, rustix::fs::FallocateFlags::empty(), 0, capacity) {
            if e == rustix::io::Errno::OPNOTSUPP {
                data.set_len(capacity)
                    .map_err(|e| SsdError::io("extending data file", e))?;
            } else {
                return Err(SsdError::io("preallocating data file", e.into()));
            }
        }
    } else if orig_len > capacity {
        data.set_len(capacity)
            .map_err(|e| SsdError::io("shrinking data file", e))?;
    }
    Ok(())
}

/// Step 5a: the journal for the surviving blocks, and the sequence number to continue
/// from.
///
/// A journal that the tier's own rule would not compact yet (at most
/// `max(journal_compact_min_records, 2 × live blocks)` records), with nothing damaged
/// before its last good record, is kept: cut back to that record, and a remove record
/// appended for every block recovery dropped, so a later open drops them without
/// checking again. Appending costs no rewrite of the whole journal (320 MB for 2 M
/// blocks). A lost append is harmless: the same checks drop those blocks again.
///
/// Otherwise the journal is rewritten to hold exactly the surviving blocks. On a full
/// filesystem (ENOSPC, EDQUOT) the rewrite is deferred: the journal is kept as it is
/// (records of dropped blocks in it are dropped again at the next open) and appended to.
fn open_journal<'a>(
    cfg: &SsdConfig,
    rp: &journal::Replay,
    placed: impl Iterator<Item = &'a JournalRecord>,
    live: usize,
    dropped: &[SsdKey],
    report: &mut RecoveryReport,
) -> Result<(Journal, u64)> {
    let mut seq = rp.max_seq;
    let limit = cfg.journal_compact_min_records.max(2 * live as u64);
    let live_records = rp.good_len / JOURNAL_RECORD_SIZE as u64 + dropped.len() as u64;
    if rp.existed && !rp.damaged_inside && live_records <= limit {
        let mut j =
            Journal::reuse(&cfg.dir, Some(rp.good_len)).map_err(|e| SsdError::io("reopening journal", e))?;
        let removes: Vec<JournalRecord> = dropped
            .iter()
            .map(|k| {
                seq += 1;
                JournalRecord {
                    version: FORMAT_VERSION as u16,
                    kind: RecordKind::Remove,
                    seq,
                    key: *k,
                    file: 0,
                    offset: 0,
                    len: 0,
                    payload_sum: 0,
                }
            })
            .collect();
        let _ = j.append(&removes);
        return Ok((j, seq));
    }
    match Journal::create_compacted(&cfg.dir, placed) {
        Ok(j) => Ok((j, seq)),
        Err(e) if is_disk_full(&e) => {
            let j = Journal::reuse(&cfg.dir, Some(rp.good_len))
                .map_err(|e| SsdError::io("reopening journal", e))?;
            report.compaction_deferred = Some(format!("rewriting journal: {e}"));
            Ok((j, seq))
        }
        Err(e) => Err(SsdError::io("rewriting journal", e)),
    }
}

/// No space (or quota) left on the filesystem.
pub(crate) fn is_disk_full(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

#[cfg(test)]
mod tests {
    use super::*;

    use proptest::prelude::*;

    /// The placement before groups: every record newest first, reserved one by one.
    fn place_reference(
        mut cands: Vec<JournalRecord>,
        capacity: u64,
        orig_len: u64,
    ) -> (Vec<u64>, RecoveryReport) {
        let mut rep = RecoveryReport::default();
        let mut alloc = ExtentAllocator::new(capacity / SECTOR);
        cands.sort_by_key(|r| std::cmp::Reverse(r.seq));
        let mut placed = Vec::new();
        for r in cands {
            let ext = extent_bytes(r.len);
            let end = r.offset.checked_add(ext);
            if r.file != 0 || !r.offset.is_multiple_of(SECTOR) || end.is_none() {
                rep.corrupt += 1;
            } else if end.is_some_and(|e| e > capacity) {
                rep.out_of_capacity += 1;
            } else if r.offset + HEADER_SIZE as u64 + r.len > orig_len {
                rep.torn += 1;
            } else if !alloc.reserve(r.offset / SECTOR, ext / SECTOR) {
                rep.overlapped += 1;
            } else {
                placed.push(r.seq);
            }
        }
        placed.sort_unstable();
        (placed, rep)
    }

    fn rec(seq: u64, unit: u64, units: u64, misaligned: bool) -> JournalRecord {
        JournalRecord {
            version: 1,
            kind: crate::format::RecordKind::Put,
            seq,
            key: crate::SsdKey {
                fingerprint: [0; 32],
                shard: 0,
                salt: [0; 32],
                generation: 0,
                hash: [seq as u8; 32],
            },
            file: 0,
            offset: unit * SECTOR + u64::from(misaligned),
            len: units * SECTOR - 100,
            payload_sum: 0,
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        /// Grouped placement keeps and drops exactly what newest-first reservation does,
        /// and its allocator has the same free space.
        #[test]
        fn placement_matches_newest_first(
            exts in proptest::collection::vec((0u64..120, 1u64..6, proptest::bool::weighted(0.03)), 0..80),
            cap_units in 60u64..130,
            file_units in 60u64..130,
        ) {
            let cands: Vec<JournalRecord> = exts
                .iter()
                .enumerate()
                .map(|(i, &(u, n, bad))| rec(i as u64 * 7 % 83 + 1, u, n, bad))
                .collect();
            let (cap, len) = (cap_units * SECTOR, file_units * SECTOR);
            let (want, want_rep) = place_reference(cands.clone(), cap, len);
            let mut rep = RecoveryReport::default();
            let mut dropped = Vec::new();
            let (alloc, placed) = place_extents(cands.clone(), cap, len, &mut rep, &mut dropped);
            let mut got: Vec<u64> = placed.iter().map(|r| r.seq).collect();
            got.sort_unstable();
            prop_assert_eq!(&got, &want);
            prop_assert_eq!(
                (rep.corrupt, rep.out_of_capacity, rep.torn, rep.overlapped),
                (want_rep.corrupt, want_rep.out_of_capacity, want_rep.torn, want_rep.overlapped)
            );
            prop_assert_eq!(dropped.len() + placed.len(), cands.len());
            let used: u64 = placed.iter().map(|r| extent_bytes(r.len) / SECTOR).sum();
            prop_assert_eq!(alloc.free_units(), cap_units - used);
        }
    }

    fn failing() -> io::Result<Engine> {
        Err(io::Error::from_raw_os_error(libc::EPERM))
    }

    #[test]
    fn auto_fallback_is_reported_not_silent() {
        let mut cfg = SsdConfig::new("/unused", 1 << 20);
        cfg.engine = EnginePref::Auto;
        let (_, info) = choose_engine(&cfg, failing).expect("psync fallback");
        assert_eq!(info.kind, "psync");
        let reason = info.fallback_reason.expect("reason");
        assert!(
            reason.contains("io_uring") && reason.contains("not permitted"),
            "{reason}"
        );

        cfg.engine = EnginePref::Uring;
        assert!(matches!(
            choose_engine(&cfg, failing),
            Err(SsdError::EngineUnavailable(_))
        ));

        cfg.engine = EnginePref::Psync;
        let (_, info) = choose_engine(&cfg, failing).expect("psync");
        assert_eq!(
            info,
            EngineInfo {
                kind: "psync",
                fallback_reason: None
            }
        );
    }
}
