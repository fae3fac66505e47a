//! Header verification after open ([`crate::RecoveryVerify::Background`]): the tier serves
//! from the journal at once while a thread reads every recovered block's header sector, in
//! offset order and in batches, and drops the blocks whose header disagrees with the
//! journal. Until then a read of such a block fails its own header and checksum check
//! (every read verifies before returning bytes), so a torn block is never served either way.

use std::fs::File;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::format::{HEADER_SIZE, JournalRecord};
use crate::header::{HeaderVerdict, header_verdict};
use crate::key::SsdKey;
use crate::state::State;
use crate::uring::{AlignedBuf, Bufs, Engine, IoReq};

/// Header reads per batch.
const CHUNK: usize = 1024;

/// Progress of the background header check.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeaderCheck {
    /// Blocks to check (0 when the tier was opened in another mode or recovered nothing).
    pub total: u64,
    /// Blocks checked so far.
    pub checked: u64,
    /// Blocks dropped because their header disagreed with the journal or was unreadable.
    pub dropped: u64,
    /// True once the check has finished (or was stopped by dropping the tier).
    pub finished: bool,
}

#[derive(Default)]
pub(crate) struct Status {
    total: AtomicU64,
    checked: AtomicU64,
    dropped: AtomicU64,
    finished: AtomicBool,
    stop: AtomicBool,
    /// Keys dropped and not yet taken by [`Background::take_dropped`].
    dropped_keys: Mutex<Vec<SsdKey>>,
}

/// The running check, owned by the tier.
pub(crate) struct Background {
    status: Arc<Status>,
    handle: Mutex<Option<JoinHandle<()>>>,
}

impl Background {
    /// Nothing to check.
    pub(crate) fn none() -> Background {
        let status = Status::default();
        status.finished.store(true, Relaxed);
        Background {
            status: Arc::new(status),
            handle: Mutex::new(None),
        }
    }

    /// Start checking `recs` (the placed journal records).
    pub(crate) fn start(
        mut recs: Vec<JournalRecord>,
        data: File,
        engine: Arc<Engine>,
        state: Arc<Mutex<State>>,
    ) -> std::io::Result<Background> {
        if recs.is_empty() {
            return Ok(Background::none());
        }
        let status = Arc::new(Status::default());
        status.total.store(recs.len() as u64, Relaxed);
        let st = Arc::clone(&status);
        let handle = std::thread::Builder::new()
            .name("orbitkv-ssd-verify".into())
            .spawn(move || {
                // On this thread: sorting 2 M records takes ~0.5 s, not open's business.
                recs.sort_unstable_by_key(|r| r.offset);
                run(&recs, &data, &engine, &state, &st);
                st.finished.store(true, Relaxed);
            })?;
        Ok(Background {
            status,
            handle: Mutex::new(Some(handle)),
        })
    }

    pub(crate) fn progress(&self) -> HeaderCheck {
        let s = &self.status;
        HeaderCheck {
            total: s.total.load(Relaxed),
            checked: s.checked.load(Relaxed),
            dropped: s.dropped.load(Relaxed),
            finished: s.finished.load(Relaxed),
        }
    }

    /// Keys the check has dropped since the last call: a cache above the tier forgets
    /// them (the tier already has).
    pub(crate) fn take_dropped(&self) -> Vec<SsdKey> {
        std::mem::take(&mut *self.status.dropped_keys.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Wait for the check to finish.
    pub(crate) fn wait(&self) {
        let h = self.handle.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = h {
            let _ = h.join();
        }
    }

    /// Stop early and wait for the thread (the tier is being dropped).
    pub(crate) fn stop(&self) {
        self.status.stop.store(true, Relaxed);
        self.wait();
    }
}

fn run(recs: &[JournalRecord], data: &File, engine: &Engine, state: &Mutex<State>, st: &Status) {
    let Ok(mut hdrs) = AlignedBuf::zeroed(HEADER_SIZE * CHUNK.min(recs.len())) else {
        return; // no memory for buffers: reads still verify every block
    };
    for chunk in recs.chunks(CHUNK) {
        if st.stop.load(Relaxed) {
            return;
        }
        let results = {
            let mut reqs: Vec<IoReq<'_>> = chunk
                .iter()
                .zip(hdrs.as_mut_slice().chunks_mut(HEADER_SIZE))
                .map(|(r, h)| IoReq {
                    fd: data.as_fd(),
                    offset: r.offset,
                    bufs: Bufs::Read(h, &mut []),
                    hash_len: 0,
                })
                .collect();
            engine.submit(&mut reqs)
        };
        let mut bad: Vec<&JournalRecord> = Vec::new();
        for ((r, h), res) in chunk.iter().zip(hdrs.as_slice().chunks(HEADER_SIZE)).zip(results) {
            if !matches!(header_verdict(r, h, res), HeaderVerdict::Keep) {
                bad.push(r);
            }
        }
        st.checked.fetch_add(chunk.len() as u64, Relaxed);
        if bad.is_empty() {
            continue;
        }
        let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
        let mut removes = Vec::new();
        for r in bad {
            // Drop only if the index still names this very write: a block rewritten or
            // removed since open is not this record's business any more (and its old
            // extent may already hold other bytes).
            if s.index
                .get(&r.key)
                .is_some_and(|e| e.off == r.offset && e.seq == r.seq)
            {
                s.drop_entry(&r.key);
                removes.push(s.remove_record(r.key));
                st.dropped.fetch_add(1, Relaxed);
            }
        }
        st.dropped_keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(removes.iter().map(|r| r.key));
        // A lost remove record is harmless: the check drops the block again at the next open.
        let _ = s.journal.append(&removes);
    }
}
