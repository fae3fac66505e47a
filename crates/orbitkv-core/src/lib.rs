//! OrbitKV core: the Manager's cache policy as a pure state machine.
//!
//! No sockets, files, threads or clocks. The Manager drives it; tests drive
//! it directly (`tests/model.rs` and `tests/model_ssd.rs` are property tests
//! against a model, `tests/scenarios.rs` runs the scripts under `testdata/`).
#![forbid(unsafe_code)]

pub mod arena;
mod cache;
pub mod keys;
mod map;
pub mod policy;
mod table;

pub use arena::{ALIGN, ArenaAllocator, aligned_len};
pub use cache::{
    AcquireStep, BlockRef, CacheError, CacheState, Counters, Gauges, HeapBytes, HintStats, LeaseState,
    LeasedSlot, LookupResult, MAX_BLOCK_BYTES, MAX_PENDING_HINTS, MAX_RETAIN_TTL_MS, MAX_TP_SHARDS,
    MissReason, PresenceSink, Retain, RetainOutcome, SaveSlot, SaveStatus, SessionEnd, SpillJob, SpillPolicy,
    StageJob, TpLookupResult, TpPart, TpRedeemed, TpToken,
};
pub use keys::{
    BlockHash, BlockKey, Fingerprint, HASH_BYTES, LeaseId, NamespaceKey, NsId, SaveId, SessionId, Slot,
    TierKey,
};
