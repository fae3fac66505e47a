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
use crate::format::{BlockHeader, DecodeError, HEADER_SIZE, JournalRecord, SECTOR, extent_bytes};
use crate::journal::{self, Journal};
use crate::key::SsdKey;
use crate::state::{Entry, State};
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
        let cands: Vec<JournalRecord> = rp.entries.drain().map(|(_, r)| r).collect();
        let (mut alloc, mut placed) = place_extents(cands, capacity, orig_len, &mut report);
        lap.mark("place");
        if cfg.verify_on_open == RecoveryVerify::Headers && !placed.is_empty() {
            let mut v = Verifier {
                data: &data,
                engine: &engine,
                alloc: &mut alloc,
                report: &mut report,
            };
            placed = v.run(placed, progress)?;
            lap.mark("verify_headers");
        }
        size_data_file(&data, orig_len, capacity)?;
        lap.mark("size_file");

        // 5. Index, oldest first, and a fresh compacted journal.
        placed.sort_by_key(|r| r.seq);
        let journal = open_journal(&cfg, &placed, &mut report)?;
        lap.mark("journal");
        let st = Arc::new(Mutex::new(build_state(
            alloc,
            rp.max_seq,
            journal,
            &placed,
            &mut report,
        )));
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

/// Place extents newest first; drop what overlaps a newer one or lies outside the file
/// or the capacity. Returns the allocator with the placed extents reserved.
fn place_extents(
    mut cands: Vec<JournalRecord>,
    capacity: u64,
    orig_len: u64,
    report: &mut RecoveryReport,
) -> (ExtentAllocator, Vec<JournalRecord>) {
    let mut alloc = ExtentAllocator::new(capacity / SECTOR);
    cands.sort_by_key(|r| std::cmp::Reverse(r.seq));
    let mut placed: Vec<JournalRecord> = Vec::with_capacity(cands.len());
    for r in cands {
        let ext = extent_bytes(r.len);
        let end = r.offset.checked_add(ext);
        if r.file != 0 || !r.offset.is_multiple_of(SECTOR) || end.is_none() {
            report.corrupt += 1;
        } else if end.is_some_and(|e| e > capacity) {
            report.out_of_capacity += 1;
        } else if r.offset + HEADER_SIZE as u64 + r.len > orig_len {
            report.torn += 1;
        } else if !alloc.reserve(r.offset / SECTOR, ext / SECTOR) {
            report.overlapped += 1;
        } else {
            placed.push(r);
        }
    }
    (alloc, placed)
}

/// What a block's header sector says about its journal record.
pub(crate) enum HeaderVerdict {
    Keep,
    Corrupt,
    Torn,
    OtherVersion,
}

pub(crate) fn header_verdict(
    r: &JournalRecord,
    h: &[u8],
    res: io::Result<crate::uring::Done>,
) -> HeaderVerdict {
    match res {
        Ok(d) if d.bytes == HEADER_SIZE => match BlockHeader::decode(h) {
            Ok(bh)
                if bh.key == r.key
                    && bh.len == r.len
                    && bh.payload_sum == r.payload_sum
                    && bh.seq == r.seq =>
            {
                HeaderVerdict::Keep
            }
            Ok(_) => HeaderVerdict::Corrupt,
            Err(DecodeError::Version(_)) => HeaderVerdict::OtherVersion,
            Err(_) => HeaderVerdict::Corrupt,
        },
        Ok(_) => HeaderVerdict::Torn,
        Err(_) => HeaderVerdict::Corrupt, // unreadable sector: drop the block, keep going
    }
}

/// Step 3 of recovery: read every placed block's header sector, in batches.
struct Verifier<'a> {
    data: &'a File,
    engine: &'a Engine,
    alloc: &'a mut ExtentAllocator,
    report: &'a mut RecoveryReport,
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

/// Step 5a: rewrite the journal to hold exactly the surviving blocks. On a full
/// filesystem (ENOSPC, EDQUOT) the rewrite is deferred: the journal is kept as it is
/// (records of dropped blocks in it are dropped again at the next open) and appended to.
fn open_journal(cfg: &SsdConfig, placed: &[JournalRecord], report: &mut RecoveryReport) -> Result<Journal> {
    match Journal::create_compacted(&cfg.dir, placed.iter()) {
        Ok(j) => Ok(j),
        Err(e) if is_disk_full(&e) => {
            let j = Journal::reuse(&cfg.dir).map_err(|e| SsdError::io("reopening journal", e))?;
            report.compaction_deferred = Some(format!("rewriting journal: {e}"));
            Ok(j)
        }
        Err(e) => Err(SsdError::io("rewriting journal", e)),
    }
}

/// No space (or quota) left on the filesystem.
pub(crate) fn is_disk_full(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// Step 5b: the index of the surviving blocks, oldest first.
fn build_state(
    alloc: ExtentAllocator,
    max_seq: u64,
    journal: Journal,
    placed: &[JournalRecord],
    report: &mut RecoveryReport,
) -> State {
    let mut st = State::new(alloc, max_seq, journal, placed.len());
    for r in placed {
        st.insert_entry(
            r.key,
            Entry {
                off: r.offset,
                len: r.len,
                seq: r.seq,
                sum: r.payload_sum,
                tick: 0,
            },
        );
        report.recovered.push((r.key, r.len));
    }
    st
}

#[cfg(test)]
mod tests {
    use super::*;

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
