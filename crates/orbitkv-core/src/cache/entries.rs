//! The index of visible blocks and their DRAM slots: allocation (evicting under
//! pressure) and [`CacheState::free_slot`], the only place a slot goes back to
//! the arena. Calls no other part of the cache.

use std::sync::atomic::{AtomicU32, Ordering};

mod slots;

pub(super) use slots::Slots;

use super::CacheState;
use crate::arena::{ALIGN, aligned_len};
use crate::keys::{BlockKey, Slot};

/// Told every change of a block's visibility to lookups, in order: `true` when
/// it becomes visible (a commit, an SSD block adopted), `false` when it stops
/// (evicted without an SSD copy, dropped from SSD, doomed), with where it is
/// (was) served from: `in_dram`, else SSD only. [`Self::moved`]: a visible
/// block's residency changed (demoted to SSD only, staged back into DRAM). The
/// Manager's presence table is one; see [`CacheState::set_presence_sink`].
/// Called under the cache lock, so it must be quick and must not call back
/// into the cache.
pub trait PresenceSink: Send + Sync + std::fmt::Debug {
    fn changed(&mut self, key: &BlockKey, visible: bool, in_dram: bool);
    fn moved(&mut self, _key: &BlockKey, _in_dram: bool) {}
}

/// One visible (or doomed) block. Residency: DRAM (`dram_slot`), SSD
/// (`on_ssd`), or both. `pins` and `hits` are atomic because lookups and
/// releases change them under the shared lock (see `concurrent.rs`); every
/// other field changes only under the exclusive lock.
///
/// 24 bytes, one per indexed block (millions of them): the slot is packed in a
/// `u64` (segment and 4 KiB page; its length is the block bytes rounded up to
/// the arena granularity, as every slot of the block's namespace is), the block
/// bytes are a `u32` (at most [`super::MAX_BLOCK_BYTES`]), and a staging slot is
/// held by its [`super::StageJob`], not here.
#[derive(Debug)]
pub(super) struct Entry {
    /// DRAM residency ([`PackedSlot::NONE`] while the block lives on SSD only).
    slot: PackedSlot,
    /// Block bytes as registered by the namespace (not rounded).
    block_bytes: u32,
    pins: AtomicU32,
    hits: AtomicU32,
    pub(super) busy: Busy,
    pub(super) on_ssd: bool,
    /// Invisible to lookups; freed (DRAM slot and SSD copy) once unpinned and idle.
    pub(super) doomed: bool,
}

// The index's slab holds `Option<(BlockKey, Entry)>`: 72 bytes, no tag word.
const _: () = assert!(std::mem::size_of::<Option<(BlockKey, Entry)>>() == 72);

/// A DRAM slot's segment (high 24 bits) and 4 KiB page (low 40 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PackedSlot(u64);

impl PackedSlot {
    const NONE: PackedSlot = PackedSlot(u64::MAX);
    const PAGE_BITS: u32 = 40;

    fn pack(slot: Slot) -> PackedSlot {
        let page = slot.offset / ALIGN;
        // Arenas have at most 16,384 segments (the Manager refuses more at start-up)
        // and a segment far below 4 PiB, so both always fit.
        debug_assert!(slot.offset.is_multiple_of(ALIGN) && page < 1 << Self::PAGE_BITS);
        debug_assert!(u64::from(slot.segment) < (1 << (64 - Self::PAGE_BITS)) - 1);
        PackedSlot(u64::from(slot.segment) << Self::PAGE_BITS | page)
    }

    fn unpack(self, len: u64) -> Option<Slot> {
        (self != Self::NONE).then(|| Slot {
            segment: (self.0 >> Self::PAGE_BITS) as u32,
            offset: (self.0 & ((1 << Self::PAGE_BITS) - 1)) * ALIGN,
            len,
        })
    }
}

impl Entry {
    /// A block whose bytes are in `slot` (a committed save).
    pub(super) fn in_dram(slot: Slot, block_bytes: u64) -> Entry {
        debug_assert_eq!(slot.len, aligned_len(block_bytes));
        Entry {
            slot: PackedSlot::pack(slot),
            block_bytes: u32::try_from(block_bytes).unwrap_or(u32::MAX),
            on_ssd: false,
            pins: AtomicU32::new(0),
            hits: AtomicU32::new(0),
            busy: Busy::Idle,
            doomed: false,
        }
    }

    /// A block whose only copy is on SSD (recovered at start).
    pub(super) fn on_ssd_only(block_bytes: u64) -> Entry {
        Entry {
            slot: PackedSlot::NONE,
            block_bytes: u32::try_from(block_bytes).unwrap_or(u32::MAX),
            on_ssd: true,
            pins: AtomicU32::new(0),
            hits: AtomicU32::new(0),
            busy: Busy::Idle,
            doomed: false,
        }
    }

    /// Block bytes as registered by the namespace (not rounded).
    pub(super) fn data_bytes(&self) -> u64 {
        u64::from(self.block_bytes)
    }

    /// The DRAM slot; `None` while the block lives on SSD only.
    pub(super) fn dram_slot(&self) -> Option<Slot> {
        self.slot.unpack(aligned_len(self.data_bytes()))
    }

    /// Take the DRAM slot away (the block leaves DRAM).
    pub(super) fn take_dram_slot(&mut self) -> Option<Slot> {
        let slot = self.dram_slot();
        self.slot = PackedSlot::NONE;
        slot
    }

    /// The block's bytes are now in `slot` (a staging read finished).
    pub(super) fn set_dram_slot(&mut self, slot: Slot) {
        debug_assert_eq!(slot.len, aligned_len(self.data_bytes()));
        self.slot = PackedSlot::pack(slot);
    }

    /// May eviction take this entry's DRAM slot?
    pub(super) fn evictable(&self) -> bool {
        self.pins() == 0 && self.busy == Busy::Idle && !self.doomed
    }

    /// Leases pinning this block. Relaxed loads and updates suffice: the cache
    /// lock orders the shared-side changes before every exclusive-side read.
    pub(super) fn pins(&self) -> u32 {
        self.pins.load(Ordering::Relaxed)
    }

    pub(super) fn pin(&self) {
        self.pins.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn unpin(&self) {
        let _ = self
            .pins
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| p.checked_sub(1));
    }

    /// Hits counted for SSD admission.
    pub(super) fn hits(&self) -> u32 {
        self.hits.load(Ordering::Relaxed)
    }

    pub(super) fn set_hits(&mut self, hits: u32) {
        *self.hits.get_mut() = hits;
    }

    /// Count one hit (saturating); returns the new count.
    pub(super) fn hit(&self) -> u32 {
        let prev = self
            .hits
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| {
                Some(h.saturating_add(1))
            })
            .unwrap_or(u32::MAX);
        prev.saturating_add(1)
    }
}

/// Tier work in flight on an entry (the Manager's workers do the I/O).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Busy {
    Idle,
    /// A worker is copying the DRAM slot to SSD: the slot must not be freed.
    Spilling,
    /// A worker is reading the SSD copy into a newly allocated slot (its
    /// [`super::StageJob`] holds the slot until `finish_stage`).
    Staging,
}

/// Why a DRAM slot goes back to the arena: one variant per caller of
/// [`CacheState::free_slot`], so this list answers "who frees a block's slot?".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SlotFree {
    /// `evict_one`: an unpinned, idle visible block left DRAM and the index.
    Evicted,
    /// `evict_one`: an unpinned, idle visible block left DRAM; its SSD copy
    /// keeps it visible.
    Demoted,
    /// `commit_save`: another session committed the same block first.
    DuplicateOnCommit,
    /// `end_save`: a pending save was aborted, or its session ended.
    SaveAborted,
    /// `stage_jobs`: a staging slot allocated for a lease that then could not
    /// get all its slots (nothing was read into it).
    StageAbandoned,
    /// `finish_stage`: the staging read failed or the block was doomed meanwhile.
    StageDiscarded,
    /// `reap_if_doomed`: a doomed block is unpinned and idle.
    Reaped,
}

impl CacheState {
    /// The one hook into visibility changes (see [`PresenceSink`]). A block
    /// that stops being visible is forgotten by the policy here, so it must
    /// still be indexed (the policy knows it by its index reference).
    pub(super) fn note_visibility(&mut self, key: BlockKey, visible: bool, in_dram: bool) {
        if !visible && let Some(r) = self.index.ref_of(&key) {
            self.policy.get().forget(&r);
        }
        if let Some(sink) = self.presence.as_mut() {
            sink.changed(&key, visible, in_dram);
        }
    }

    /// A visible block's residency changed: demoted to SSD only (`false`) or
    /// staged back into DRAM (`true`).
    pub(super) fn note_moved(&mut self, key: BlockKey, in_dram: bool) {
        if let Some(sink) = self.presence.as_mut() {
            sink.moved(&key, in_dram);
        }
    }

    /// Allocate a slot of `bytes`, evicting unpinned idle blocks until one fits.
    /// `None` when every DRAM-resident block is pinned or busy.
    pub(super) fn alloc_or_evict(&mut self, bytes: u64) -> Option<Slot> {
        loop {
            if let Some(slot) = self.arena.alloc(bytes) {
                return Some(slot);
            }
            if !self.evict_one(aligned_len(bytes)) {
                return None;
            }
        }
    }

    /// Take one DRAM slot from an evictable block: the block stays visible on
    /// SSD when it has a copy there (demotion), otherwise it is dropped.
    /// `false` when every DRAM-resident block is pinned or busy.
    fn evict_one(&mut self, _needed: u64) -> bool {
        let index = &self.index;
        let victim = self
            .policy
            .get()
            .evict_one(|r| !index.by_ref(*r).is_some_and(|(_, e)| e.evictable()));
        let Some(r) = victim else {
            return false;
        };
        let Some((&key, e)) = self.index.by_ref(r) else {
            return true; // the policy only tracks indexed blocks; nothing to free
        };
        // With joint tiers: a block the two tiers together still keep, leaving
        // DRAM without an SSD copy, is lost because its spill came too late.
        let policy = self.policy.get();
        let lost_spill =
            policy.tiers_enabled() && policy.tiers_keep(&r) && e.dram_slot().is_some() && !e.on_ssd;
        let Some(e) = self.index.get_mut(&key) else {
            return true; // the policy only tracks indexed blocks; nothing to free
        };
        let Some(slot) = e.take_dram_slot() else {
            return true;
        };
        if e.on_ssd {
            let visible = !e.doomed;
            self.free_slot(slot, SlotFree::Demoted);
            if visible {
                self.note_moved(key, false);
            }
        } else {
            if lost_spill {
                self.counters.evicted_unspilled += 1;
            }
            self.note_visibility(key, false, true);
            self.index.remove(&key);
            self.free_slot(slot, SlotFree::Evicted);
        }
        true
    }

    /// The only place a DRAM slot returns to the arena; counts why.
    pub(super) fn free_slot(&mut self, slot: Slot, why: SlotFree) {
        self.arena.free(slot);
        let c = &mut self.counters;
        match why {
            SlotFree::Evicted => {
                c.evicted_bytes += slot.len;
                c.evictions += 1;
            }
            SlotFree::Demoted => {
                c.evicted_bytes += slot.len;
                c.demotions += 1;
            }
            SlotFree::DuplicateOnCommit => c.blocks_duplicate_on_commit += 1,
            SlotFree::SaveAborted => c.blocks_aborted += 1,
            SlotFree::StageAbandoned | SlotFree::StageDiscarded | SlotFree::Reaped => {}
        }
    }
}
