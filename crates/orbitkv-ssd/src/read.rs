//! The read path: pin extents, one submission for the batch, verify header and payload
//! checksum of every block before its bytes count as read, drop what fails.

use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering::Relaxed;

use crate::error::{Result, SsdError};
use crate::format::{BlockHeader, DecodeError, HEADER_SIZE, checksum, round_up};
use crate::index::Entry;
use crate::key::SsdKey;
use crate::tier::{SsdTier, is_aligned};
use crate::uring::{AlignedBuf, Bufs, Done, IoReq};

/// One pinned block of a batch.
struct Plan {
    item: usize,
    e: Entry,
    io_len: usize,
    into_dest: bool,
}

type Items<'a, 'b> = &'a mut [(SsdKey, &'b mut [u8])];

fn corrupt(off: u64, reason: impl Into<String>) -> SsdError {
    SsdError::Corrupt {
        offset: off,
        reason: reason.into(),
    }
}

impl SsdTier {
    /// Read many blocks into the given buffers, submitted together. Each buffer must be at
    /// least as long as the stored block; `Ok(n)` gives the block length. Bytes of the buffer
    /// past `n` (up to the next 4 KiB) may be overwritten. On `Err` the buffer holds no
    /// data (it is zeroed if it was written to). `Corrupt` drops the block from the index.
    pub fn read_batch(&self, items: Items<'_, '_>) -> Vec<Result<usize>> {
        let mut out: Vec<Result<usize>> = (0..items.len()).map(|_| Ok(0)).collect();
        let plans = self.plan_reads(items, &mut out);
        if plans.is_empty() {
            return out;
        }
        let (mut hdrs, mut bounce) = match read_buffers(&plans) {
            Ok(x) => x,
            Err(e) => {
                let mut st = self.lock();
                for p in &plans {
                    st.unpin(p.e.off);
                    out[p.item] = Err(SsdError::io(
                        "allocating read buffers",
                        io::Error::new(e.kind(), e.to_string()),
                    ));
                }
                return out;
            }
        };
        let results = self.submit_reads(items, &plans, &mut hdrs, &mut bounce);
        let mut dropped: Vec<(SsdKey, Entry)> = Vec::new();
        for ((p, h), (res, b)) in plans
            .iter()
            .zip(hdrs.as_slice().chunks(HEADER_SIZE))
            .zip(results.into_iter().zip(bounce.iter()))
        {
            let (key, dest) = &mut items[p.item];
            let bytes: &[u8] = match b {
                Some(b) => b.as_slice(),
                None => &dest[..],
            };
            match self.verify(p, *key, h, res, bytes) {
                Ok(()) => {
                    if let Some(b) = b {
                        dest[..p.e.len as usize].copy_from_slice(&b.as_slice()[..p.e.len as usize]);
                    }
                    self.counters.bytes_read.fetch_add(p.e.len, Relaxed);
                    self.counters.blocks_read.fetch_add(1, Relaxed);
                    out[p.item] = Ok(p.e.len as usize);
                }
                Err(err) => {
                    if b.is_none() {
                        let n = p.io_len.min(dest.len());
                        dest[..n].fill(0);
                    }
                    if matches!(err, SsdError::Corrupt { .. }) {
                        dropped.push((*key, p.e));
                    }
                    out[p.item] = Err(err);
                }
            }
        }
        self.finish_reads(&plans, dropped);
        out
    }

    /// Look keys up and pin their extents, under the lock. Misses are answered in `out`.
    fn plan_reads(&self, items: &[(SsdKey, &mut [u8])], out: &mut [Result<usize>]) -> Vec<Plan> {
        let direct = self.cfg.mode == crate::IoMode::Direct;
        let mut plans: Vec<Plan> = Vec::with_capacity(items.len());
        let mut st = self.lock();
        for (i, (key, dest)) in items.iter().enumerate() {
            let Some(e) = st.index.get(key).copied() else {
                self.counters.misses.fetch_add(1, Relaxed);
                out[i] = Err(SsdError::NotFound);
                continue;
            };
            if (dest.len() as u64) < e.len {
                out[i] = Err(SsdError::BufferTooSmall {
                    needed: e.len,
                    got: dest.len() as u64,
                });
                continue;
            }
            let (io_len, into_dest) = if direct {
                let r = round_up(e.len) as usize;
                (r, is_aligned(dest.as_ptr()) && dest.len() >= r)
            } else {
                (e.len as usize, true)
            };
            *st.pins.entry(e.off).or_insert(0) += 1;
            st.touch(key);
            plans.push(Plan {
                item: i,
                e,
                io_len,
                into_dest,
            });
        }
        plans
    }

    fn submit_reads(
        &self,
        items: Items<'_, '_>,
        plans: &[Plan],
        hdrs: &mut AlignedBuf,
        bounce: &mut [Option<AlignedBuf>],
    ) -> Vec<io::Result<Done>> {
        let mut dests: Vec<Option<&mut [u8]>> = items.iter_mut().map(|(_, d)| Some(&mut **d)).collect();
        let mut reqs: Vec<IoReq<'_>> = Vec::with_capacity(plans.len());
        for ((p, h), b) in plans
            .iter()
            .zip(hdrs.as_mut_slice().chunks_mut(HEADER_SIZE))
            .zip(bounce.iter_mut())
        {
            let payload: &mut [u8] = match b {
                Some(b) => &mut b.as_mut_slice()[..p.io_len],
                None => match dests[p.item].take() {
                    Some(d) => &mut d[..p.io_len],
                    None => &mut [],
                },
            };
            reqs.push(IoReq {
                fd: self.data.as_fd(),
                offset: p.e.off,
                bufs: Bufs::Read(h, payload),
                hash_len: p.e.len as usize,
            });
        }
        self.engine.submit(&mut reqs)
    }

    /// Check one block: whole read, header decodes and names this key, length and sequence
    /// agree with the index, payload checksum matches. Counts each kind of failure.
    fn verify(&self, p: &Plan, key: SsdKey, h: &[u8], res: io::Result<Done>, payload: &[u8]) -> Result<()> {
        let c = &self.counters;
        let d = match res {
            Err(e) => {
                c.read_errors.fetch_add(1, Relaxed);
                return Err(SsdError::io("reading block", e));
            }
            Ok(d) if d.bytes != HEADER_SIZE + p.io_len => {
                c.header_failures.fetch_add(1, Relaxed);
                let reason = format!("short read ({} bytes): data file truncated", d.bytes);
                return Err(corrupt(p.e.off, reason));
            }
            Ok(d) => d,
        };
        // The I/O thread checksummed the payload as it landed; recompute only if it could
        // not (zero-length payloads).
        let sum = d.hash.unwrap_or_else(|| checksum(&payload[..p.e.len as usize]));
        let header_fail = |reason: String| {
            c.header_failures.fetch_add(1, Relaxed);
            Err(corrupt(p.e.off, reason))
        };
        match BlockHeader::decode(h) {
            Err(DecodeError::Version(v)) => header_fail(format!("block of format version {v}")),
            Err(e) => header_fail(format!("bad header: {e:?}")),
            Ok(bh) if bh.key != key => header_fail("header key does not match the requested key".into()),
            Ok(bh) if bh.len != p.e.len || bh.seq != p.e.seq => {
                header_fail("header length/sequence disagree with the index".into())
            }
            Ok(bh) if sum != bh.payload_sum || bh.payload_sum != p.e.sum => {
                c.checksum_failures.fetch_add(1, Relaxed);
                Err(corrupt(p.e.off, "payload checksum mismatch"))
            }
            Ok(_) => Ok(()),
        }
    }

    /// Unpin the batch's extents and drop the blocks that failed verification (if the
    /// index still points at the extent that was read), journaling their removal.
    fn finish_reads(&self, plans: &[Plan], dropped: Vec<(SsdKey, Entry)>) {
        let mut st = self.lock();
        for p in plans {
            st.unpin(p.e.off);
        }
        let mut recs = Vec::new();
        for (key, e) in dropped {
            if st
                .index
                .get(&key)
                .is_some_and(|cur| cur.off == e.off && cur.seq == e.seq)
            {
                st.drop_entry(&key);
                let r = st.remove_record(key);
                recs.push(r);
            }
        }
        if !recs.is_empty() {
            // A lost remove record is harmless: the header check drops the block again.
            let _ = st.journal.append(&recs);
        }
    }
}

/// Header sectors for the batch and, for payloads that cannot land in place, bounce buffers.
fn read_buffers(plans: &[Plan]) -> io::Result<(AlignedBuf, Vec<Option<AlignedBuf>>)> {
    let h = AlignedBuf::zeroed(HEADER_SIZE * plans.len())?;
    let mut b = Vec::with_capacity(plans.len());
    for p in plans {
        b.push(if p.into_dest || p.io_len == 0 {
            None
        } else {
            Some(AlignedBuf::zeroed(p.io_len)?)
        });
    }
    Ok((h, b))
}
