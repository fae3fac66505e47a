//! Slabs of policy entries (`Lru`'s nodes, `S3Fifo`'s entries) and a doubly
//! linked list threaded through their slots: O(1) unlink and append, least
//! recent first, no allocation of its own.

pub(super) const NIL: usize = usize::MAX;

/// Store `value` in a free slot of `slots` (or a new one); its index.
pub(super) fn put<T>(slots: &mut Vec<T>, free: &mut Vec<usize>, value: T) -> usize {
    match free.pop() {
        Some(i) => {
            slots[i] = value;
            i
        }
        None => {
            slots.push(value);
            slots.len() - 1
        }
    }
}

/// A slot's neighbours on the list (`NIL` at its ends).
#[derive(Debug, Clone, Copy)]
pub(super) struct Links {
    pub(super) prev: usize,
    pub(super) next: usize,
}

impl Links {
    pub(super) const NONE: Links = Links { prev: NIL, next: NIL };
}

/// A slab slot that can be on a [`List`].
pub(super) trait Linked {
    fn links(&self) -> Links;
    fn links_mut(&mut self) -> &mut Links;
}

/// The list's ends; the slots hold the links.
#[derive(Debug, Clone, Copy)]
pub(super) struct List {
    first: usize,
    last: usize,
}

impl List {
    pub(super) const EMPTY: List = List {
        first: NIL,
        last: NIL,
    };

    /// Take slot `i` off the list.
    pub(super) fn unlink<T: Linked>(&mut self, slots: &mut [T], i: usize) {
        let Links { prev, next } = slots[i].links();
        if prev == NIL {
            self.first = next;
        } else {
            slots[prev].links_mut().next = next;
        }
        if next == NIL {
            self.last = prev;
        } else {
            slots[next].links_mut().prev = prev;
        }
    }

    /// Put slot `i` (not on the list) at its end: the most recent.
    pub(super) fn push_last<T: Linked>(&mut self, slots: &mut [T], i: usize) {
        *slots[i].links_mut() = Links {
            prev: self.last,
            next: NIL,
        };
        if self.last == NIL {
            self.first = i;
        } else {
            slots[self.last].links_mut().next = i;
        }
        self.last = i;
    }

    /// Move slot `i` (on the list) to its end.
    pub(super) fn move_last<T: Linked>(&mut self, slots: &mut [T], i: usize) {
        if self.last != i {
            self.unlink(slots, i);
            self.push_last(slots, i);
        }
    }

    /// The slots from least to most recent.
    pub(super) fn iter<'a, T: Linked>(&self, slots: &'a [T]) -> impl Iterator<Item = usize> + 'a {
        let mut i = self.first;
        std::iter::from_fn(move || {
            let at = i;
            i = slots.get(at)?.links().next;
            Some(at)
        })
    }
}
