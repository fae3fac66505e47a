//! The I/O jobs the cache hands the Manager's tier code: a [`StageJob`] (read
//! an SSD copy into a staging slot) and a [`SpillJob`] (write a frozen DRAM
//! slot to SSD). Only the cache makes them (their fields are visible to
//! `cache` alone), so holding one is the right to touch its slot until the job
//! is reported (`finish_stage`, `spill_done`); the Manager reads them through
//! the accessors.

use crate::keys::{BlockKey, Slot, TierKey};

/// Read the SSD copy of `tier_key` into `slot`: the right to write that
/// staging slot, which no one else touches until `finish_stage`.
#[derive(Debug, Clone, Copy)]
pub struct StageJob {
    pub(in crate::cache) key: BlockKey,
    pub(in crate::cache) tier_key: TierKey,
    pub(in crate::cache) slot: Slot,
    pub(in crate::cache) block_bytes: u64,
}

/// Copy `slot` (holding `block_bytes` of data) to SSD under `tier_key`: the
/// right to read that slot, frozen (never evicted or freed) until `spill_done`.
#[derive(Debug, Clone, Copy)]
pub struct SpillJob {
    pub(in crate::cache) key: BlockKey,
    pub(in crate::cache) tier_key: TierKey,
    pub(in crate::cache) slot: Slot,
    pub(in crate::cache) block_bytes: u64,
}

macro_rules! job_accessors {
    ($job:ty) => {
        impl $job {
            /// The block.
            pub fn key(&self) -> BlockKey {
                self.key
            }

            /// The block's identity on disk.
            pub fn tier_key(&self) -> TierKey {
                self.tier_key
            }

            /// The arena slot the I/O reads or writes.
            pub fn slot(&self) -> Slot {
                self.slot
            }

            /// The block's bytes (the slot may be longer: it is rounded up to
            /// the arena's granularity).
            pub fn block_bytes(&self) -> u64 {
                self.block_bytes
            }
        }
    };
}

job_accessors!(StageJob);
job_accessors!(SpillJob);
