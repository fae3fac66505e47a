//! The index of visible blocks and their DRAM slots: allocation (evicting under
//! pressure) and [`CacheState::free_slot`], the only place a slot goes back to
//! the arena. Calls no other part of the cache.

use std::sync::atomic::{AtomicU32, Ordering};

use super::CacheState;
use crate::arena::aligned_len;
use crate::keys::{BlockKey, Slot};

/// Told every change of a block's visibility to lookups, in order: `true` when
/// it becomes visible (a commit, an SSD block adopted), `false` when it stops
/// (evicted without an SSD copy, dropped from SSD, doomed). The Manager's
/// presence table is one; see [`CacheState::set_presence_sink`]. Called under
/// the cache lock, so it must be quick and must not call back into the cache.
pub trait PresenceSink: Send + Sync + std::fmt::Debug {
    fn changed(&mut self, key: &BlockKey, visible: bool);
}

/// One visible (or doomed) block. Residency: DRAM (`slot`), SSD (`on_ssd`), or both.
/// `pins` and `hits` are atomic because lookups and releases change them under
/// the shared lock (see `concurrent.rs`); every other field changes only under
/// the exclusive lock.
#[derive(Debug)]
pub(super) struct Entry {
    /// DRAM residency; `None` while the block lives on SSD only.
    pub(super) slot: Option<Slot>,
    /// Block bytes as registered by the namespace (not rounded).
    pub(super) block_bytes: u64,
    pub(super) on_ssd: bool,
    pins: AtomicU32,
    hits: AtomicU32,
    pub(super) busy: Busy,
    /// Invisible to lookups; freed (DRAM slot and SSD copy) once unpinned and idle.
    pub(super) doomed: bool,
}

impl Entry {
    /// A block whose bytes are in `slot` (a committed save).
    pub(super) fn in_dram(slot: Slot, block_bytes: u64) -> Entry {
        Entry {
            slot: Some(slot),
            block_bytes,
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
            slot: None,
            on_ssd: true,
            ..Entry::in_dram(
                Slot {
                    segment: 0,
                    offset: 0,
                    len: 0,
                },
                block_bytes,
            )
        }
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
    /// A worker is reading the SSD copy into this newly allocated slot.
    Staging(Slot),
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
    /// The one hook into visibility changes (see [`PresenceSink`]).
    pub(super) fn note_visibility(&mut self, key: BlockKey, visible: bool) {
        if !visible {
            self.policy.get().forget(&key);
        }
        if let Some(sink) = self.presence.as_mut() {
            sink.changed(&key, visible);
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
            .evict_one(|k| !index.get(k).is_some_and(Entry::evictable));
        let Some(key) = victim else {
            return false;
        };
        // With joint tiers: a block the two tiers together still keep, leaving
        // DRAM without an SSD copy, is lost because its spill came too late.
        let policy = self.policy.get();
        let lost_spill = policy.tiers_enabled()
            && policy.tiers_keep(&key)
            && self
                .index
                .get(&key)
                .is_some_and(|e| e.slot.is_some() && !e.on_ssd);
        let Some(e) = self.index.get_mut(&key) else {
            return true; // the policy only tracks indexed blocks; nothing to free
        };
        let Some(slot) = e.slot.take() else {
            return true;
        };
        if e.on_ssd {
            self.free_slot(slot, SlotFree::Demoted);
        } else {
            if lost_spill {
                self.counters.evicted_unspilled += 1;
            }
            self.index.remove(&key);
            self.note_visibility(key, false);
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
