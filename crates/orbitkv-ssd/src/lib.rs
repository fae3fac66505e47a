//! OrbitKV local SSD tier (contracts D1, D2).
//!
//! Blocks live in one preallocated data file as 4 KiB-aligned extents, each a 4 KiB
//! header (format version, full key, length, payload checksum) followed by the payload.
//! An append-only journal of checksummed fixed-size records maps keys to extents and is
//! compacted whenever it grows past twice the live set (checked at open too). Reads check the
//! header key and the payload checksum and never return unverified bytes. I/O runs on
//! io_uring threads, or on a pread/pwrite pool when io_uring is unavailable.
//! See README.md for the format and the crash-safety argument.
#![deny(unsafe_op_in_unsafe_fn, unsafe_code)]
#![deny(clippy::unwrap_used, clippy::expect_used)]
#![warn(missing_docs)]

mod alloc;
mod bgverify;
mod config;
mod dir;
mod error;
pub mod format;
mod header;
mod index;
mod journal;
mod key;
mod read;
mod recovery;
mod state;
mod tier;
mod uring;
mod write;

pub use bgverify::HeaderCheck;
pub use config::{EnginePref, IoMode, RecoveryVerify, SsdConfig};
pub use error::{Result, SsdError};
pub use key::{KEY_BYTES, SsdKey};
pub use recovery::{RecoveryPhase, RecoveryProgress, RecoveryReport};
pub use tier::{DATA_FILE, EngineInfo, SsdStats, SsdTier};

pub use dir::{FILE_MODE, TEMP_SUFFIX};

/// Name of the journal file inside the tier directory.
pub const JOURNAL_FILE: &str = journal::JOURNAL_FILE;

#[cfg(test)]
mod send_sync {
    fn assert_send_sync<T: Send + Sync>() {}
    #[test]
    fn tier_is_send_sync() {
        assert_send_sync::<crate::SsdTier>();
    }
}
