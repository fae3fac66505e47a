//! The SSD tier's facade: the `SsdTier` struct, its small accessors, counters and
//! journal compaction. Opening and recovery live in `recovery.rs`, the write path in
//! `write.rs`, the read path in `read.rs`, the in-memory index in `state.rs`.

use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::bgverify::{Background, HeaderCheck};
use crate::config::SsdConfig;
use crate::error::{Result, SsdError};
use crate::format::{JournalRecord, SECTOR, extent_bytes};
use crate::journal::Journal;
use crate::key::SsdKey;
use crate::state::State;
use crate::uring::{ALIGN, Engine};

/// Name of the data file inside the tier directory.
pub const DATA_FILE: &str = "data.okv";

/// The engine in use, for `orbitkv status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineInfo {
    /// `"io_uring"` or `"psync"`.
    pub kind: &'static str,
    /// Why `Auto` fell back to psync (the io_uring setup error); `None` otherwise.
    pub fallback_reason: Option<String>,
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
    /// Blocks the header check after open ([`crate::RecoveryVerify::Background`]) has to
    /// check, has checked, and has dropped (header disagrees with the journal).
    pub header_check_total: u64,
    /// See `header_check_total`.
    pub header_check_checked: u64,
    /// See `header_check_total`.
    pub header_check_dropped: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) bytes_written: AtomicU64,
    pub(crate) bytes_read: AtomicU64,
    pub(crate) blocks_written: AtomicU64,
    pub(crate) blocks_read: AtomicU64,
    pub(crate) write_errors: AtomicU64,
    pub(crate) read_errors: AtomicU64,
    pub(crate) checksum_failures: AtomicU64,
    pub(crate) header_failures: AtomicU64,
    pub(crate) misses: AtomicU64,
    pub(crate) full_rejections: AtomicU64,
    pub(crate) journal_compactions: AtomicU64,
    pub(crate) journal_sync_errors: AtomicU64,
}

/// The SSD tier. `Send + Sync`; all methods block.
pub struct SsdTier {
    pub(crate) cfg: SsdConfig,
    pub(crate) capacity: u64,
    pub(crate) data: File,
    pub(crate) engine: Arc<Engine>,
    pub(crate) info: EngineInfo,
    pub(crate) state: Arc<Mutex<State>>,
    pub(crate) counters: Counters,
    pub(crate) background: Background,
    pub(crate) _lock: File,
}

impl Drop for SsdTier {
    fn drop(&mut self) {
        // The background header check uses the state and engine; stop it before they go
        // (and before the directory lock is released).
        self.background.stop();
    }
}

pub(crate) fn is_aligned(p: *const u8) -> bool {
    (p as usize).is_multiple_of(ALIGN)
}

impl SsdTier {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
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

    /// Progress of the background header check ([`crate::RecoveryVerify::Background`]);
    /// `finished` and zero counts in the other modes.
    pub fn header_check(&self) -> HeaderCheck {
        self.background.progress()
    }

    /// Keys the background header check dropped since the last call (each once), for a
    /// cache above the tier to forget; empty in the other modes.
    pub fn take_header_check_drops(&self) -> Vec<SsdKey> {
        self.background.take_dropped()
    }

    /// Block until the background header check has finished.
    pub fn wait_header_check(&self) {
        self.background.wait();
    }

    /// Counter snapshot.
    pub fn stats(&self) -> SsdStats {
        let (blocks, used, jr) = {
            let st = self.lock();
            (st.index.len() as u64, st.used_bytes, st.journal.records())
        };
        let c = &self.counters;
        let hc = self.background.progress();
        SsdStats {
            header_check_total: hc.total,
            header_check_checked: hc.checked,
            header_check_dropped: hc.dropped,
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

    pub(crate) fn maybe_compact(&self, st: &mut State) {
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
