//! The rights to arena slots the cache hands out: the I/O jobs of the tier code
//! (a [`StageJob`] reads an SSD copy into a staging slot, a [`SpillJob`] writes
//! a frozen DRAM slot to SSD) and the slots it lends to sessions (a
//! [`SaveSlot`] of an open save, a [`LeasedSlot`] of an acquired lease). Only
//! the cache makes them (their fields are visible to `cache` alone), so code
//! outside the core that touches arena bytes — the Manager's SSD and peer
//! transfers — can do so only with one in hand; the Manager reads them through
//! their accessors.

use crate::keys::{BlockKey, Slot, TierKey};

/// An I/O job's type: the block, its identity on disk, the arena slot and the
/// block's bytes, with their accessors. Two types, so that a staging right is
/// never taken for a spilling one.
macro_rules! job {
    ($(#[$doc:meta])* $job:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy)]
        pub struct $job {
            pub(in crate::cache) key: BlockKey,
            pub(in crate::cache) tier_key: TierKey,
            pub(in crate::cache) slot: Slot,
            pub(in crate::cache) block_bytes: u64,
        }

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

job!(
    /// Read the SSD copy of `tier_key` into `slot`: the right to write that
    /// staging slot, which no one else touches until `finish_stage`.
    StageJob
);

job!(
    /// Copy `slot` (holding `block_bytes` of data) to SSD under `tier_key`: the
    /// right to read that slot, frozen (never evicted or freed) until `spill_done`.
    SpillJob
);

/// A slot of an open save, lent by `begin_save`: its bytes may be written until
/// the save is committed or aborted. Only the cache makes one; it reads as the
/// [`Slot`] it lends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaveSlot(Slot);

/// The slot of a block an acquired lease pins, handed out by `acquire`: its
/// bytes may be read (never written) until the lease ends. Only the cache makes
/// one; it reads as the [`Slot`] it lends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeasedSlot(Slot);

macro_rules! lent_slot {
    ($lent:ident) => {
        impl $lent {
            pub(in crate::cache) fn new(slot: Slot) -> Self {
                $lent(slot)
            }

            /// The slot lent.
            pub fn slot(&self) -> Slot {
                self.0
            }
        }

        impl std::ops::Deref for $lent {
            type Target = Slot;
            fn deref(&self) -> &Slot {
                &self.0
            }
        }
    };
}

lent_slot!(SaveSlot);
lent_slot!(LeasedSlot);
