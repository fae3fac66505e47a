//! Host copies of whole blocks through the mapped arena: `copy_out` (out of
//! an acquired lease), `save` (allocate, copy, commit: a [`SaveResult`]),
//! `restore` (lookup, acquire, copy, release), and how many threads one copy
//! uses ([`copy_threads`]).

use orbitkv_shm::Mapping;

use crate::{Client, ClientError, Hash, Namespace, SlotStatus};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SaveResult {
    pub stored: u32,
    pub already_present: u32,
    pub refused: u32,
    pub bytes_copied: u64,
}

impl Client {
    /// Copy blocks `[start, start + dst.len())` of an acquired lease into `dst`
    /// (each exactly `block_bytes` long).
    pub fn copy_out(
        &self,
        slots: &[(u32, u64)],
        block_bytes: u64,
        start: usize,
        dst: &mut [&mut [u8]],
    ) -> Result<u64, ClientError> {
        let end = start
            .checked_add(dst.len())
            .filter(|e| *e <= slots.len())
            .ok_or_else(|| {
                ClientError::Invalid(format!(
                    "blocks {start}..{} outside the {} leased",
                    start + dst.len(),
                    slots.len()
                ))
            })?;
        if let Some((i, d)) = dst
            .iter()
            .enumerate()
            .find(|(_, d)| d.len() as u64 != block_bytes)
        {
            return Err(ClientError::Size {
                what: format!("bytes of destination buffer {i} (one block)"),
                expected: block_bytes,
                actual: d.len() as u64,
            });
        }
        let _copying = self.copy_guard()?;
        let src = &slots[start..end];
        let maps: Vec<&Mapping> = src
            .iter()
            .map(|(seg, _)| self.segment(*seg))
            .collect::<Result<_, _>>()?;
        let threads = copy_threads(block_bytes as usize * dst.len());
        if threads == 1 {
            // Inline: a scoped thread per call cost more than copying 1 MiB.
            for ((d, (_, off)), m) in dst.iter_mut().zip(src).zip(&maps) {
                m.read_at(*off, d)?;
            }
            return Ok(block_bytes * dst.len() as u64);
        }
        let per = dst.len().div_ceil(threads).max(1);
        std::thread::scope(|scope| {
            let mut handles = Vec::new();
            for ((d, s), m) in dst.chunks_mut(per).zip(src.chunks(per)).zip(maps.chunks(per)) {
                handles.push(scope.spawn(move || -> Result<(), ClientError> {
                    for ((d, (_, off)), m) in d.iter_mut().zip(s).zip(m) {
                        m.read_at(*off, d)?;
                    }
                    Ok(())
                }));
            }
            handles
                .into_iter()
                .try_for_each(|h| h.join().unwrap_or(Err(ClientError::CopyPanicked)))
        })?;
        Ok(block_bytes * dst.len() as u64)
    }

    /// Allocate → copy → commit. A copy failure aborts the save (nothing
    /// becomes visible) and returns the error.
    pub fn save(&self, ns: &Namespace, hashes: &[Hash], src: &[&[u8]]) -> Result<SaveResult, ClientError> {
        check_block_buffers(
            "source",
            src.iter().map(|s| s.len()),
            hashes.len(),
            ns.block_bytes,
        )?;
        self.require_mapped()?;
        let save = self.start_save(ns, hashes)?;
        let mut res = SaveResult::default();
        let copied = (|| -> Result<(), ClientError> {
            let _copying = self.copy_guard()?;
            let mut work: Vec<(&Mapping, u64, &[u8])> = Vec::new();
            for (st, s) in save.items().iter().zip(src) {
                match st {
                    SlotStatus::Allocated { segment, offset } => {
                        work.push((self.slot_mapping(*segment, *offset, ns.block_bytes)?, *offset, s));
                        res.bytes_copied += s.len() as u64;
                    }
                    SlotStatus::Present => res.already_present += 1,
                    SlotStatus::Refused => res.refused += 1,
                }
            }
            let threads = copy_threads(res.bytes_copied as usize);
            if threads == 1 {
                // Inline: a scoped thread per call cost more than copying 1 MiB.
                return work
                    .iter()
                    .try_for_each(|(m, off, s)| m.write_at(*off, s))
                    .map_err(ClientError::from);
            }
            let per = work.len().div_ceil(threads).max(1);
            std::thread::scope(|scope| {
                let handles: Vec<_> = work
                    .chunks(per)
                    .map(|chunk| {
                        scope.spawn(move || chunk.iter().try_for_each(|(m, off, s)| m.write_at(*off, s)))
                    })
                    .collect();
                handles.into_iter().try_for_each(|h| match h.join() {
                    Ok(r) => r.map_err(ClientError::from),
                    Err(_) => Err(ClientError::CopyPanicked),
                })
            })
        })();
        // A copy error drops `save`, which aborts it: nothing becomes visible.
        copied?;
        res.stored = save.commit()?;
        Ok(res)
    }

    /// Lookup + acquire + copy + release in one call: restores the longest hit
    /// prefix of `hashes` into the first `hit` buffers of `dst`, which holds
    /// exactly one block-sized buffer per hash.
    pub fn restore(
        &self,
        ns: &Namespace,
        hashes: &[Hash],
        dst: &mut [&mut [u8]],
    ) -> Result<u32, ClientError> {
        self.require_mapped()?;
        check_block_buffers(
            "destination",
            dst.iter().map(|d| d.len()),
            hashes.len(),
            ns.block_bytes,
        )?;
        let mut lease = self.lease(ns, hashes)?;
        let n = lease.hit_blocks() as usize;
        if n == 0 {
            return Ok(0);
        }
        // On error `lease` drops and releases (unless the Manager retired it).
        lease.copy_out(ns.block_bytes, 0, &mut dst[..n])?;
        lease.release()?;
        Ok(n as u32)
    }
}

/// What `save` and `restore` ask of their buffers: one per hash, each one
/// block of `block_bytes` (`lens`: the buffers' lengths; `what` names them).
fn check_block_buffers(
    what: &str,
    lens: impl ExactSizeIterator<Item = usize>,
    hashes: usize,
    block_bytes: u64,
) -> Result<(), ClientError> {
    if lens.len() != hashes {
        return Err(ClientError::Size {
            what: format!("{what} buffers (one per hash)"),
            expected: hashes as u64,
            actual: lens.len() as u64,
        });
    }
    if let Some((i, len)) = lens.enumerate().find(|(_, len)| *len as u64 != block_bytes) {
        return Err(ClientError::Size {
            what: format!("bytes of {what} buffer {i} (one block)"),
            expected: block_bytes,
            actual: len as u64,
        });
    }
    Ok(())
}

/// Threads [`Client::copy_out`] uses for one copy of `bytes`: one below 8 MiB
/// (spawning costs more than it saves), else `ORBITKV_COPY_THREADS` or
/// min(4, available cores).
pub fn copy_threads(bytes: usize) -> usize {
    if bytes < (8 << 20) {
        return 1;
    }
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("ORBITKV_COPY_THREADS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|n| (1..=64).contains(n))
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get().min(4)))
    })
}
