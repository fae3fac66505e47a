//! The write-behind worker: hands the SSD tier the deletions the cache gave up
//! and the spills it chose, and makes room when the tier is full.

use std::time::{Duration, Instant};

use orbitkv_core::SpillJob;

use super::{SpillGuard, Spilled, Tier};
use crate::latency::Histogram;
use crate::parts::{Arena, Shutdown};

/// Blocks per spill batch: several × the ring depth, so the device never idles.
const SPILL_BATCH: usize = 64;

/// What the write-behind worker works on: the cache and the arena it spills
/// from, and the tier it spills to.
#[derive(Clone, Copy)]
pub struct WriteBehind<'a> {
    pub arena: Arena<'a>,
    pub tier: &'a dyn Tier,
}

/// The write-behind worker: deletions first, then spills, until shutdown. Each
/// spill batch's time goes to `batch_latency`.
pub fn worker(wb: WriteBehind<'_>, shutdown: &Shutdown, batch_latency: &Histogram) {
    let WriteBehind { arena, tier } = wb;
    let cache = arena.cache;
    while !shutdown.requested() {
        // Copies the tier dropped itself (header check after start-up): the cache
        // forgets them (SSD-only blocks leave the index, so lookups miss; a block
        // with a DRAM copy keeps it); busy or pinned ones are skipped here and fail
        // their staging read instead. What it returns is deleted (already gone, or a
        // copy spilled again since, which the cache no longer counts).
        let lost = tier.take_lost();
        if !lost.is_empty() {
            let forgotten = cache.write().ssd_droppable(&lost);
            tier.remove(&forgotten);
        }
        let removals = cache.write().take_ssd_removals();
        tier.remove(&removals);
        let jobs = cache.write().spill_candidates(SPILL_BATCH);
        // Copies the policy gave up to make room for these spills go first.
        let made_room = cache.write().take_ssd_removals();
        tier.remove(&made_room);
        if jobs.is_empty() {
            // A walk of the cold end goes on at the next call (each call holds the
            // lock for one bounded step; lookups run between them).
            if removals.is_empty() && !cache.read().spill_walk_in_progress() {
                std::thread::sleep(Duration::from_millis(10));
            }
            continue;
        }
        let t = Instant::now();
        spill_batch(wb, jobs);
        batch_latency.since(t);
    }
}

/// Spill one batch from `spill_candidates` and report it, whatever happens in
/// between. A full tier gets one chance to make room, then the rest fail.
pub(super) fn spill_batch(wb: WriteBehind<'_>, jobs: Vec<SpillJob>) {
    let WriteBehind { arena, tier } = wb;
    let spilling = SpillGuard::new(arena.cache, jobs);
    let jobs = spilling.jobs();
    let mut ok = vec![false; jobs.len()];
    let mut todo: Vec<usize> = (0..jobs.len()).collect();
    for attempt in 0..2 {
        let batch: Vec<SpillJob> = todo.iter().map(|&i| jobs[i]).collect();
        let results = tier.spill(arena.segments, &batch);
        let mut full = Vec::new();
        for (&i, r) in todo.iter().zip(results) {
            match r {
                Spilled::Durable => ok[i] = true,
                Spilled::Full => full.push(i),
                Spilled::Failed => {}
            }
        }
        if full.is_empty() || attempt == 1 {
            break;
        }
        make_room(wb, full.len() * 2);
        todo = full;
    }
    spilling.finish(&ok);
}

/// The tier is full: delete copies the cache can spare.
fn make_room(wb: WriteBehind<'_>, n: usize) {
    let WriteBehind { arena, tier } = wb;
    // The policy's order first (the copies DRAM + SSD value least), then the
    // store's least recently used (without tiers, or none left to give up).
    let ranked = arena.cache.write().ssd_make_room(n.max(8));
    if !ranked.is_empty() {
        tier.remove(&ranked);
        return;
    }
    let proposed = tier.oldest(n.max(8));
    let droppable = arena.cache.write().ssd_droppable(&proposed);
    tier.remove(&droppable);
}
