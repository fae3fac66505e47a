//! The write path: allocate extents, encode headers, one submission for the batch,
//! fdatasync the data file, then one journal append and the index update.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use crate::error::{Result, SsdError};
use crate::format::{
    BlockHeader, FORMAT_VERSION, HEADER_SIZE, JournalRecord, SECTOR, checksum, extent_bytes, round_up,
};
use crate::index::Entry;
use crate::key::SsdKey;
use crate::tier::{SsdTier, is_aligned};
use crate::uring::{ALIGN, AlignedBuf, Bufs, IoReq};

/// One block of a batch that got an extent.
struct Plan {
    item: usize,
    off: u64,
    seq: u64,
    sum: u64,
    io_len: usize,
}

type Items<'a, 'b> = &'a [(SsdKey, &'b [u8])];

fn io_copy(e: &io::Error) -> io::Error {
    io::Error::new(e.kind(), e.to_string())
}

impl SsdTier {
    /// Write many blocks, submitted together. Result `i` belongs to item `i`. A key that is
    /// already present is replaced. `Full` means no free extent is large enough.
    pub fn write_batch(&self, items: Items<'_, '_>) -> Vec<Result<()>> {
        let mut out: Vec<Result<()>> = (0..items.len()).map(|_| Ok(())).collect();
        let mut plans = self.plan_writes(items, &mut out);
        if plans.is_empty() {
            return out;
        }
        let (hdrs, bounce) = match self.encode_writes(items, &mut plans) {
            Ok(x) => x,
            Err(e) => {
                let mut st = self.lock();
                for p in &plans {
                    st.alloc.free(
                        p.off / SECTOR,
                        extent_bytes(items[p.item].1.len() as u64) / SECTOR,
                    );
                    out[p.item] = Err(SsdError::io("allocating write buffers", io_copy(&e)));
                }
                return out;
            }
        };
        let mut ok = self.submit_writes(items, &plans, &hdrs, &bounce, &mut out);
        drop(bounce);
        if self.cfg.sync
            && ok.iter().any(|&b| b)
            && let Err(e) = rustix::fs::fdatasync(&self.data)
        {
            let e: io::Error = e.into();
            fail_ok(&plans, &mut ok, &mut out, "fdatasync data file", &e);
        }
        let journal_file = self.commit_writes(items, &plans, &mut ok, &mut out);
        if self.cfg.sync && ok.iter().any(|&b| b) && rustix::fs::fdatasync(&*journal_file).is_err() {
            self.counters.journal_sync_errors.fetch_add(1, Relaxed);
        }
        out
    }

    /// Allocate an extent per item, under the lock. Items that get none are answered in `out`.
    fn plan_writes(&self, items: Items<'_, '_>, out: &mut [Result<()>]) -> Vec<Plan> {
        let direct = self.cfg.mode == crate::IoMode::Direct;
        let mut plans: Vec<Plan> = Vec::with_capacity(items.len());
        let mut st = self.lock();
        for (i, (_, data)) in items.iter().enumerate() {
            let len = data.len() as u64;
            let ext = extent_bytes(len);
            if ext > self.capacity {
                out[i] = Err(SsdError::TooLarge {
                    len,
                    capacity: self.capacity,
                });
                continue;
            }
            let Some(u) = st.alloc.alloc(ext / SECTOR) else {
                self.counters.full_rejections.fetch_add(1, Relaxed);
                out[i] = Err(SsdError::Full {
                    needed: ext,
                    free: st.alloc.free_units() * SECTOR,
                    largest: st.alloc.largest_free() * SECTOR,
                });
                continue;
            };
            st.seq += 1;
            plans.push(Plan {
                item: i,
                off: u * SECTOR,
                seq: st.seq,
                sum: 0,
                io_len: if direct {
                    round_up(len) as usize
                } else {
                    data.len()
                },
            });
        }
        plans
    }

    /// Checksum payloads, encode their headers and, in direct mode, copy unaligned
    /// payloads into aligned bounce buffers.
    fn encode_writes(
        &self,
        items: Items<'_, '_>,
        plans: &mut [Plan],
    ) -> io::Result<(AlignedBuf, Vec<Option<AlignedBuf>>)> {
        let direct = self.cfg.mode == crate::IoMode::Direct;
        let mut hdrs = AlignedBuf::zeroed(HEADER_SIZE * plans.len())?;
        let mut bounce: Vec<Option<AlignedBuf>> = Vec::with_capacity(plans.len());
        for (p, h) in plans.iter_mut().zip(hdrs.as_mut_slice().chunks_mut(HEADER_SIZE)) {
            let (key, data) = items[p.item];
            p.sum = checksum(data);
            BlockHeader {
                version: FORMAT_VERSION,
                seq: p.seq,
                key,
                len: data.len() as u64,
                payload_sum: p.sum,
            }
            .encode(h);
            let needs_bounce = direct
                && !data.is_empty()
                && !(is_aligned(data.as_ptr()) && data.len().is_multiple_of(ALIGN));
            if needs_bounce {
                let mut b = AlignedBuf::zeroed(data.len())?;
                b.as_mut_slice()[..data.len()].copy_from_slice(data);
                bounce.push(Some(b));
            } else {
                bounce.push(None);
            }
        }
        Ok((hdrs, bounce))
    }

    /// One submission for the batch; true per plan whose header and payload were written whole.
    fn submit_writes(
        &self,
        items: Items<'_, '_>,
        plans: &[Plan],
        hdrs: &AlignedBuf,
        bounce: &[Option<AlignedBuf>],
        out: &mut [Result<()>],
    ) -> Vec<bool> {
        let results = {
            let mut reqs: Vec<IoReq<'_>> = plans
                .iter()
                .zip(hdrs.as_slice().chunks(HEADER_SIZE))
                .zip(bounce)
                .map(|((p, h), b)| {
                    let payload: &[u8] = match b {
                        Some(b) => &b.as_slice()[..p.io_len],
                        None => &items[p.item].1[..p.io_len],
                    };
                    IoReq {
                        fd: self.data.as_fd(),
                        offset: p.off,
                        bufs: Bufs::Write(h, payload),
                        hash_len: 0,
                    }
                })
                .collect();
            self.engine.submit(&mut reqs)
        };
        let mut ok: Vec<bool> = vec![false; plans.len()];
        for (j, (p, r)) in plans.iter().zip(results).enumerate() {
            match r {
                Ok(d) if d.bytes == HEADER_SIZE + p.io_len => ok[j] = true,
                Ok(d) => {
                    let n = d.bytes;
                    out[p.item] = Err(SsdError::io(
                        "writing block",
                        io::Error::new(io::ErrorKind::WriteZero, format!("short write of {n} bytes")),
                    ))
                }
                Err(e) => out[p.item] = Err(SsdError::io("writing block", e)),
            }
        }
        ok
    }

    /// Journal the written blocks with one append and index them; free the extents of the
    /// others. Returns the journal file for the fdatasync outside the lock.
    fn commit_writes(
        &self,
        items: Items<'_, '_>,
        plans: &[Plan],
        ok: &mut [bool],
        out: &mut [Result<()>],
    ) -> Arc<File> {
        let mut st = self.lock();
        let entry = |p: &Plan| Entry {
            off: p.off,
            len: items[p.item].1.len() as u64,
            seq: p.seq,
            sum: p.sum,
            tick: 0,
        };
        let recs: Vec<JournalRecord> = plans
            .iter()
            .zip(ok.iter())
            .filter(|(_, o)| **o)
            .map(|(p, _)| entry(p).put_record(items[p.item].0))
            .collect();
        if let Err(e) = st.journal.append(&recs) {
            fail_ok(plans, ok, out, "appending journal", &e);
        }
        for (j, p) in plans.iter().enumerate() {
            let e = entry(p);
            if ok[j] {
                let key = items[p.item].0;
                st.drop_entry(&key);
                st.insert_entry(key, e);
                self.counters.bytes_written.fetch_add(e.len, Relaxed);
                self.counters.blocks_written.fetch_add(1, Relaxed);
            } else {
                st.alloc.free(p.off / SECTOR, e.units());
                self.counters.write_errors.fetch_add(1, Relaxed);
            }
        }
        self.maybe_compact(&mut st);
        st.journal.handle()
    }
}

/// Turn every still-successful plan into an error with `context`.
fn fail_ok(plans: &[Plan], ok: &mut [bool], out: &mut [Result<()>], context: &str, e: &io::Error) {
    for (j, p) in plans.iter().enumerate() {
        if ok[j] {
            ok[j] = false;
            out[p.item] = Err(SsdError::io(context, io_copy(e)));
        }
    }
}
