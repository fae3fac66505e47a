//! Address-space allocator for the shared DRAM arena.
//!
//! The arena is a few large page-aligned segments (memfd in the Manager). This
//! module only does bookkeeping: which `(segment, offset, len)` extents are free.
//! Best fit over all segments, with coalescing of neighbours on free. All extents
//! are multiples of [`ALIGN`] so that the SSD tier can use `O_DIRECT` on them and
//! a GPU kernel can address them as `(segment base + offset)`.

use std::collections::{BTreeMap, BTreeSet};

use crate::keys::Slot;

/// Extent alignment and granularity in bytes.
pub const ALIGN: u64 = 4096;

/// Round `bytes` up to the arena granularity.
pub fn aligned_len(bytes: u64) -> u64 {
    bytes.div_ceil(ALIGN).saturating_mul(ALIGN)
}

#[derive(Debug, Clone)]
pub struct ArenaAllocator {
    /// Per segment: free extents by offset → length.
    free_by_offset: Vec<BTreeMap<u64, u64>>,
    /// All free extents ordered by (length, segment, offset) for best fit.
    free_by_size: BTreeSet<(u64, u32, u64)>,
    segment_sizes: Vec<u64>,
    free_bytes: u64,
}

impl ArenaAllocator {
    /// `segment_sizes` must each be a multiple of [`ALIGN`]; a trailing
    /// unaligned remainder is never handed out.
    pub fn new(segment_sizes: &[u64]) -> Self {
        let mut a = ArenaAllocator {
            free_by_offset: Vec::with_capacity(segment_sizes.len()),
            free_by_size: BTreeSet::new(),
            segment_sizes: segment_sizes.to_vec(),
            free_bytes: 0,
        };
        for (i, &size) in segment_sizes.iter().enumerate() {
            let usable = size / ALIGN * ALIGN;
            let mut m = BTreeMap::new();
            if usable > 0 {
                m.insert(0, usable);
                a.free_by_size.insert((usable, i as u32, 0));
                a.free_bytes += usable;
            }
            a.free_by_offset.push(m);
        }
        a
    }

    pub fn capacity(&self) -> u64 {
        self.segment_sizes.iter().map(|s| s / ALIGN * ALIGN).sum()
    }

    /// Approximate heap bytes of the free-extent trees.
    pub fn heap_bytes(&self) -> u64 {
        use crate::map::{btree_bytes, vec_bytes};
        let by_offset: u64 = self
            .free_by_offset
            .iter()
            .map(|m| btree_bytes::<(u64, u64)>(m.len()))
            .sum();
        by_offset
            + btree_bytes::<(u64, u32, u64)>(self.free_by_size.len())
            + vec_bytes::<BTreeMap<u64, u64>>(self.free_by_offset.capacity())
            + vec_bytes::<u64>(self.segment_sizes.capacity())
    }

    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    pub fn segment_sizes(&self) -> &[u64] {
        &self.segment_sizes
    }

    /// Usable bytes of the largest segment: no block may be larger (a block is
    /// one extent of one segment).
    pub fn largest_segment(&self) -> u64 {
        self.segment_sizes
            .iter()
            .map(|s| s / ALIGN * ALIGN)
            .max()
            .unwrap_or(0)
    }

    /// Allocate `bytes` (rounded up to [`ALIGN`]); `None` when no free extent fits.
    pub fn alloc(&mut self, bytes: u64) -> Option<Slot> {
        let len = aligned_len(bytes.max(1));
        let &(flen, seg, off) = self.free_by_size.range((len, 0, 0)..).next()?;
        self.free_by_size.remove(&(flen, seg, off));
        let map = &mut self.free_by_offset[seg as usize];
        map.remove(&off);
        if flen > len {
            map.insert(off + len, flen - len);
            self.free_by_size.insert((flen - len, seg, off + len));
        }
        self.free_bytes -= len;
        Some(Slot {
            segment: seg,
            offset: off,
            len,
        })
    }

    /// Return an extent. Panics in debug builds on a double free or an extent
    /// that overlaps free space (a bookkeeping bug, never client input).
    pub fn free(&mut self, slot: Slot) {
        let seg = slot.segment;
        let map = &mut self.free_by_offset[seg as usize];
        let mut off = slot.offset;
        let mut len = slot.len;
        if let Some((&poff, &plen)) = map.range(..off).next_back() {
            debug_assert!(poff + plen <= off, "free overlaps previous free extent");
            if poff + plen == off {
                map.remove(&poff);
                self.free_by_size.remove(&(plen, seg, poff));
                off = poff;
                len += plen;
            }
        }
        if let Some((&noff, &nlen)) = map.range(off + len..).next() {
            debug_assert!(noff >= off + len);
            if noff == off + len {
                map.remove(&noff);
                self.free_by_size.remove(&(nlen, seg, noff));
                len += nlen;
            }
        }
        debug_assert!(!map.contains_key(&off), "double free");
        map.insert(off, len);
        self.free_by_size.insert((len, seg, off));
        self.free_bytes += slot.len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn alloc_and_coalesce() {
        let mut a = ArenaAllocator::new(&[4 * ALIGN, 2 * ALIGN]);
        assert_eq!(a.capacity(), 6 * ALIGN);
        // best fit chooses the smaller segment for a 2-page block
        let s2 = a.alloc(2 * ALIGN).expect("fits");
        assert_eq!(s2.segment, 1);
        let s1 = a.alloc(1).expect("fits");
        assert_eq!((s1.segment, s1.len), (0, ALIGN));
        let s3 = a.alloc(3 * ALIGN).expect("fits");
        assert_eq!(s3.segment, 0);
        assert!(a.alloc(1).is_none());
        a.free(s1);
        a.free(s3);
        assert_eq!(a.free_bytes(), 4 * ALIGN);
        // coalesced back to one 4-page extent
        let s4 = a.alloc(4 * ALIGN).expect("coalesced");
        assert_eq!((s4.segment, s4.offset), (0, 0));
    }

    proptest! {
        /// Against a model: allocated extents never overlap, stay in bounds,
        /// and free bytes always equal capacity minus live allocations.
        #[test]
        fn never_overlaps(ops in proptest::collection::vec((any::<bool>(), 1u64..5*ALIGN, any::<u16>()), 1..200)) {
            let sizes = [16 * ALIGN, 8 * ALIGN, 5 * ALIGN + 100];
            let mut a = ArenaAllocator::new(&sizes);
            let mut live: Vec<Slot> = Vec::new();
            for (do_alloc, bytes, pick) in ops {
                if do_alloc || live.is_empty() {
                    if let Some(s) = a.alloc(bytes) {
                        prop_assert!(s.len >= bytes && s.len % ALIGN == 0);
                        prop_assert!(s.offset + s.len <= sizes[s.segment as usize]);
                        for o in &live {
                            let disjoint = o.segment != s.segment || o.offset + o.len <= s.offset || s.offset + s.len <= o.offset;
                            prop_assert!(disjoint, "{:?} overlaps {:?}", s, o);
                        }
                        live.push(s);
                    } else {
                        // model: no single free run large enough => every segment lacks one
                        prop_assert!(a.free_bytes() < a.capacity());
                    }
                } else {
                    let s = live.swap_remove(pick as usize % live.len());
                    a.free(s);
                }
                let used: u64 = live.iter().map(|s| s.len).sum();
                prop_assert_eq!(a.free_bytes(), a.capacity() - used);
            }
            for s in live.drain(..) { a.free(s); }
            prop_assert_eq!(a.free_bytes(), a.capacity());
        }
    }
}
