//! A slab of policy entries (`Lru`'s nodes, `S3Fifo`'s entries) whose slots can
//! be threaded on a doubly linked list: O(1) unlink and append, least recent
//! first. Each slot keeps its list links next to its value, so a list move
//! touches no other memory than the slots it links. Links are 32-bit slot
//! numbers (8 bytes a slot, not 16): a slab holds fewer than 2^32 - 1 slots.

use std::ops::{Index, IndexMut};

const NIL: u32 = u32::MAX;

/// A slot's neighbours on the list (`NIL` at its ends, or off the list).
#[derive(Debug, Clone, Copy)]
struct Links {
    prev: u32,
    next: u32,
}

const UNLINKED: Links = Links { prev: NIL, next: NIL };

#[derive(Debug, Clone)]
pub(super) struct Slab<T> {
    slots: Vec<(Links, T)>,
    free: Vec<u32>,
}

impl<T> Slab<T> {
    pub(super) fn new() -> Self {
        Slab {
            slots: Vec::new(),
            free: Vec::new(),
        }
    }

    /// Store `value` in a free slot (or a new one), off the list; its index.
    pub(super) fn put(&mut self, value: T) -> usize {
        self.put_with(|_| value)
    }

    /// Store `make(previous)` in a free slot (or a new one), off the list; its
    /// index. `previous` is the value a reused slot held when it was released
    /// (`None` for a new slot), so a value can carry state across reuses (S3-FIFO's
    /// slot generation).
    pub(super) fn put_with(&mut self, make: impl FnOnce(Option<&T>) -> T) -> usize {
        match self.free.pop() {
            Some(i) => {
                let slot = &mut self.slots[i as usize];
                *slot = (UNLINKED, make(Some(&slot.1)));
                i as usize
            }
            None => {
                assert!(
                    self.slots.len() < NIL as usize,
                    "policy slab beyond 2^32 - 1 slots"
                );
                if self.slots.len() == self.slots.capacity() {
                    // A quarter, not double: at millions of entries a doubled
                    // slab would be up to half spare.
                    self.slots.reserve_exact(self.slots.len() / 4 + 16);
                }
                self.slots.push((UNLINKED, make(None)));
                self.slots.len() - 1
            }
        }
    }

    /// Room for `n` slots without growing (address space until written).
    pub(super) fn reserve(&mut self, n: usize) {
        self.slots.reserve_exact(n.saturating_sub(self.slots.len()));
    }

    /// Slot `i` (off the list) may be reused.
    pub(super) fn release(&mut self, i: usize) {
        self.free.push(i as u32);
    }

    /// Heap bytes (approximate: allocated capacity).
    pub(super) fn heap_bytes(&self) -> u64 {
        // Slots past `len` were never written: address space, not memory.
        crate::map::vec_bytes::<(Links, T)>(self.slots.len())
            + crate::map::vec_bytes::<u32>(self.free.capacity())
    }

    /// Slots ever allocated (used and free).
    #[cfg(test)]
    pub(super) fn capacity(&self) -> usize {
        self.slots.len()
    }
}

impl<T> Index<usize> for Slab<T> {
    type Output = T;
    fn index(&self, i: usize) -> &T {
        &self.slots[i].1
    }
}

impl<T> IndexMut<usize> for Slab<T> {
    fn index_mut(&mut self, i: usize) -> &mut T {
        &mut self.slots[i].1
    }
}

/// The list's ends; the slots hold the links.
#[derive(Debug, Clone, Copy)]
pub(super) struct List {
    first: u32,
    last: u32,
}

impl List {
    pub(super) const EMPTY: List = List {
        first: NIL,
        last: NIL,
    };

    /// Take slot `i` off the list.
    pub(super) fn unlink<T>(&mut self, slab: &mut Slab<T>, i: usize) {
        let Links { prev, next } = slab.slots[i].0;
        if prev == NIL {
            self.first = next;
        } else {
            slab.slots[prev as usize].0.next = next;
        }
        if next == NIL {
            self.last = prev;
        } else {
            slab.slots[next as usize].0.prev = prev;
        }
        slab.slots[i].0 = UNLINKED;
    }

    /// Put slot `i` (off the list) at its end: the most recent.
    pub(super) fn push_last<T>(&mut self, slab: &mut Slab<T>, i: usize) {
        slab.slots[i].0 = Links {
            prev: self.last,
            next: NIL,
        };
        let i32 = i as u32; // below NIL: `put` checks the slab's size
        if self.last == NIL {
            self.first = i32;
        } else {
            slab.slots[self.last as usize].0.next = i32;
        }
        self.last = i32;
    }

    /// Move slot `i` (on the list) to its end.
    pub(super) fn move_last<T>(&mut self, slab: &mut Slab<T>, i: usize) {
        if self.last as usize != i {
            self.unlink(slab, i);
            self.push_last(slab, i);
        }
    }

    /// The slots from least to most recent.
    pub(super) fn iter<'a, T>(&self, slab: &'a Slab<T>) -> impl Iterator<Item = usize> + 'a {
        let mut i = self.first;
        std::iter::from_fn(move || {
            let at = i as usize;
            i = slab.slots.get(at)?.0.next;
            Some(at)
        })
    }
}
