//! OrbitKV core: the Manager's cache policy as a pure state machine.
//!
//! No sockets, files, threads or clocks. The Manager drives it; tests drive
//! it directly (see `tests/model.rs` for a property test against a model).
#![forbid(unsafe_code)]

pub mod arena;
pub mod cache;
pub mod keys;
mod map;
pub mod policy;
pub mod tier;

pub use arena::{ALIGN, ArenaAllocator, aligned_len};
pub use cache::{
    CacheError, CacheState, Counters, Gauges, LeaseState, LookupResult, MAX_BLOCK_BYTES, SaveStatus,
    SessionEnd,
};
pub use keys::{
    BlockHash, BlockKey, Fingerprint, HASH_BYTES, LeaseId, NamespaceKey, NsId, SaveId, SessionId, Slot,
};
pub use tier::{AcquireStep, SpillJob, SpillPolicy, StageJob, TierKey};
