//! Slot-addressed copies between an engine's KV pages and arena slots.
//!
//! One interface, [`SlotCopier`]: `gather` copies the pages of engine blocks
//! into arena slots (a save), `scatter` copies arena slots into the pages of
//! engine blocks (a load). The geometry is a [`PageLayout`]: per layer, where
//! block `b`'s page starts and how its bytes are strided. A cached block is
//! the concatenation, over the layout's pages in order, of each page in its
//! physical byte order when the page is one dense run, else in logical
//! `[d0, d1, d2, d3]` order. The host implementation ([`Client`]) checks every
//! arena range against its mapping and runs under the client's copy lock, so
//! `close` waits for it; the GPU copy engine is to implement the same trait
//! over device memory.

use orbitkv_shm::Mapping;

use crate::{Client, ClientError};

/// Where one layer's page of block `b` lives: it starts at byte
/// `base + b * block_stride` of the engine region and has `shape` (4 dims)
/// with byte `strides`; the innermost dim must have stride 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageSpec {
    pub base: u64,
    pub block_stride: u64,
    pub shape: [u64; 4],
    pub strides: [u64; 4],
}

#[derive(Debug, Clone)]
struct Page {
    spec: PageSpec,
    dense: bool,
    bytes: u64,
}

/// The validated block geometry of one engine region: every page of every
/// block lies inside `region_bytes`.
#[derive(Debug, Clone)]
pub struct PageLayout {
    pages: Vec<Page>,
    num_blocks: u32,
    block_bytes: u64,
    region_bytes: u64,
}

fn invalid(msg: String) -> ClientError {
    ClientError::Invalid(msg)
}

impl PageLayout {
    pub fn new(specs: &[PageSpec], num_blocks: u32, region_bytes: u64) -> Result<PageLayout, ClientError> {
        if specs.is_empty() {
            return Err(invalid("a page layout needs at least one page".into()));
        }
        if num_blocks == 0 {
            return Err(invalid("a page layout needs at least one block".into()));
        }
        let overflow = || invalid("page layout arithmetic overflows u64".into());
        let mut pages = Vec::with_capacity(specs.len());
        let mut block_bytes = 0u64;
        for (i, s) in specs.iter().enumerate() {
            if s.shape.contains(&0) {
                return Err(invalid(format!("page {i}: shape {:?} has an empty dim", s.shape)));
            }
            if s.strides[3] != 1 {
                return Err(invalid(format!(
                    "page {i}: the innermost dim has stride {}, expected 1",
                    s.strides[3]
                )));
            }
            let bytes = s
                .shape
                .iter()
                .try_fold(1u64, |a, n| a.checked_mul(*n))
                .ok_or_else(overflow)?;
            // Highest byte offset inside one page, plus one.
            let reach = s
                .shape
                .iter()
                .zip(&s.strides)
                .try_fold(1u64, |a, (n, st)| {
                    (n - 1).checked_mul(*st).and_then(|x| a.checked_add(x))
                })
                .ok_or_else(overflow)?;
            let end = u64::from(num_blocks - 1)
                .checked_mul(s.block_stride)
                .and_then(|x| x.checked_add(s.base))
                .and_then(|x| x.checked_add(reach))
                .ok_or_else(overflow)?;
            if end > region_bytes {
                return Err(invalid(format!(
                    "page {i}: block {} reaches byte {end}, past the {region_bytes}-byte engine region",
                    num_blocks - 1
                )));
            }
            // Dense when the dims of size > 1, sorted by stride, tile one run.
            let mut dims: Vec<(u64, u64)> = s
                .strides
                .iter()
                .zip(&s.shape)
                .filter(|(_, n)| **n > 1)
                .map(|(st, n)| (*st, *n))
                .collect();
            dims.sort_unstable();
            let mut expected = 1u64;
            let mut dense = true;
            for (st, n) in dims {
                if st != expected {
                    dense = false;
                    break;
                }
                expected = expected.saturating_mul(n);
            }
            block_bytes = block_bytes.checked_add(bytes).ok_or_else(overflow)?;
            pages.push(Page {
                spec: *s,
                dense,
                bytes,
            });
        }
        Ok(PageLayout {
            pages,
            num_blocks,
            block_bytes,
            region_bytes,
        })
    }

    /// Bytes of one cached block (the sum of its pages).
    pub fn block_bytes(&self) -> u64 {
        self.block_bytes
    }

    pub fn num_blocks(&self) -> u32 {
        self.num_blocks
    }

    pub fn region_bytes(&self) -> u64 {
        self.region_bytes
    }

    /// Visit the runs of `block`: `(engine offset, offset in the cached block,
    /// len)`, covering the block exactly once, in cached-block order.
    fn runs(
        &self,
        block: u32,
        f: &mut dyn FnMut(u64, u64, usize) -> Result<(), ClientError>,
    ) -> Result<(), ClientError> {
        // Bounds were proven for every block < num_blocks in `new`: no overflow.
        let mut off = 0u64;
        for p in &self.pages {
            let s = &p.spec;
            let start = s.base + u64::from(block) * s.block_stride;
            if p.dense {
                f(start, off, p.bytes as usize)?;
            } else {
                let run = s.shape[3] as usize;
                let mut o = off;
                for a in 0..s.shape[0] {
                    for b in 0..s.shape[1] {
                        for c in 0..s.shape[2] {
                            let at = start + a * s.strides[0] + b * s.strides[1] + c * s.strides[2];
                            f(at, o, run)?;
                            o += run as u64;
                        }
                    }
                }
            }
            off += p.bytes;
        }
        Ok(())
    }

    fn check_blocks(&self, blocks: &[u32], slots: usize, region: u64) -> Result<(), ClientError> {
        if blocks.len() != slots {
            return Err(ClientError::Size {
                what: "engine blocks for the arena slots".into(),
                expected: slots as u64,
                actual: blocks.len() as u64,
            });
        }
        if region != self.region_bytes {
            return Err(ClientError::Size {
                what: "engine region bytes (as the page layout was built for)".into(),
                expected: self.region_bytes,
                actual: region,
            });
        }
        if let Some(b) = blocks.iter().find(|b| **b >= self.num_blocks) {
            return Err(invalid(format!("block id {b} outside [0, {})", self.num_blocks)));
        }
        Ok(())
    }
}

/// What [`EngineMemory::with_run`] lends a run to.
pub type ReadRun<'a> = &'a mut dyn FnMut(&[u8]) -> Result<(), ClientError>;
/// What [`EngineMemory::with_run_mut`] lends a run to.
pub type WriteRun<'a> = &'a mut dyn FnMut(&mut [u8]) -> Result<(), ClientError>;

/// Engine memory a host copy reads or writes, accessed one bounded run at a
/// time (so an implementation over foreign memory only ever lends out the
/// bytes being copied).
pub trait EngineMemory {
    /// Size of the region in bytes.
    fn region_len(&self) -> u64;
    /// Lend `[offset, offset + len)` for reading.
    fn with_run(&self, offset: u64, len: usize, f: ReadRun<'_>) -> Result<(), ClientError>;
    /// Lend `[offset, offset + len)` for writing.
    fn with_run_mut(&mut self, offset: u64, len: usize, f: WriteRun<'_>) -> Result<(), ClientError>;
}

fn run_range(offset: u64, len: usize, size: usize) -> Result<std::ops::Range<usize>, ClientError> {
    usize::try_from(offset)
        .ok()
        .and_then(|o| o.checked_add(len).filter(|e| *e <= size).map(|e| o..e))
        .ok_or_else(|| {
            invalid(format!(
                "run [{offset}, +{len}) outside the {size}-byte engine region"
            ))
        })
}

impl EngineMemory for [u8] {
    fn region_len(&self) -> u64 {
        self.len() as u64
    }
    fn with_run(&self, offset: u64, len: usize, f: ReadRun<'_>) -> Result<(), ClientError> {
        f(&self[run_range(offset, len, self.len())?])
    }
    fn with_run_mut(&mut self, offset: u64, len: usize, f: WriteRun<'_>) -> Result<(), ClientError> {
        let r = run_range(offset, len, self.len())?;
        f(&mut self[r])
    }
}

/// Slot-addressed gather/scatter between engine pages and arena slots.
pub trait SlotCopier<M: ?Sized> {
    /// Copy the pages of `blocks[i]` into arena slot `slots[i]` (a save's
    /// allocated slots). Returns the bytes copied.
    fn gather(
        &self,
        layout: &PageLayout,
        pages: &M,
        blocks: &[u32],
        slots: &[(u32, u64)],
    ) -> Result<u64, ClientError>;
    /// Copy arena slot `slots[i]` into the pages of `blocks[i]` (an acquired
    /// lease's slots). Returns the bytes copied.
    fn scatter(
        &self,
        layout: &PageLayout,
        slots: &[(u32, u64)],
        pages: &mut M,
        blocks: &[u32],
    ) -> Result<u64, ClientError>;
}

impl Client {
    /// What `gather` and `scatter` share: check the blocks against the slots
    /// and the `region`-byte engine region, then, under the copy lock, call
    /// `copy(slot mapping, run offset in the region, byte position in the
    /// mapping, run length)` for every run of every block, in order. Returns
    /// the bytes copied.
    fn copy_slot_runs(
        &self,
        layout: &PageLayout,
        region: u64,
        blocks: &[u32],
        slots: &[(u32, u64)],
        mut copy: impl FnMut(&Mapping, u64, u64, usize) -> Result<(), ClientError>,
    ) -> Result<u64, ClientError> {
        layout.check_blocks(blocks, slots.len(), region)?;
        self.require_mapped()?;
        let _copying = self.copy_guard()?;
        for (b, (seg, slot)) in blocks.iter().zip(slots) {
            let m = self.slot_mapping(*seg, *slot, layout.block_bytes)?;
            layout.runs(*b, &mut |at, off, len| copy(m, at, slot + off, len))?;
        }
        Ok(layout.block_bytes * blocks.len() as u64)
    }
}

impl<M: EngineMemory + ?Sized> SlotCopier<M> for Client {
    fn gather(
        &self,
        layout: &PageLayout,
        pages: &M,
        blocks: &[u32],
        slots: &[(u32, u64)],
    ) -> Result<u64, ClientError> {
        let region = pages.region_len();
        self.copy_slot_runs(layout, region, blocks, slots, |m, at, pos, len| {
            pages.with_run(at, len, &mut |src| Ok(m.write_at(pos, src)?))
        })
    }

    fn scatter(
        &self,
        layout: &PageLayout,
        slots: &[(u32, u64)],
        pages: &mut M,
        blocks: &[u32],
    ) -> Result<u64, ClientError> {
        let region = pages.region_len();
        self.copy_slot_runs(layout, region, blocks, slots, |m, at, pos, len| {
            pages.with_run_mut(at, len, &mut |dst| Ok(m.read_at(pos, dst)?))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strided_pages_are_visited_in_logical_order_and_bounded() {
        // One dense page of 8 bytes, one [1, 2, 2, 2] page with H/N swapped.
        let specs = [
            PageSpec {
                base: 0,
                block_stride: 8,
                shape: [1, 1, 4, 2],
                strides: [8, 8, 2, 1],
            },
            PageSpec {
                base: 16,
                block_stride: 8,
                shape: [1, 2, 2, 2],
                strides: [8, 2, 4, 1],
            },
        ];
        let l = PageLayout::new(&specs, 2, 32).expect("layout");
        assert_eq!(l.block_bytes(), 16);
        let mut seen = Vec::new();
        l.runs(1, &mut |at, off, len| {
            seen.push((at, off, len));
            Ok(())
        })
        .expect("runs");
        // Page 2 is dense too (strides 1, 2, 4 tile 8 bytes): one run each.
        assert_eq!(seen, vec![(8, 0, 8), (24, 8, 8)]);
        let gap = PageSpec {
            base: 0,
            block_stride: 16,
            shape: [1, 2, 2, 2],
            strides: [16, 8, 2, 1],
        };
        let l = PageLayout::new(&[gap], 1, 16).expect("layout");
        let mut seen = Vec::new();
        l.runs(0, &mut |at, off, len| {
            seen.push((at, off, len));
            Ok(())
        })
        .expect("runs");
        assert_eq!(seen, vec![(0, 0, 2), (2, 2, 2), (8, 4, 2), (10, 6, 2)]);
        assert!(PageLayout::new(&[gap], 2, 28).is_ok());
        assert!(PageLayout::new(&[gap], 2, 27).is_err(), "block 1 reaches byte 28");
    }
}
