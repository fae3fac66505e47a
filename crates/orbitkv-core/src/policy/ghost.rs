//! S3-FIFO's ghost history: a FIFO of recently evicted keys, each known by a
//! 32-bit fingerprint (the high half of its 64-bit hash), with an index from
//! fingerprint to its newest FIFO element.
//!
//! The history remembers several times more keys than are resident (`duel`:
//! 4× the capacity), so its per-key cost dominates the policy's memory. Each
//! element is 5 bytes: the fingerprint, and its weight with a from-main bit as a
//! one-byte code into a table of the distinct values seen (a cache has a few
//! block sizes; past 256 distinct values the codes become the 4-byte values
//! themselves, 8 bytes an element), in two rings. The index is an
//! open-addressing table of 4-byte element numbers (linear probing,
//! backward-shift deletion, 53–80 % full), about 11 bytes per remembered key in
//! all against ~50 in a `HashMap<u64, u64>` over a `VecDeque<(u64, u64)>`.
//! The behaviour is that of such a map keyed by the fingerprint: an element is
//! found only while the index points at it (a later eviction of the same
//! fingerprint, or a readmission, makes an older element stale), and stale
//! elements still count towards the byte limit until they leave the front.
//!
//! A key never remembered is taken for a remembered one when its fingerprint
//! matches one of the N remembered: with probability N / 2^32 (0.5 % at 20 M
//! remembered keys, a 5 M-block cache). The cost is a policy decision, never a
//! wrong block: the key is admitted to main instead of the small queue.

use std::collections::VecDeque;

/// Element numbers are kept modulo this, so at most `MODULUS - 1` elements are
/// held at once; a table slot holds the number + 1, and 0 when empty (so a new
/// table is `calloc`ed memory, zeroed by the kernel as it is first touched).
const MODULUS: u64 = u32::MAX as u64;
const EMPTY: u32 = 0;
/// Weights above this are remembered as this (blocks are at most 1 GiB).
const MAX_WEIGHT: u64 = (u32::MAX >> 1) as u64;

/// The 32 bits of a 64-bit key hash the history keeps: the high half (the
/// low half of a foldhash is the weaker one).
fn fingerprint(hash: u64) -> u32 {
    (hash >> 32) as u32
}

/// The ring of element values (weight `<< 1`, `| 1` when evicted from main),
/// oldest first.
#[derive(Debug, Clone)]
enum Values {
    /// One byte an element: an index into `dict`, the distinct values seen
    /// (at most 256; never shrinks). `last`: the code last pushed.
    Coded {
        codes: VecDeque<u8>,
        dict: Vec<u32>,
        last: u8,
    },
    /// The values themselves, once more than 256 distinct ones were seen.
    Plain(VecDeque<u32>),
}

impl Default for Values {
    fn default() -> Self {
        Values::Coded {
            codes: VecDeque::new(),
            dict: Vec::new(),
            last: 0,
        }
    }
}

impl Values {
    fn get(&self, at: usize) -> u32 {
        match self {
            Values::Coded { codes, dict, .. } => dict[usize::from(codes[at])],
            Values::Plain(v) => v[at],
        }
    }

    fn pop_front(&mut self) -> Option<u32> {
        match self {
            Values::Coded { codes, dict, .. } => codes.pop_front().map(|c| dict[usize::from(c)]),
            Values::Plain(v) => v.pop_front(),
        }
    }

    fn push_back(&mut self, value: u32) {
        if let Values::Coded { codes, dict, last } = self {
            let code = if dict.get(usize::from(*last)) == Some(&value) {
                Some(*last)
            } else if let Some(c) = dict.iter().position(|&d| d == value) {
                Some(c as u8)
            } else if dict.len() <= usize::from(u8::MAX) {
                dict.push(value);
                Some((dict.len() - 1) as u8)
            } else {
                None
            };
            if let Some(c) = code {
                *last = c;
                codes.push_back(c);
                return;
            }
            // A 257th distinct value: hold the values themselves from now on.
            let mut plain = VecDeque::with_capacity(codes.capacity());
            plain.extend(codes.iter().map(|&c| dict[usize::from(c)]));
            *self = Values::Plain(plain);
        }
        if let Values::Plain(v) = self {
            v.push_back(value);
        }
    }

    fn reserve_exact(&mut self, more: usize) {
        match self {
            Values::Coded { codes, .. } => codes.reserve_exact(more),
            Values::Plain(v) => v.reserve_exact(more),
        }
    }

    /// Heap bytes of `len` elements (and the dictionary).
    fn heap_bytes(&self, len: usize) -> usize {
        match self {
            Values::Coded { dict, .. } => len + dict.capacity() * 4,
            Values::Plain(_) => len * 4,
        }
    }
}

/// Ring offset of the held element numbered `number` in the index (element
/// number modulo [`MODULUS`] + 1), the ring's first element being number `head`.
fn ring_offset(number: u32, head: u64) -> usize {
    ((u64::from(number - 1) + MODULUS - head % MODULUS) % MODULUS) as usize
}

#[derive(Debug, Clone, Default)]
pub(super) struct Ghost {
    /// Element fingerprints, oldest first; element `j` has number `head + j`.
    hashes: VecDeque<u32>,
    /// Element weight `<< 1`, `| 1` when it was evicted from main.
    weights: Values,
    head: u64,
    /// Open-addressing index: element number modulo [`MODULUS`] + 1, or [`EMPTY`].
    table: Vec<u32>,
    /// Elements the index points at.
    indexed: usize,
    /// Weight of every element held, stale ones included.
    bytes: u64,
}

impl Ghost {
    /// Heap bytes: the table's allocation; the rings count by the elements held: their room is reserved for what
    /// the byte limit implies (`reserve`), so at steady state the two agree.
    pub(super) fn heap_bytes(&self) -> u64 {
        (self.hashes.len() * 4 + self.weights.heap_bytes(self.hashes.len()) + self.table.capacity() * 4)
            as u64
    }

    /// Forget `hash`; `Some(from_main)` when it (its fingerprint) was remembered.
    pub(super) fn take(&mut self, hash: u64) -> Option<bool> {
        let at = self.find(fingerprint(hash))?;
        let off = self.offset(self.table[at]);
        self.remove_at(at);
        Some(self.weights.get(off) & 1 == 1)
    }

    /// Remember `hash` (evicted with `weight`, from main or not) as the newest
    /// element, then drop the oldest until at most `limit` bytes are held.
    pub(super) fn add(&mut self, hash: u64, weight: u64, from_main: bool, limit: u64) {
        let hash = fingerprint(hash);
        if self.hashes.len() as u64 >= MODULUS - 1 {
            self.pop_front();
        }
        let w = weight.min(MAX_WEIGHT);
        // Make room before the push: the same elements leave as when the new
        // one is pushed first (an older element of the same hash is then
        // unindexed here and indexed anew below: the same end state), and the
        // rings never outgrow `limit` by one element (a reserved ring would
        // grow by a quarter and, as it cycles, touch all of it).
        while self.bytes + w > limit && !self.hashes.is_empty() {
            self.pop_front();
        }
        let number = ((self.head + self.hashes.len() as u64) % MODULUS) as u32 + 1;
        if self.hashes.len() == self.hashes.capacity() {
            // Grow by a quarter, not double: the history is the policy's largest part.
            let more = self.hashes.len() / 4 + 16;
            self.hashes.reserve_exact(more);
            self.weights.reserve_exact(more);
        }
        self.hashes.push_back(hash);
        self.weights.push_back((w as u32) << 1 | u32::from(from_main));
        self.bytes += w;
        match self.find(hash) {
            Some(at) => self.table[at] = number,
            None => {
                if (self.indexed + 1) * 5 > self.table.len() * 4 {
                    self.grow();
                }
                let mut at = self.home(hash);
                while self.table[at] != EMPTY {
                    at = self.next(at);
                }
                self.table[at] = number;
                self.indexed += 1;
            }
        }
        // Only the new element itself, when it alone weighs more than `limit`.
        while self.bytes > limit && !self.hashes.is_empty() {
            self.pop_front();
        }
    }

    /// Drop the oldest element (and its index entry when the index points at it).
    fn pop_front(&mut self) {
        let (Some(h), Some(wf)) = (self.hashes.pop_front(), self.weights.pop_front()) else {
            return;
        };
        let number = (self.head % MODULUS) as u32 + 1;
        self.head += 1;
        self.bytes -= u64::from(wf >> 1);
        // The element is gone from the rings: find its slot by number, probing
        // from its hash's home.
        let mut at = self.home(h);
        while self.table.get(at).is_some_and(|&v| v != EMPTY) {
            if self.table[at] == number {
                self.remove_at(at);
                return;
            }
            at = self.next(at);
        }
    }

    /// Ring offset of the held element whose table slot holds `number`.
    fn offset(&self, number: u32) -> usize {
        ring_offset(number, self.head)
    }

    /// Room for `n` elements without growing the table or the rings.
    pub(super) fn reserve(&mut self, n: usize) {
        let want = n.saturating_mul(5).div_ceil(4);
        if want > self.table.len() {
            self.rebuild(want);
        }
        let more = n.saturating_sub(self.hashes.len());
        self.hashes.reserve_exact(more);
        self.weights.reserve_exact(more);
    }

    fn home(&self, fp: u32) -> usize {
        crate::table::home_of(fp, self.table.len())
    }

    fn next(&self, at: usize) -> usize {
        crate::table::next_of(at, self.table.len())
    }

    /// The table slot pointing at the element of fingerprint `hash`.
    fn find(&self, hash: u32) -> Option<usize> {
        if self.table.is_empty() {
            return None;
        }
        let mut at = self.home(hash);
        loop {
            let v = self.table[at];
            if v == EMPTY {
                return None;
            }
            if self.hashes[self.offset(v)] == hash {
                return Some(at);
            }
            at = self.next(at);
        }
    }

    /// Empty slot `at`, shifting later entries of its probe run back.
    fn remove_at(&mut self, at: usize) {
        self.indexed -= 1;
        let (hashes, head) = (&self.hashes, self.head);
        crate::table::remove_shifting(&mut self.table, at, EMPTY, |v| hashes[ring_offset(v, head)]);
    }

    fn grow(&mut self) {
        self.rebuild((self.table.len() * 3 / 2).max(16));
    }

    fn rebuild(&mut self, size: usize) {
        let old = std::mem::replace(&mut self.table, vec![EMPTY; size]);
        for v in old.into_iter().filter(|&v| v != EMPTY) {
            let mut at = self.home(self.hashes[self.offset(v)]);
            while self.table[at] != EMPTY {
                at = self.next(at);
            }
            self.table[at] = v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::xorshift;
    use std::collections::HashMap;

    /// The reference: the `HashMap` + `VecDeque` history this replaced.
    #[derive(Default)]
    struct Reference {
        ring: VecDeque<(u64, u64)>,
        index: HashMap<u64, u64>,
        head: u64,
        bytes: u64,
    }

    impl Reference {
        fn take(&mut self, h: u64) -> Option<bool> {
            self.index.remove(&(h >> 32)).map(|v| v & 1 == 1)
        }
        fn add(&mut self, h: u64, w: u64, main: bool, limit: u64) {
            let h = h >> 32; // the history knows keys by their fingerprint
            let seq = self.head + self.ring.len() as u64;
            self.ring.push_back((h, w));
            self.index.insert(h, seq << 1 | u64::from(main));
            self.bytes += w;
            while self.bytes > limit {
                let Some((gh, w)) = self.ring.pop_front() else {
                    break;
                };
                let s = self.head;
                self.head += 1;
                self.bytes -= w;
                if self.index.get(&gh).is_some_and(|v| v >> 1 == s) {
                    self.index.remove(&gh);
                }
            }
        }
    }

    #[test]
    fn behaves_like_the_map_over_a_ring() {
        let mut g = Ghost::default();
        let mut r = Reference::default();
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        for step in 0..300_000u64 {
            xorshift(&mut x);
            // Few distinct hashes (repeats and stale elements), some colliding homes.
            let h = ((x >> 20) % 3000).wrapping_mul(0x9e37_79b9_7f4a_7c15) | (x >> 63);
            let limit = if step < 150_000 { 20_000 } else { 5_000 };
            if x.is_multiple_of(3) {
                assert_eq!(g.take(h), r.take(h), "step {step}");
            } else {
                let w = 1 + (x >> 40) % 20;
                g.add(h, w, x & 4 == 0, limit);
                r.add(h, w, x & 4 == 0, limit);
            }
            assert_eq!(g.bytes, r.bytes);
            assert_eq!(g.indexed, r.index.len());
        }
        for h in r.index.keys() {
            assert!(g.find(*h as u32).is_some());
        }
    }

    /// Weights are held as one-byte codes while at most 256 distinct values
    /// were seen, then as the values themselves; either way the history
    /// behaves as the reference does.
    #[test]
    fn many_distinct_weights_switch_to_plain_values() {
        let mut g = Ghost::default();
        let mut r = Reference::default();
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        for step in 0..100_000u64 {
            xorshift(&mut x);
            let h = ((x >> 20) % 5000).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            // 2 block sizes (4 values with the from-main bit), then 300 more.
            let w = if step < 50_000 {
                [4096, 8192][(x >> 40) as usize % 2]
            } else {
                1 + (x >> 40) % 300
            };
            if x.is_multiple_of(4) {
                assert_eq!(g.take(h), r.take(h), "step {step}");
            } else {
                g.add(h, w, x & 8 == 0, 1_000_000);
                r.add(h, w, x & 8 == 0, 1_000_000);
            }
            assert_eq!(g.bytes, r.bytes);
            assert_eq!(g.indexed, r.index.len());
            if step == 49_999 {
                assert!(matches!(&g.weights, Values::Coded { dict, .. } if dict.len() == 4));
                let rings = g.heap_bytes() - g.table.capacity() as u64 * 4;
                assert_eq!(rings, g.hashes.len() as u64 * 5 + 16, "5 bytes an element");
            }
        }
        assert!(matches!(g.weights, Values::Plain(_)));
        assert_eq!(
            g.heap_bytes(),
            (g.hashes.len() * 8 + g.table.capacity() * 4) as u64
        );
    }
}
