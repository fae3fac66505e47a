//! Error type of the SSD tier.

use std::io;
use std::path::PathBuf;

/// Result alias used throughout the crate.
pub type Result<T, E = SsdError> = std::result::Result<T, E>;

/// Everything the SSD tier can report.
#[derive(Debug, thiserror::Error)]
pub enum SsdError {
    /// A configuration field is out of range.
    #[error("invalid SSD tier config: {field}: {reason}")]
    InvalidConfig {
        /// Which field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// `mode = direct` was asked for on a filesystem without O_DIRECT (tmpfs and friends).
    #[error(
        "SSD tier directory {dir} does not support O_DIRECT ({reason}); \
         use mode = kernel (buffered I/O) or put the directory on a real disk filesystem"
    )]
    DirectUnsupported {
        /// The configured directory.
        dir: PathBuf,
        /// What the check found (filesystem type or the open error).
        reason: String,
    },
    /// The configured capacity does not fit in the free space of the directory's filesystem.
    #[error(
        "SSD tier capacity {capacity} bytes does not fit in {dir}: only {available} bytes free \
         (beyond what the tier already holds); lower capacity_bytes"
    )]
    InsufficientSpace {
        /// The configured directory.
        dir: PathBuf,
        /// Requested capacity in bytes.
        capacity: u64,
        /// Space available to the tier (free space plus what its data file already occupies).
        available: u64,
    },
    /// The directory (or a file in it) could be changed by another user: it is writable by
    /// group or others, or owned by another uid. KV bytes reveal prompts, so the tier refuses it.
    #[error("SSD tier path {path} is not private: {reason}; {fix}")]
    InsecureDir {
        /// The directory or file at fault.
        path: PathBuf,
        /// What is wrong (owner or mode).
        reason: String,
        /// The command or choice that fixes it.
        fix: String,
    },
    /// Another process (or another `SsdTier`) holds the directory.
    #[error("SSD tier directory {dir} is locked by another process or instance")]
    Locked {
        /// The configured directory.
        dir: PathBuf,
    },
    /// io_uring was explicitly requested but could not be set up.
    #[error("io_uring engine unavailable: {0}")]
    EngineUnavailable(String),
    /// An I/O error, with what was being done.
    #[error("SSD tier I/O error while {context}: {source}")]
    Io {
        /// What the tier was doing.
        context: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// No contiguous free extent large enough; the caller should evict and retry.
    #[error("SSD tier full: need {needed} bytes, {free} bytes free (largest extent {largest})")]
    Full {
        /// Bytes the block needs on disk (header plus rounded payload).
        needed: u64,
        /// Total free bytes.
        free: u64,
        /// Largest free contiguous extent.
        largest: u64,
    },
    /// The key is not stored.
    #[error("key not found in SSD tier")]
    NotFound,
    /// Stored data failed verification; treat as a miss. The block has been dropped from the index.
    #[error("SSD block at offset {offset} failed verification: {reason}")]
    Corrupt {
        /// Byte offset of the extent in the data file.
        offset: u64,
        /// What did not verify.
        reason: String,
    },
    /// The destination buffer is shorter than the stored block.
    #[error("destination buffer too small: block is {needed} bytes, buffer {got}")]
    BufferTooSmall {
        /// Stored block length.
        needed: u64,
        /// Buffer length.
        got: u64,
    },
    /// A block larger than the tier could ever hold.
    #[error("block of {len} bytes exceeds tier capacity {capacity}")]
    TooLarge {
        /// Block length.
        len: u64,
        /// Tier capacity.
        capacity: u64,
    },
}

impl SsdError {
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        SsdError::Io {
            context: context.into(),
            source,
        }
    }

    /// True for errors the Manager should treat as a plain cache miss.
    pub fn is_miss(&self) -> bool {
        matches!(self, SsdError::NotFound | SsdError::Corrupt { .. })
    }
}
