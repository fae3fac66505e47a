//! Configuration of the SSD tier and its validation.

use std::path::{Path, PathBuf};

use crate::error::{Result, SsdError};

/// How data-file I/O goes to the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoMode {
    /// O_DIRECT: bypasses the page cache. Needs a filesystem with O_DIRECT (not tmpfs).
    Direct,
    /// Buffered I/O through the page cache.
    Kernel,
}

/// Which I/O engine to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnginePref {
    /// io_uring if a ring can be set up and answers a probe, else psync (the reason is kept
    /// in [`crate::EngineInfo::fallback_reason`]).
    Auto,
    /// io_uring or fail.
    Uring,
    /// pread/pwrite on a thread pool.
    Psync,
}

/// What [`crate::SsdTier::open`] checks on the extents the journal names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoveryVerify {
    /// Read every block's header sector and check magic, version, checksum, key and length.
    Headers,
    /// Trust the journal (reads still verify everything before returning data).
    JournalOnly,
    /// Trust the journal at open and check every block's header on a background thread
    /// afterwards, dropping the blocks that fail ([`crate::SsdTier::header_check`]). Open
    /// costs no per-block I/O; reads verify everything before returning data meanwhile.
    Background,
}

/// SSD tier configuration. Build with [`SsdConfig::new`] and adjust fields.
#[derive(Debug, Clone)]
pub struct SsdConfig {
    /// Directory holding `data.okv`, `journal.okvj` and `LOCK`. Created if missing.
    pub dir: PathBuf,
    /// Direct (O_DIRECT) or kernel (buffered) I/O.
    pub mode: IoMode,
    /// Size of the data file; rounded down to 4 KiB. Each block uses 4 KiB of header plus
    /// its length rounded up to 4 KiB.
    pub capacity_bytes: u64,
    /// Engine preference.
    pub engine: EnginePref,
    /// io_uring entries per ring (I/Os in flight per ring thread). 1..=4096.
    pub queue_depth: u32,
    /// io_uring ring threads. 1..=64.
    pub io_threads: usize,
    /// Threads of the psync engine (its effective queue depth). 1..=256.
    pub psync_threads: usize,
    /// fdatasync the data file and the journal after every write batch. Without it a power
    /// loss can lose recently written blocks (never serve wrong ones: reads verify).
    pub sync: bool,
    /// Checks done at open.
    pub verify_on_open: RecoveryVerify,
    /// Rewrite the journal when it holds more than `max(this, 2 × live blocks)` records.
    pub journal_compact_min_records: u64,
}

impl SsdConfig {
    /// Defaults: direct mode, auto engine, queue depth 64, one ring thread, 8 psync threads,
    /// sync on, header verification at open.
    pub fn new(dir: impl Into<PathBuf>, capacity_bytes: u64) -> SsdConfig {
        SsdConfig {
            dir: dir.into(),
            mode: IoMode::Direct,
            capacity_bytes,
            engine: EnginePref::Auto,
            queue_depth: 64,
            io_threads: 1,
            psync_threads: 8,
            sync: true,
            verify_on_open: RecoveryVerify::Headers,
            journal_compact_min_records: 1 << 16,
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let bad = |field, reason: &str| {
            Err(SsdError::InvalidConfig {
                field,
                reason: reason.to_string(),
            })
        };
        if self.dir.as_os_str().is_empty() {
            return bad("dir", "must not be empty");
        }
        if self.capacity_bytes < 2 * crate::format::SECTOR {
            return bad("capacity_bytes", "must be at least 8192 bytes");
        }
        if !(1..=4096).contains(&self.queue_depth) {
            return bad("queue_depth", "must be in 1..=4096");
        }
        if !(1..=64).contains(&self.io_threads) {
            return bad("io_threads", "must be in 1..=64");
        }
        if !(1..=256).contains(&self.psync_threads) {
            return bad("psync_threads", "must be in 1..=256");
        }
        Ok(())
    }
}

/// Filesystem magic of tmpfs (statfs f_type).
const TMPFS_MAGIC: i64 = 0x0102_1994;
/// ramfs.
const RAMFS_MAGIC: i64 = 0x8584_58f6;

/// Refuse O_DIRECT on filesystems that do not support it, naming the directory.
pub(crate) fn check_direct_supported(dir: &Path) -> Result<()> {
    let st =
        rustix::fs::statfs(dir).map_err(|e| SsdError::io(format!("statfs {}", dir.display()), e.into()))?;
    #[allow(clippy::unnecessary_cast)]
    let ftype = st.f_type as i64;
    let name = match ftype {
        TMPFS_MAGIC => Some("tmpfs"),
        RAMFS_MAGIC => Some("ramfs"),
        _ => None,
    };
    if let Some(name) = name {
        return Err(SsdError::DirectUnsupported {
            dir: dir.to_path_buf(),
            reason: format!("filesystem is {name}"),
        });
    }
    Ok(())
}

/// Bytes available to an unprivileged writer on the filesystem holding `dir`.
pub(crate) fn free_space(dir: &Path) -> Result<u64> {
    let st =
        rustix::fs::statvfs(dir).map_err(|e| SsdError::io(format!("statvfs {}", dir.display()), e.into()))?;
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}
