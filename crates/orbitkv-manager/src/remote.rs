//! The remote tier: blocks shared with every Manager through a Redis Cluster
//! (`orbitkv_remote::store`).
//!
//! - **Writes:** a client's committed save is queued here (its namespace and
//!   hashes, [`RemoteTier::queue_committed`], bounded: beyond `--remote-write-queue`
//!   blocks new ones are dropped and counted, never waited for); one writer
//!   thread ([`writer`]) pins each batch under a Manager-internal session's
//!   lease, copies the blocks out of their slots and writes them.
//! - **Reads:** a lookup's missing suffix (after DRAM, SSD and peers) is read in
//!   pipelined groups of at most 8 MiB of blocks until the first miss
//!   ([`RemoteTier::fill`]; the blocks of a group after a miss are read but not
//!   stored), each verified block written into a Manager-internal save,
//!   committed in batches of 16 and pinned (`tier::FillPins`) until the lookup,
//!   which then runs again as after a peer fill, holds them.
//!
//! Every block in the store carries its full key and checksums
//! (`orbitkv_remote::value`): anything else reads as a miss. A store that does
//! not answer opens the store's circuit breaker, so a lookup then costs no
//! request until it is probed again.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use orbitkv_core::{BlockHash, BlockKey, NsId, SaveStatus, TierKey};
use orbitkv_remote::store::{Hit, RemoteError, RemoteStore, StoreStats};

use crate::latency::Histogram;
use crate::parts::{Arena, Shutdown};
use crate::tier::{FillPins, InternalSession, Tier, ssd_key, tier_namespace};

/// Most blocks one pipelined read asks for (then committed together).
const FILL_BATCH: usize = 16;

/// Bytes of replies one pipelined read asks for: enough to keep every node sending, few
/// enough that one slow reply fails (as misses) only a few blocks.
const PIPELINE_BYTES: u64 = 8 << 20;

/// Blocks of `block_bytes` per pipelined read (at least 1, at most [`FILL_BATCH`]).
fn pipeline_blocks(block_bytes: u64) -> usize {
    usize::try_from(PIPELINE_BYTES / block_bytes.max(1)).map_or(FILL_BATCH, |n| n.clamp(1, FILL_BATCH))
}
/// Blocks the writer takes from the queue at a time.
const WRITE_BATCH: usize = 64;

/// The remote tier of one Manager.
pub struct RemoteTier {
    store: RemoteStore,
    queue: Mutex<VecDeque<(NsId, BlockHash)>>,
    ready: Condvar,
    capacity: usize,
    counters: Counters,
}

#[derive(Default)]
struct Counters {
    queued: AtomicU64,
    dropped: AtomicU64,
    gone: AtomicU64,
    filled: AtomicU64,
}

/// The tier's counters, for `/metrics` and `orbitkv status`.
#[derive(Debug, Clone, Copy, Default)]
pub struct RemoteStats {
    /// The store's own counters (hits, misses by kind, errors, bytes, breaker).
    pub store: StoreStats,
    /// Blocks queued for writing.
    pub queued: u64,
    /// Blocks not queued because the queue was full.
    pub dropped: u64,
    /// Queued blocks gone from this Manager before the writer reached them.
    pub gone: u64,
    /// Blocks read from the store into DRAM and committed.
    pub filled: u64,
    /// Blocks waiting in the queue now.
    pub waiting: u64,
}

impl RemoteTier {
    /// Open the store (nothing is sent: a cluster down now is asked at the first request).
    pub fn open(settings: &crate::config::RemoteSettings) -> Result<RemoteTier, RemoteError> {
        Ok(RemoteTier {
            store: RemoteStore::open(&settings.store)?,
            queue: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
            capacity: settings.write_queue,
            counters: Counters::default(),
        })
    }

    /// Queue the blocks of a committed save for writing; those that do not fit
    /// are dropped and counted (a client's commit never waits for the store).
    pub fn queue_committed(&self, ns: NsId, hashes: &[BlockHash]) {
        if hashes.is_empty() {
            return;
        }
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let room = self.capacity.saturating_sub(q.len()).min(hashes.len());
        q.extend(hashes[..room].iter().map(|h| (ns, *h)));
        drop(q);
        self.counters.queued.fetch_add(room as u64, Ordering::Relaxed);
        self.counters
            .dropped
            .fetch_add((hashes.len() - room) as u64, Ordering::Relaxed);
        if room > 0 {
            self.ready.notify_one();
        }
    }

    /// Queue blocks the cache found due by reuse (`--remote-admit-hits`), each run of
    /// one namespace as one entry of the queue.
    pub fn queue_due(&self, due: &[BlockKey]) {
        for run in due.chunk_by(|a, b| a.ns == b.ns) {
            let hashes: Vec<BlockHash> = run.iter().map(|k| k.hash).collect();
            self.queue_committed(run[0].ns, &hashes);
        }
    }

    /// The tier's counters now.
    pub fn stats(&self) -> RemoteStats {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let waiting = self.queue.lock().unwrap_or_else(|p| p.into_inner()).len() as u64;
        RemoteStats {
            store: self.store.stats(),
            queued: g(&self.counters.queued),
            dropped: g(&self.counters.dropped),
            gone: g(&self.counters.gone),
            filled: g(&self.counters.filled),
            waiting,
        }
    }

    /// Fill the blocks of `hashes` (a lookup's missing suffix in `ns`) from the
    /// store into DRAM, each committed group pinned in `pins`. Returns how many
    /// leading blocks the store held and this Manager stored (visible now); any
    /// failure ends the fill there.
    pub fn fill(&self, arena: Arena<'_>, pins: &mut FillPins<'_>, ns: NsId, hashes: &[BlockHash]) -> usize {
        let Some((tier_ns, generation, block_bytes)) =
            hashes.first().and_then(|h| tier_namespace(arena, ns, h))
        else {
            return 0;
        };
        // One pipelined read per group, its leading run of hits committed (and pinned in
        // `pins`) before the next read: at most one group's replies (<= 8 MiB, or one
        // block) are held at a time (16 blocks of 4 MiB held together outgrew the
        // allocator's per-thread heap, which was then unmapped and faulted in again at
        // every fill: half the read rate).
        let mut stored = 0;
        for group in hashes.chunks(pipeline_blocks(block_bytes)) {
            let keys: Vec<_> = group
                .iter()
                .map(|h| {
                    ssd_key(&TierKey {
                        ns: tier_ns,
                        generation,
                        hash: *h,
                    })
                })
                .collect();
            let got: Vec<Hit> = self
                .store
                .get_many(&keys, block_bytes)
                .into_iter()
                .map_while(Result::ok)
                .collect();
            if got.is_empty() {
                break;
            }
            let Some((committed, held)) =
                store_blocks(arena, pins, ns, &group[..got.len()], &got, block_bytes)
            else {
                break;
            };
            stored += held;
            self.counters
                .filled
                .fetch_add(u64::from(committed), Ordering::Relaxed);
            if held < group.len() {
                break;
            }
        }
        stored
    }

    /// Up to [`WRITE_BATCH`] queued blocks of one namespace, in queue order;
    /// empty after `wait` with nothing queued.
    fn next_batch(&self, wait: Duration) -> Option<(NsId, Vec<BlockHash>)> {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.is_empty() {
            q = self
                .ready
                .wait_timeout(q, wait)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        let ns = q.front()?.0;
        let mut hashes = Vec::new();
        while hashes.len() < WRITE_BATCH {
            match q.front() {
                Some((n, h)) if *n == ns => {
                    hashes.push(*h);
                    q.pop_front();
                }
                _ => break,
            }
        }
        Some((ns, hashes))
    }
}

/// Write the verified payloads of `hashes` into a save of the fill's session (`pins`),
/// commit it and pin the blocks: the blocks committed and the leading run of `hashes`
/// now held (short of all when the cache refused some for room); `None` when the cache
/// refused the save.
fn store_blocks(
    arena: Arena<'_>,
    pins: &mut FillPins<'_>,
    ns: NsId,
    hashes: &[BlockHash],
    hits: &[Hit],
    block_bytes: u64,
) -> Option<(u32, usize)> {
    let (save, items) = {
        let mut cache = arena.cache.write();
        let s = pins.session(&mut cache);
        cache.begin_save(s, ns, hashes).ok()?
    };
    let len = usize::try_from(block_bytes).ok()?;
    for (st, hit) in items.iter().zip(hits) {
        if let SaveStatus::Allocated(slot) = st {
            // The payload was verified against this block's key, length and checksum.
            // On failure the save stays open until the fill's session ends (aborted then).
            crate::tier::recv_into_save_slot(arena.segments, slot, len, &mut hit.payload()).ok()?;
        }
    }
    let mut cache = arena.cache.write();
    let s = pins.session(&mut cache);
    let committed = cache.commit_save(s, save).ok()?;
    Some((committed, pins.pin(&mut cache, ns, hashes)))
}

/// The writer thread: take queued blocks, pin them under an internal session's
/// lease, copy each out of its slot and write it to the store. Blocks already
/// gone from this Manager are counted and skipped; a failed write is counted
/// by the store (and opens its breaker), never retried here.
pub fn writer(
    remote: &RemoteTier,
    arena: Arena<'_>,
    below: Option<&dyn Tier>,
    ssd_read: &Histogram,
    shutdown: &Shutdown,
) {
    let mut buf = Vec::new();
    while !shutdown.requested() {
        // With `--remote-admit-hits`, what lookups made due since the last turn.
        remote.queue_due(&arena.cache.read().take_remote_due());
        let Some((ns, hashes)) = remote.next_batch(Duration::from_millis(50)) else {
            continue;
        };
        let Some((tier_ns, generation, block_bytes)) =
            hashes.first().and_then(|h| tier_namespace(arena, ns, h))
        else {
            remote
                .counters
                .gone
                .fetch_add(hashes.len() as u64, Ordering::Relaxed);
            continue;
        };
        let Ok(len) = usize::try_from(block_bytes) else {
            continue;
        };
        // A batch is a chain's order, but a block may have left: write the leading
        // run this pins (not a lookup: copying a block out is not a hit), then go on
        // after the block that is gone.
        let mut rest: &[BlockHash] = &hashes;
        while !rest.is_empty() {
            let session = InternalSession::open(arena);
            let found = match arena.cache.write().pin_for_copy(session.id, ns, rest) {
                Ok(r) => r,
                Err(_) => break,
            };
            let hit = found.hit_blocks as usize;
            if let Some(lease) = found.lease
                && let Ok(slots) = crate::tier::acquire_slots(arena, below, ssd_read, session.id, lease)
                    .map_err(|e| e.release_held(arena.cache, session.id, lease))
            {
                for (slot, h) in slots.iter().zip(&rest[..hit]) {
                    buf.clear();
                    if crate::tier::send_leased_slot(arena.segments, slot, len, &mut buf).is_err() {
                        continue;
                    }
                    let key = ssd_key(&TierKey {
                        ns: tier_ns,
                        generation,
                        hash: *h,
                    });
                    remote.store.put(&key, &buf);
                }
                let _ = arena.cache.write().release(session.id, lease);
            }
            let skip = (hit + 1).min(rest.len());
            if hit < rest.len() {
                remote.counters.gone.fetch_add(1, Ordering::Relaxed);
            }
            rest = &rest[skip..];
        }
    }
}
