//! The SSD tier: index, allocation, write/read paths and recovery.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::alloc::ExtentAllocator;
use crate::config::{EnginePref, IoMode, RecoveryVerify, SsdConfig, check_direct_supported, free_space};
use crate::error::{Result, SsdError};
use crate::format::{
    BlockHeader, DecodeError, FORMAT_VERSION, HEADER_SIZE, JournalRecord, RecordKind, SECTOR, checksum,
    extent_bytes, round_up,
};
use crate::journal::{self, Journal};
use crate::key::SsdKey;
use crate::uring::{ALIGN, AlignedBuf, Bufs, Engine, IoReq};

/// Name of the data file inside the tier directory.
pub const DATA_FILE: &str = "data.okv";
const LOCK_FILE: &str = "LOCK";
/// Header reads per batch during recovery.
const VERIFY_CHUNK: usize = 1024;

/// The engine in use, for `orbitkv status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineInfo {
    /// `"io_uring"` or `"psync"`.
    pub kind: &'static str,
    /// Why `Auto` fell back to psync (the io_uring setup error); `None` otherwise.
    pub fallback_reason: Option<String>,
}

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
}

/// Counters since open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SsdStats {
    /// Blocks indexed now.
    pub blocks: u64,
    /// Bytes of the data file held by indexed blocks (headers and padding included).
    pub used_bytes: u64,
    /// Data file size.
    pub capacity_bytes: u64,
    /// Payload bytes written.
    pub bytes_written: u64,
    /// Payload bytes read and verified.
    pub bytes_read: u64,
    /// Blocks written.
    pub blocks_written: u64,
    /// Blocks read and verified.
    pub blocks_read: u64,
    /// Writes that failed with an I/O error.
    pub write_errors: u64,
    /// Reads that failed with an I/O error.
    pub read_errors: u64,
    /// Reads rejected because the payload checksum did not match.
    pub checksum_failures: u64,
    /// Reads rejected because the header was bad, of another version, short, or for another key.
    pub header_failures: u64,
    /// Reads of keys not present.
    pub misses: u64,
    /// Writes refused with `Full`.
    pub full_rejections: u64,
    /// Journal rewrites.
    pub journal_compactions: u64,
    /// Records in the journal file now.
    pub journal_records: u64,
    /// Journal fdatasync failures (the blocks stay indexed).
    pub journal_sync_errors: u64,
}

#[derive(Default)]
struct Counters {
    bytes_written: AtomicU64,
    bytes_read: AtomicU64,
    blocks_written: AtomicU64,
    blocks_read: AtomicU64,
    write_errors: AtomicU64,
    read_errors: AtomicU64,
    checksum_failures: AtomicU64,
    header_failures: AtomicU64,
    misses: AtomicU64,
    full_rejections: AtomicU64,
    journal_compactions: AtomicU64,
    journal_sync_errors: AtomicU64,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    off: u64,
    len: u64,
    seq: u64,
    sum: u64,
    tick: u64,
}

impl Entry {
    fn units(&self) -> u64 {
        extent_bytes(self.len) / SECTOR
    }
    fn put_record(&self, key: SsdKey) -> JournalRecord {
        JournalRecord {
            version: FORMAT_VERSION as u16,
            kind: RecordKind::Put,
            seq: self.seq,
            key,
            file: 0,
            offset: self.off,
            len: self.len,
            payload_sum: self.sum,
        }
    }
}

struct State {
    index: HashMap<SsdKey, Entry>,
    alloc: ExtentAllocator,
    /// tick -> key, oldest first.
    lru: BTreeMap<u64, SsdKey>,
    tick: u64,
    seq: u64,
    /// extent start (bytes) -> readers in flight.
    pins: HashMap<u64, u32>,
    /// Extents freed while pinned: start -> units.
    deferred: HashMap<u64, u64>,
    used_bytes: u64,
    journal: Journal,
}

impl State {
    fn release(&mut self, off: u64, units: u64) {
        if self.pins.contains_key(&off) {
            self.deferred.insert(off, units);
        } else {
            self.alloc.free(off / SECTOR, units);
        }
    }

    fn unpin(&mut self, off: u64) {
        let left = match self.pins.get_mut(&off) {
            Some(c) => {
                *c -= 1;
                *c
            }
            None => return,
        };
        if left == 0 {
            self.pins.remove(&off);
            if let Some(units) = self.deferred.remove(&off) {
                self.alloc.free(off / SECTOR, units);
            }
        }
    }

    fn drop_entry(&mut self, key: &SsdKey) -> Option<Entry> {
        let e = self.index.remove(key)?;
        self.lru.remove(&e.tick);
        self.used_bytes -= e.units() * SECTOR;
        self.release(e.off, e.units());
        Some(e)
    }

    fn insert_entry(&mut self, key: SsdKey, mut e: Entry) {
        self.tick += 1;
        e.tick = self.tick;
        self.lru.insert(e.tick, key);
        self.used_bytes += e.units() * SECTOR;
        self.index.insert(key, e);
    }

    fn touch(&mut self, key: &SsdKey) {
        self.tick += 1;
        let t = self.tick;
        if let Some(e) = self.index.get_mut(key) {
            self.lru.remove(&e.tick);
            e.tick = t;
            self.lru.insert(t, *key);
        }
    }

    fn remove_record(&mut self, key: SsdKey) -> JournalRecord {
        self.seq += 1;
        JournalRecord {
            version: FORMAT_VERSION as u16,
            kind: RecordKind::Remove,
            seq: self.seq,
            key,
            file: 0,
            offset: 0,
            len: 0,
            payload_sum: 0,
        }
    }
}

/// The SSD tier. `Send + Sync`; all methods block.
pub struct SsdTier {
    cfg: SsdConfig,
    capacity: u64,
    data: File,
    engine: Engine,
    info: EngineInfo,
    state: Mutex<State>,
    counters: Counters,
    _lock: File,
}

fn is_aligned(p: *const u8) -> bool {
    (p as usize).is_multiple_of(ALIGN)
}

fn open_data_file(cfg: &SsdConfig) -> Result<File> {
    let path = cfg.dir.join(DATA_FILE);
    let mut oo = OpenOptions::new();
    oo.read(true).write(true).create(true).truncate(false);
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

fn choose_engine(
    cfg: &SsdConfig,
    uring: impl FnOnce() -> io::Result<Engine>,
) -> Result<(Engine, EngineInfo)> {
    let psync = || Engine::psync(cfg.psync_threads).map_err(|e| SsdError::io("starting psync threads", e));
    match cfg.engine {
        EnginePref::Psync => Ok((
            psync()?,
            EngineInfo {
                kind: "psync",
                fallback_reason: None,
            },
        )),
        EnginePref::Uring => match uring() {
            Ok(e) => Ok((
                e,
                EngineInfo {
                    kind: "io_uring",
                    fallback_reason: None,
                },
            )),
            Err(e) => Err(SsdError::EngineUnavailable(e.to_string())),
        },
        EnginePref::Auto => match uring() {
            Ok(e) => Ok((
                e,
                EngineInfo {
                    kind: "io_uring",
                    fallback_reason: None,
                },
            )),
            Err(err) => Ok((
                psync()?,
                EngineInfo {
                    kind: "psync",
                    fallback_reason: Some(format!("io_uring setup failed: {err}")),
                },
            )),
        },
    }
}

fn corrupt(off: u64, reason: impl Into<String>) -> SsdError {
    SsdError::Corrupt {
        offset: off,
        reason: reason.into(),
    }
}

impl SsdTier {
    /// Open (or create) the tier in `cfg.dir` and recover the blocks written earlier.
    pub fn open(
        cfg: SsdConfig,
        progress: &mut dyn FnMut(RecoveryProgress),
    ) -> Result<(SsdTier, RecoveryReport)> {
        let t0 = Instant::now();
        cfg.validate()?;
        let capacity = cfg.capacity_bytes / SECTOR * SECTOR;
        std::fs::create_dir_all(&cfg.dir)
            .map_err(|e| SsdError::io(format!("creating {}", cfg.dir.display()), e))?;

        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(cfg.dir.join(LOCK_FILE))
            .map_err(|e| SsdError::io("opening LOCK", e))?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).map_err(|e| {
            if e == rustix::io::Errno::WOULDBLOCK {
                SsdError::Locked { dir: cfg.dir.clone() }
            } else {
                SsdError::io("locking LOCK", e.into())
            }
        })?;

        if cfg.mode == IoMode::Direct {
            check_direct_supported(&cfg.dir)?;
        }
        let data_path = cfg.dir.join(DATA_FILE);
        let allocated = std::fs::metadata(&data_path)
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
        let data = open_data_file(&cfg)?;
        let orig_len = data
            .metadata()
            .map_err(|e| SsdError::io("stat data file", e))?
            .len();
        let (engine, info) = make_engine(&cfg)?;

        // 1. Journal.
        let mut rp = journal::replay(&cfg.dir, &mut |done, total| {
            progress(RecoveryProgress {
                phase: RecoveryPhase::Journal,
                done,
                total,
            })
        })
        .map_err(|e| SsdError::io("reading journal", e))?;
        let mut report = RecoveryReport {
            journal_records: rp.records,
            rejected_version: rp.rejected_version,
            corrupt: rp.corrupt,
            torn: rp.torn,
            ..Default::default()
        };

        // 2. Place extents, newest first; drop what overlaps a newer one or lies outside.
        let mut alloc = ExtentAllocator::new(capacity / SECTOR);
        let mut cands: Vec<JournalRecord> = rp.entries.drain().map(|(_, r)| r).collect();
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

        // 3. Verify headers.
        if cfg.verify_on_open == RecoveryVerify::Headers && !placed.is_empty() {
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
                            fd: data.as_fd(),
                            offset: r.offset,
                            bufs: Bufs::Read(h, &mut []),
                            hash_len: 0,
                        })
                        .collect();
                    engine.submit(&mut reqs)
                };
                for ((r, h), res) in chunk.iter().zip(hdrs.as_slice().chunks(HEADER_SIZE)).zip(results) {
                    let ok = match res {
                        Ok(d) if d.bytes == HEADER_SIZE => match BlockHeader::decode(h) {
                            Ok(bh) => {
                                bh.key == r.key
                                    && bh.len == r.len
                                    && bh.payload_sum == r.payload_sum
                                    && bh.seq == r.seq
                            }
                            Err(DecodeError::Version(_)) => {
                                report.rejected_version += 1;
                                alloc.free(r.offset / SECTOR, extent_bytes(r.len) / SECTOR);
                                continue;
                            }
                            Err(_) => false,
                        },
                        Ok(_) => {
                            report.torn += 1;
                            alloc.free(r.offset / SECTOR, extent_bytes(r.len) / SECTOR);
                            continue;
                        }
                        Err(_) => false, // unreadable sector: drop the block, keep going
                    };
                    if ok {
                        keep.push(*r);
                    } else {
                        report.corrupt += 1;
                        alloc.free(r.offset / SECTOR, extent_bytes(r.len) / SECTOR);
                    }
                }
                done += chunk.len() as u64;
            }
            progress(RecoveryProgress {
                phase: RecoveryPhase::VerifyHeaders,
                done: total,
                total,
            });
            placed = keep;
        }

        // 4. Size the data file.
        if orig_len < capacity {
            if let Err(e) = rustix::fs::fallocate(&data, rustix::fs::FallocateFlags::empty(), 0, capacity) {
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

        // 5. Index, oldest first, and a fresh compacted journal.
        placed.sort_by_key(|r| r.seq);
        let journal = Journal::create_compacted(&cfg.dir, placed.iter())
            .map_err(|e| SsdError::io("rewriting journal", e))?;
        let mut st = State {
            index: HashMap::with_capacity(placed.len()),
            alloc,
            lru: BTreeMap::new(),
            tick: 0,
            seq: rp.max_seq,
            pins: HashMap::new(),
            deferred: HashMap::new(),
            used_bytes: 0,
            journal,
        };
        for r in &placed {
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
        progress(RecoveryProgress {
            phase: RecoveryPhase::Done,
            done: placed.len() as u64,
            total: placed.len() as u64,
        });
        report.elapsed = t0.elapsed();
        let tier = SsdTier {
            cfg,
            capacity,
            data,
            engine,
            info,
            state: Mutex::new(st),
            counters: Counters::default(),
            _lock: lock,
        };
        Ok((tier, report))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The engine in use and, for `Auto`, why it fell back.
    pub fn engine(&self) -> &EngineInfo {
        &self.info
    }

    /// The configuration the tier was opened with.
    pub fn config(&self) -> &SsdConfig {
        &self.cfg
    }

    /// Write many blocks, submitted together. Result `i` belongs to item `i`. A key that is
    /// already present is replaced. `Full` means no free extent is large enough.
    pub fn write_batch(&self, items: &[(SsdKey, &[u8])]) -> Vec<Result<()>> {
        struct Plan {
            item: usize,
            off: u64,
            seq: u64,
            sum: u64,
            io_len: usize,
        }
        let direct = self.cfg.mode == IoMode::Direct;
        let mut out: Vec<Result<()>> = (0..items.len()).map(|_| Ok(())).collect();
        let mut plans: Vec<Plan> = Vec::with_capacity(items.len());
        {
            let mut st = self.lock();
            for (i, (_, data)) in items.iter().enumerate() {
                let len = data.len() as u64;
                let ext = extent_bytes(len);
                if ext > self.capacity {
                    out[i] = Err(SsdError::TooLarge {
                        len,
                        capacity: self.capacity,
                    });
                    continue;
                }
                match st.alloc.alloc(ext / SECTOR) {
                    Some(u) => {
                        st.seq += 1;
                        plans.push(Plan {
                            item: i,
                            off: u * SECTOR,
                            seq: st.seq,
                            sum: 0,
                            io_len: if direct {
                                round_up(len) as usize
                            } else {
                                data.len()
                            },
                        });
                    }
                    None => {
                        self.counters.full_rejections.fetch_add(1, Relaxed);
                        out[i] = Err(SsdError::Full {
                            needed: ext,
                            free: st.alloc.free_units() * SECTOR,
                            largest: st.alloc.largest_free() * SECTOR,
                        });
                    }
                }
            }
        }
        if plans.is_empty() {
            return out;
        }
        let free_plans = |plans: &[Plan], out: &mut Vec<Result<()>>, e: &io::Error| {
            let mut st = self.lock();
            for p in plans {
                st.alloc.free(
                    p.off / SECTOR,
                    extent_bytes(items[p.item].1.len() as u64) / SECTOR,
                );
                out[p.item] = Err(SsdError::io(
                    "allocating write buffers",
                    io::Error::new(e.kind(), e.to_string()),
                ));
            }
        };
        let mut hdrs = match AlignedBuf::zeroed(HEADER_SIZE * plans.len()) {
            Ok(b) => b,
            Err(e) => {
                free_plans(&plans, &mut out, &e);
                return out;
            }
        };
        let mut bounce: Vec<Option<AlignedBuf>> = Vec::with_capacity(plans.len());
        for (p, h) in plans.iter_mut().zip(hdrs.as_mut_slice().chunks_mut(HEADER_SIZE)) {
            let (key, data) = items[p.item];
            p.sum = checksum(data);
            BlockHeader {
                version: FORMAT_VERSION,
                seq: p.seq,
                key,
                len: data.len() as u64,
                payload_sum: p.sum,
            }
            .encode(h);
            let needs_bounce = direct
                && !data.is_empty()
                && !(is_aligned(data.as_ptr()) && data.len().is_multiple_of(ALIGN));
            if needs_bounce {
                match AlignedBuf::zeroed(data.len()) {
                    Ok(mut b) => {
                        b.as_mut_slice()[..data.len()].copy_from_slice(data);
                        bounce.push(Some(b));
                    }
                    Err(e) => {
                        drop(bounce);
                        free_plans(&plans, &mut out, &e);
                        return out;
                    }
                }
            } else {
                bounce.push(None);
            }
        }
        let results = {
            let mut reqs: Vec<IoReq<'_>> = plans
                .iter()
                .zip(hdrs.as_slice().chunks(HEADER_SIZE))
                .zip(bounce.iter())
                .map(|((p, h), b)| {
                    let payload: &[u8] = match b {
                        Some(b) => &b.as_slice()[..p.io_len],
                        None => &items[p.item].1[..p.io_len],
                    };
                    IoReq {
                        fd: self.data.as_fd(),
                        offset: p.off,
                        bufs: Bufs::Write(h, payload),
                        hash_len: 0,
                    }
                })
                .collect();
            self.engine.submit(&mut reqs)
        };
        drop(bounce);
        let mut ok: Vec<bool> = vec![false; plans.len()];
        for (j, (p, r)) in plans.iter().zip(results).enumerate() {
            match r {
                Ok(d) if d.bytes == HEADER_SIZE + p.io_len => ok[j] = true,
                Ok(d) => {
                    let n = d.bytes;
                    out[p.item] = Err(SsdError::io(
                        "writing block",
                        io::Error::new(io::ErrorKind::WriteZero, format!("short write of {n} bytes")),
                    ))
                }
                Err(e) => out[p.item] = Err(SsdError::io("writing block", e)),
            }
        }
        if self.cfg.sync
            && ok.iter().any(|&b| b)
            && let Err(e) = rustix::fs::fdatasync(&self.data)
        {
            for (j, p) in plans.iter().enumerate() {
                if ok[j] {
                    ok[j] = false;
                    out[p.item] = Err(SsdError::io("fdatasync data file", e.into()));
                }
            }
        }
        let journal_file = {
            let mut st = self.lock();
            let recs: Vec<JournalRecord> = plans
                .iter()
                .zip(&ok)
                .filter(|(_, o)| **o)
                .map(|(p, _)| {
                    Entry {
                        off: p.off,
                        len: items[p.item].1.len() as u64,
                        seq: p.seq,
                        sum: p.sum,
                        tick: 0,
                    }
                    .put_record(items[p.item].0)
                })
                .collect();
            if let Err(e) = st.journal.append(&recs) {
                for (j, p) in plans.iter().enumerate() {
                    if ok[j] {
                        ok[j] = false;
                        out[p.item] = Err(SsdError::io(
                            "appending journal",
                            io::Error::new(e.kind(), e.to_string()),
                        ));
                    }
                }
            }
            for (j, p) in plans.iter().enumerate() {
                let (key, data) = items[p.item];
                let len = data.len() as u64;
                if ok[j] {
                    st.drop_entry(&key);
                    st.insert_entry(
                        key,
                        Entry {
                            off: p.off,
                            len,
                            seq: p.seq,
                            sum: p.sum,
                            tick: 0,
                        },
                    );
                    self.counters.bytes_written.fetch_add(len, Relaxed);
                    self.counters.blocks_written.fetch_add(1, Relaxed);
                } else {
                    st.alloc.free(p.off / SECTOR, extent_bytes(len) / SECTOR);
                    self.counters.write_errors.fetch_add(1, Relaxed);
                }
            }
            self.maybe_compact(&mut st);
            st.journal.handle()
        };
        if self.cfg.sync && ok.iter().any(|&b| b) && rustix::fs::fdatasync(&*journal_file).is_err() {
            self.counters.journal_sync_errors.fetch_add(1, Relaxed);
        }
        out
    }

    /// Read many blocks into the given buffers, submitted together. Each buffer must be at
    /// least as long as the stored block; `Ok(n)` gives the block length. Bytes of the buffer
    /// past `n` (up to the next 4 KiB) may be overwritten. On `Err` the buffer holds no
    /// data (it is zeroed if it was written to). `Corrupt` drops the block from the index.
    pub fn read_batch(&self, items: &mut [(SsdKey, &mut [u8])]) -> Vec<Result<usize>> {
        struct Plan {
            item: usize,
            e: Entry,
            io_len: usize,
            into_dest: bool,
        }
        let direct = self.cfg.mode == IoMode::Direct;
        let mut out: Vec<Result<usize>> = (0..items.len()).map(|_| Ok(0)).collect();
        let mut plans: Vec<Plan> = Vec::with_capacity(items.len());
        {
            let mut st = self.lock();
            for (i, (key, dest)) in items.iter().enumerate() {
                let Some(e) = st.index.get(key).copied() else {
                    self.counters.misses.fetch_add(1, Relaxed);
                    out[i] = Err(SsdError::NotFound);
                    continue;
                };
                if (dest.len() as u64) < e.len {
                    out[i] = Err(SsdError::BufferTooSmall {
                        needed: e.len,
                        got: dest.len() as u64,
                    });
                    continue;
                }
                let (io_len, into_dest) = if direct {
                    let r = round_up(e.len) as usize;
                    (r, is_aligned(dest.as_ptr()) && dest.len() >= r)
                } else {
                    (e.len as usize, true)
                };
                *st.pins.entry(e.off).or_insert(0) += 1;
                st.touch(key);
                plans.push(Plan {
                    item: i,
                    e,
                    io_len,
                    into_dest,
                });
            }
        }
        if plans.is_empty() {
            return out;
        }
        let bufs = AlignedBuf::zeroed(HEADER_SIZE * plans.len()).and_then(|h| {
            let mut b = Vec::with_capacity(plans.len());
            for p in &plans {
                b.push(if p.into_dest || p.io_len == 0 {
                    None
                } else {
                    Some(AlignedBuf::zeroed(p.io_len)?)
                });
            }
            Ok((h, b))
        });
        let (mut hdrs, mut bounce) = match bufs {
            Ok(x) => x,
            Err(e) => {
                let mut st = self.lock();
                for p in &plans {
                    st.unpin(p.e.off);
                    out[p.item] = Err(SsdError::io(
                        "allocating read buffers",
                        io::Error::new(e.kind(), e.to_string()),
                    ));
                }
                return out;
            }
        };
        let results = {
            let mut dests: Vec<Option<&mut [u8]>> = items.iter_mut().map(|(_, d)| Some(&mut **d)).collect();
            let mut reqs: Vec<IoReq<'_>> = Vec::with_capacity(plans.len());
            for ((p, h), b) in plans
                .iter()
                .zip(hdrs.as_mut_slice().chunks_mut(HEADER_SIZE))
                .zip(bounce.iter_mut())
            {
                let payload: &mut [u8] = match b {
                    Some(b) => &mut b.as_mut_slice()[..p.io_len],
                    None => match dests[p.item].take() {
                        Some(d) => &mut d[..p.io_len],
                        None => &mut [],
                    },
                };
                reqs.push(IoReq {
                    fd: self.data.as_fd(),
                    offset: p.e.off,
                    bufs: Bufs::Read(h, payload),
                    hash_len: p.e.len as usize,
                });
            }
            self.engine.submit(&mut reqs)
        };
        let mut dropped: Vec<(SsdKey, Entry)> = Vec::new();
        for ((p, h), (res, b)) in plans
            .iter()
            .zip(hdrs.as_slice().chunks(HEADER_SIZE))
            .zip(results.into_iter().zip(bounce.iter()))
        {
            let (key, dest) = &mut items[p.item];
            let verdict: Result<()> = match res {
                Err(e) => {
                    self.counters.read_errors.fetch_add(1, Relaxed);
                    Err(SsdError::io("reading block", e))
                }
                Ok(d) if d.bytes != HEADER_SIZE + p.io_len => {
                    self.counters.header_failures.fetch_add(1, Relaxed);
                    Err(corrupt(
                        p.e.off,
                        format!("short read ({} bytes): data file truncated", d.bytes),
                    ))
                }
                Ok(d) => {
                    // The I/O thread checksummed the payload as it landed; recompute only if
                    // it could not (zero-length payloads).
                    let sum = d.hash.unwrap_or_else(|| match b {
                        Some(b) => checksum(&b.as_slice()[..p.e.len as usize]),
                        None => checksum(&dest[..p.e.len as usize]),
                    });
                    match BlockHeader::decode(h) {
                        Err(DecodeError::Version(v)) => {
                            self.counters.header_failures.fetch_add(1, Relaxed);
                            Err(corrupt(p.e.off, format!("block of format version {v}")))
                        }
                        Err(e) => {
                            self.counters.header_failures.fetch_add(1, Relaxed);
                            Err(corrupt(p.e.off, format!("bad header: {e:?}")))
                        }
                        Ok(bh) if bh.key != *key => {
                            self.counters.header_failures.fetch_add(1, Relaxed);
                            Err(corrupt(p.e.off, "header key does not match the requested key"))
                        }
                        Ok(bh) if bh.len != p.e.len || bh.seq != p.e.seq => {
                            self.counters.header_failures.fetch_add(1, Relaxed);
                            Err(corrupt(p.e.off, "header length/sequence disagree with the index"))
                        }
                        Ok(bh) if sum != bh.payload_sum || bh.payload_sum != p.e.sum => {
                            self.counters.checksum_failures.fetch_add(1, Relaxed);
                            Err(corrupt(p.e.off, "payload checksum mismatch"))
                        }
                        Ok(_) => Ok(()),
                    }
                }
            };
            match verdict {
                Ok(()) => {
                    if let Some(b) = b {
                        dest[..p.e.len as usize].copy_from_slice(&b.as_slice()[..p.e.len as usize]);
                    }
                    self.counters.bytes_read.fetch_add(p.e.len, Relaxed);
                    self.counters.blocks_read.fetch_add(1, Relaxed);
                    out[p.item] = Ok(p.e.len as usize);
                }
                Err(err) => {
                    if b.is_none() {
                        let n = p.io_len.min(dest.len());
                        dest[..n].fill(0);
                    }
                    if matches!(err, SsdError::Corrupt { .. }) {
                        dropped.push((*key, p.e));
                    }
                    out[p.item] = Err(err);
                }
            }
        }
        let mut st = self.lock();
        for p in &plans {
            st.unpin(p.e.off);
        }
        let mut recs = Vec::new();
        for (key, e) in dropped {
            // Only if the index still points at the extent we read.
            if st
                .index
                .get(&key)
                .is_some_and(|cur| cur.off == e.off && cur.seq == e.seq)
            {
                st.drop_entry(&key);
                let r = st.remove_record(key);
                recs.push(r);
            }
        }
        if !recs.is_empty() {
            let _ = st.journal.append(&recs);
        }
        out
    }

    /// Write one block.
    pub fn write(&self, key: SsdKey, data: &[u8]) -> Result<()> {
        self.write_batch(&[(key, data)])
            .pop()
            .unwrap_or(Err(SsdError::NotFound))
    }

    /// Read one block into `dest`; returns its length.
    pub fn read(&self, key: SsdKey, dest: &mut [u8]) -> Result<usize> {
        self.read_batch(&mut [(key, dest)])
            .pop()
            .unwrap_or(Err(SsdError::NotFound))
    }

    /// Remove a block; its extent is reused once no read of it is in flight. True if present.
    pub fn remove(&self, key: &SsdKey) -> bool {
        let mut st = self.lock();
        if st.drop_entry(key).is_none() {
            return false;
        }
        let r = st.remove_record(*key);
        // A lost remove record only resurrects a block whose bytes are still its own, or
        // whose extent was reused (then the header check drops it at the next open).
        let _ = st.journal.append(&[r]);
        self.maybe_compact(&mut st);
        true
    }

    /// Whether the key is stored.
    pub fn contains(&self, key: &SsdKey) -> bool {
        self.lock().index.contains_key(key)
    }

    /// Payload length of a stored block.
    pub fn stored_len(&self, key: &SsdKey) -> Option<u64> {
        self.lock().index.get(key).map(|e| e.len)
    }

    /// Number of blocks stored.
    pub fn len(&self) -> usize {
        self.lock().index.len()
    }

    /// True when no block is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Data-file bytes held by stored blocks (4 KiB header plus payload rounded to 4 KiB each).
    pub fn used_bytes(&self) -> u64 {
        self.lock().used_bytes
    }

    /// Size of the data file.
    pub fn capacity_bytes(&self) -> u64 {
        self.capacity
    }

    /// Free bytes, and the largest contiguous free extent in bytes.
    pub fn free_bytes(&self) -> (u64, u64) {
        let st = self.lock();
        (st.alloc.free_units() * SECTOR, st.alloc.largest_free() * SECTOR)
    }

    /// Data-file bytes a block of `len` payload bytes needs.
    pub fn extent_bytes(len: u64) -> u64 {
        extent_bytes(len)
    }

    /// Up to `n` keys, least recently written or read first: eviction candidates.
    pub fn oldest(&self, n: usize) -> Vec<SsdKey> {
        self.lock().lru.values().take(n).copied().collect()
    }

    /// Counter snapshot.
    pub fn stats(&self) -> SsdStats {
        let (blocks, used, jr) = {
            let st = self.lock();
            (st.index.len() as u64, st.used_bytes, st.journal.records())
        };
        let c = &self.counters;
        SsdStats {
            blocks,
            used_bytes: used,
            capacity_bytes: self.capacity,
            bytes_written: c.bytes_written.load(Relaxed),
            bytes_read: c.bytes_read.load(Relaxed),
            blocks_written: c.blocks_written.load(Relaxed),
            blocks_read: c.blocks_read.load(Relaxed),
            write_errors: c.write_errors.load(Relaxed),
            read_errors: c.read_errors.load(Relaxed),
            checksum_failures: c.checksum_failures.load(Relaxed),
            header_failures: c.header_failures.load(Relaxed),
            misses: c.misses.load(Relaxed),
            full_rejections: c.full_rejections.load(Relaxed),
            journal_compactions: c.journal_compactions.load(Relaxed),
            journal_records: jr,
            journal_sync_errors: c.journal_sync_errors.load(Relaxed),
        }
    }

    /// Rewrite the journal to hold one record per stored block.
    pub fn compact_journal(&self) -> Result<()> {
        let mut st = self.lock();
        self.compact_locked(&mut st)
    }

    fn compact_locked(&self, st: &mut State) -> Result<()> {
        let mut recs: Vec<JournalRecord> = st.index.iter().map(|(k, e)| e.put_record(*k)).collect();
        recs.sort_by_key(|r| r.seq);
        st.journal = Journal::create_compacted(&self.cfg.dir, recs.iter())
            .map_err(|e| SsdError::io("compacting journal", e))?;
        self.counters.journal_compactions.fetch_add(1, Relaxed);
        Ok(())
    }

    fn maybe_compact(&self, st: &mut State) {
        let limit = self
            .cfg
            .journal_compact_min_records
            .max(2 * st.index.len() as u64);
        if st.journal.records() > limit {
            // On failure the old journal stays valid and keeps being appended to.
            let _ = self.compact_locked(st);
        }
    }

    /// Journal file size in bytes.
    pub fn journal_bytes(&self) -> u64 {
        self.lock().journal.bytes()
    }

    /// Flush and drop the data file's pages from the page cache (for fair kernel-mode
    /// benchmarks; a no-op for data in direct mode).
    pub fn drop_page_cache(&self) -> Result<()> {
        rustix::fs::fdatasync(&self.data).map_err(|e| SsdError::io("fdatasync", e.into()))?;
        rustix::fs::fadvise(&self.data, 0, None, rustix::fs::Advice::DontNeed)
            .map_err(|e| SsdError::io("posix_fadvise(DONTNEED)", e.into()))
    }
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
