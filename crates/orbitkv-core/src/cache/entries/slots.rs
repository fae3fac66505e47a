//! The arena's slots, owned by the block index (`entries.rs`).
//!
//! A slot is taken with [`Slots::alloc`] and given back with [`Slots::free`],
//! both visible to `cache::entries` alone: the compiler, not a convention, keeps
//! allocation-with-eviction and [`CacheState::free_slot`] the only places a slot
//! changes hands. Everything else in the cache reads the arena's size and free
//! bytes.
//!
//! [`CacheState::free_slot`]: crate::cache::CacheState::free_slot

use crate::arena::ArenaAllocator;
use crate::keys::Slot;

#[derive(Debug)]
pub(in crate::cache) struct Slots(ArenaAllocator);

impl Slots {
    pub(in crate::cache) fn new(segment_sizes: &[u64]) -> Self {
        Slots(ArenaAllocator::new(segment_sizes))
    }

    pub(in crate::cache) fn capacity(&self) -> u64 {
        self.0.capacity()
    }

    pub(in crate::cache) fn free_bytes(&self) -> u64 {
        self.0.free_bytes()
    }

    pub(in crate::cache) fn segment_sizes(&self) -> &[u64] {
        self.0.segment_sizes()
    }

    pub(in crate::cache) fn largest_segment(&self) -> u64 {
        self.0.largest_segment()
    }

    pub(in crate::cache) fn heap_bytes(&self) -> u64 {
        self.0.heap_bytes()
    }

    pub(in crate::cache::entries) fn alloc(&mut self, bytes: u64) -> Option<Slot> {
        self.0.alloc(bytes)
    }

    pub(in crate::cache::entries) fn free(&mut self, slot: Slot) {
        self.0.free(slot);
    }
}
