//! The snapshot: every scalar metric, one a line, grouped by what it reports
//! (the cache's counters and gauges with the server's counters of the same
//! events, the server's connections and frames, the SSD tier, the presence
//! table, the remote tier and the KV-event stream).

use std::sync::atomic::AtomicU64;

use super::{Metric, View, ld};

/// Metrics, one a line: `counter "name" "help" => value;` (or `gauge ...`),
/// built into `Vec<Metric>` in the order written.
macro_rules! metrics {
    ($($kind:ident $name:literal $help:literal => $value:expr;)*) => {
        vec![$(($name, $help, stringify!($kind), Reading::read(&$value))),*]
    };
}

/// What a `metrics!` line reads: a snapshot's number, or a live counter of
/// the server's (loaded relaxed, as `ld`).
trait Reading {
    fn read(&self) -> u64;
}

impl Reading for u64 {
    fn read(&self) -> u64 {
        *self
    }
}

impl Reading for AtomicU64 {
    fn read(&self) -> u64 {
        ld(self)
    }
}

pub fn snapshot(v: &View<'_>) -> Vec<Metric> {
    // Each source read once, under its own lock, before the table is built
    // (the lock-free server and KV-event counters as it is).
    let (c, g, h) = {
        let cache = v.cache.write();
        (cache.counters().clone(), cache.gauges(), cache.hint_stats())
    };
    let ret = &h.retention;
    let unprovable = v.quarantine.unprovable();
    let sc = v.counters;
    let ssd = v.tier.map(|t| t.status().stats).unwrap_or_default();
    let presence = v.presence.map(|p| p.stats());
    let rem = v.remote.map(|r| r.stats()).unwrap_or_default();
    let st = rem.store;
    let ev = |f: fn(&crate::events::EventCounters) -> &AtomicU64| v.events.map_or(0, |e| ld(f(e)));
    metrics! {
        // Lookups and the leases they grant.
        counter "lookups_total" "Lookup requests" => c.lookups;
        counter "lookup_blocks_total" "Blocks asked for by lookups" => c.lookup_blocks;
        counter "hit_blocks_total" "Blocks found (longest contiguous prefix)" => c.hit_blocks;
        counter "ssd_hit_blocks_total" "Of the hit blocks, those held on SSD only at lookup time" => c.ssd_hit_blocks;
        counter "leases_granted_total" "Leases granted (hit blocks pinned)" => c.leases_granted;
        counter "leases_acquired_total" "Leases whose sources were handed out for copying" => sc.leases_acquired;
        counter "leases_retired_total" "Leases retired (copies drained, pins released)" => c.leases_retired;
        counter "policy_touches_dropped_total" "Hits the eviction policy never saw: lookups outpaced its replay and found the touch log full" => c.policy_touches_dropped;
        // Saves, evictions and generation resets.
        counter "saves_begun_total" "Save requests" => c.saves_begun;
        counter "blocks_committed_total" "Blocks made visible" => c.blocks_committed;
        counter "blocks_present_total" "Save blocks skipped because already visible" => c.blocks_present;
        counter "blocks_refused_total" "Save blocks refused by admission (no evictable space)" => c.blocks_refused;
        counter "blocks_aborted_total" "Allocated save blocks discarded without commit" => c.blocks_aborted;
        counter "blocks_duplicate_on_commit_total" "Committed blocks that lost a race to an equal key" => c.blocks_duplicate_on_commit;
        counter "evictions_total" "Blocks evicted from DRAM" => c.evictions;
        counter "evicted_bytes_total" "Bytes evicted from DRAM" => c.evicted_bytes;
        counter "generation_bumps_total" "Namespace generation resets" => c.generation_bumps;
        counter "generation_purged_blocks_total" "Blocks dropped by generation resets" => c.generation_purged_blocks;
        // Sessions opened, ended and quarantined.
        counter "sessions_opened_total" "Sessions opened" => sc.sessions_opened;
        counter "sessions_closed_clean_total" "Sessions closed after drain" => sc.sessions_closed_clean;
        counter "sessions_vanished_total" "Sessions whose connection dropped without Close" => sc.sessions_vanished;
        counter "sessions_quarantined_total" "Vanished sessions that held leases or slots" => c.sessions_quarantined;
        counter "sessions_unquarantined_total" "Quarantined sessions released after process exit" => c.sessions_released_from_quarantine;
        // Connections and their frames: limits, deadlines, quiet releases, refusals and injected faults.
        counter "connections_refused_total" "Connections refused over --max-connections" => sc.connections_refused;
        gauge "connections" "Connections with a live session thread" => v.connections.live() as u64;
        counter "hello_timeouts_total" "Connections closed for not completing Hello within --hello-timeout-ms" => sc.hello_timeouts;
        counter "frame_timeouts_total" "Connections closed for not completing a started frame within --frame-timeout-ms" => sc.frame_timeouts;
        counter "frame_buffer_refusals_total" "Frames answered Busy (connection closed) because --max-buffered-bytes was reached" => sc.frame_buffer_refusals;
        counter "quiet_releases_total" "Leases released by ReleaseQuiet requests (no reply; the client did not wait)" => sc.quiet_releases;
        counter "quiet_release_failures_total" "Leases named by ReleaseQuiet that could not be released (unknown or another session's)" => sc.quiet_release_failures;
        gauge "frame_buffer_bytes" "Bytes of incomplete frame bodies charged to --max-buffered-bytes" => v.connections.frame_bytes() as u64;
        counter "auth_refused_total" "Connections refused by uid or token checks" => sc.auth_refused;
        counter "bad_frames_total" "Malformed, truncated or oversized frames" => sc.bad_frames;
        counter "restore_failures_injected_total" "Restores failed by fault injection" => sc.restore_failures_injected;
        counter "commit_failures_injected_total" "Commits failed (saves aborted) by fault injection" => sc.commit_failures_injected;
        // The DRAM arena and the leases on it.
        gauge "dram_capacity_bytes" "DRAM arena capacity" => g.capacity_bytes;
        gauge "dram_free_bytes" "Unallocated DRAM arena bytes" => g.free_bytes;
        gauge "dram_visible_blocks" "Visible blocks in DRAM" => g.visible_blocks;
        gauge "dram_visible_bytes" "Bytes of visible blocks in DRAM" => g.visible_bytes;
        gauge "dram_pinned_blocks" "Visible blocks pinned by leases" => g.pinned_blocks;
        gauge "dram_pending_save_bytes" "Allocated, not yet committed save bytes" => g.pending_save_bytes;
        gauge "live_leases" "Leases not yet retired" => g.live_leases;
        // Tensor-parallel leases.
        gauge "live_tp_leases" "TP leases not yet ended (some rank has not reported done)" => g.live_tp_leases;
        counter "tp_lookups_total" "TP lookups (one per request over every shard)" => c.tp_lookups;
        counter "tp_leases_granted_total" "TP leases granted (common prefix pinned in every shard)" => c.tp_leases_granted;
        counter "tp_parts_redeemed_total" "TP lease parts redeemed by rank workers" => c.tp_parts_redeemed;
        counter "tp_leases_completed_total" "TP leases ended because every rank reported done" => c.tp_leases_completed;
        counter "tp_leases_released_total" "TP leases ended by their owner" => c.tp_leases_released;
        counter "tp_leases_expired_total" "TP leases ended by --tp-lease-ttl-ms with parts never redeemed" => c.tp_leases_expired;
        // Retention hints from applications (`Retain` requests).
        counter "hint_requests_total" "Retention hints received" => h.requests_total;
        counter "hint_kept_blocks_total" "Blocks a keep hint applied to" => ret.kept_total;
        counter "hint_done_blocks_total" "Blocks a done hint applied to" => ret.done_total;
        counter "hint_refused_blocks_total" "Blocks a keep hint could not keep: the cap (--retain-share) was full with nothing of the same namespace expected back later" => ret.refused_total;
        counter "hint_expired_blocks_total" "Kept blocks released by their deadline" => ret.expired_total;
        counter "hint_displaced_blocks_total" "Kept blocks released for an earlier-due keep of the same namespace" => ret.displaced_total;
        counter "hint_kept_evicted_total" "Kept blocks evicted from DRAM because nothing else was evictable" => ret.kept_evicted_total;
        counter "hint_done_evicted_total" "Done blocks evicted from DRAM before anything else" => ret.done_evicted_total;
        counter "hint_done_revived_total" "Done blocks hit again (returned to the policy)" => ret.done_revived_total;
        counter "hint_pending_applied_total" "Hints applied when their block committed after the hint" => h.pending_applied_total;
        counter "hint_pending_dropped_total" "Hints on blocks that never committed before their deadline (or the oldest beyond 65,536 waiting)" => h.pending_dropped_total;
        gauge "hint_kept_blocks" "Blocks kept by hints now" => ret.kept_blocks;
        gauge "hint_kept_bytes" "Bytes kept by hints now" => ret.kept_bytes;
        gauge "hint_cap_bytes" "Bytes hints may keep (--retain-share of DRAM)" => ret.cap_bytes;
        gauge "hint_done_blocks" "Blocks marked done now" => ret.done_blocks;
        gauge "hint_pending_blocks" "Hints waiting for their block to commit" => h.pending_blocks;
        // Open saves, sessions and quarantine; namespaces, the arena's shape and uptime.
        gauge "live_saves" "Saves not yet committed or aborted" => g.live_saves;
        gauge "sessions" "Sessions known to the cache (open or quarantined)" => g.sessions;
        gauge "quarantined_sessions" "Sessions held until their process is proven gone" => g.quarantined_sessions;
        gauge "quarantined_bytes" "Arena bytes held by quarantined saves" => g.quarantined_bytes;
        gauge "quarantined_unprovable_sessions" "Quarantined sessions whose process cannot be watched (no pidfd)" => unprovable;
        gauge "namespaces" "Registered namespaces" => g.namespaces;
        gauge "segments" "Arena segments" => v.segments.len() as u64;
        gauge "dram_page_bytes" "Page size backing the arena (4096, or a huge page size)" => v.config.page_size.bytes();
        gauge "uptime_seconds" "Seconds since start" => v.clock.uptime_s();
        // The SSD tier: spills, staging, recovery, integrity checks and I/O.
        counter "ssd_spilled_blocks_total" "Blocks copied to SSD (write-behind)" => c.spilled_blocks;
        counter "ssd_spill_plans_total" "Walks of DRAM's cold end that chose what to spill (evict policy)" => c.spill_plans;
        counter "ssd_spill_failures_total" "Spills that failed (block stays DRAM-only)" => c.spill_failures;
        counter "ssd_staged_blocks_total" "SSD-only blocks read back into DRAM for a lease" => c.staged_blocks;
        counter "ssd_stage_failures_total" "Staging reads that failed integrity checks or I/O (dropped, a miss)" => c.stage_failures;
        counter "ssd_demotions_total" "DRAM slots freed while the SSD copy keeps the block" => c.demotions;
        counter "ssd_evicted_unspilled_blocks_total" "DRAM evictions of blocks the SSD tier would have kept, before their spill was written" => c.evicted_unspilled;
        counter "ssd_dropped_blocks_total" "SSD copies deleted to make room" => c.ssd_dropped_blocks;
        counter "ssd_adopted_blocks_total" "Recovered SSD blocks adopted by a registered namespace" => c.ssd_adopted_blocks;
        counter "ssd_rejected_blocks_total" "Recovered SSD blocks rejected (generation, namespace or size mismatch)" => c.ssd_rejected_blocks;
        counter "ssd_checksum_failures_total" "SSD reads rejected by the payload checksum" => ssd.checksum_failures;
        counter "ssd_header_failures_total" "SSD reads rejected by header, version, length or key checks" => ssd.header_failures;
        gauge "ssd_header_check_blocks" "Recovered SSD blocks the header check after start-up has to check" => ssd.header_check_total;
        gauge "ssd_header_checked_blocks" "Recovered SSD blocks whose header the check after start-up has read" => ssd.header_check_checked;
        counter "ssd_header_check_dropped_total" "Recovered SSD blocks dropped by the header check after start-up (torn or stale header)" => ssd.header_check_dropped;
        counter "ssd_read_errors_total" "SSD reads that failed with an I/O error" => ssd.read_errors;
        counter "ssd_write_errors_total" "SSD writes that failed with an I/O error" => ssd.write_errors;
        counter "ssd_bytes_written_total" "Payload bytes written to SSD" => ssd.bytes_written;
        counter "ssd_bytes_read_total" "Payload bytes read (and verified) from SSD" => ssd.bytes_read;
        gauge "ssd_blocks" "Blocks stored on SSD" => ssd.blocks;
        gauge "ssd_used_bytes" "SSD data file bytes in use" => ssd.used_bytes;
        gauge "ssd_capacity_bytes" "SSD tier capacity" => ssd.capacity_bytes;
        gauge "ssd_only_blocks" "Visible blocks whose only copy is on SSD" => g.ssd_only_blocks;
        gauge "ssd_dormant_blocks" "Recovered SSD blocks waiting for their namespace to register" => g.dormant_ssd_blocks;
        // The presence table clients read.
        gauge "presence_slots" "Slots of the presence table clients read (0: none published)" => presence.map_or(0, |p| p.slots);
        gauge "presence_entries" "Visible blocks in the presence table" => presence.map_or(0, |p| p.entries);
        gauge "presence_saturated" "1 once the presence table refused an insert (clients then ask the Manager for every lookup)" => presence.map_or(0, |p| u64::from(p.saturated));
        // The remote tier (zero without `--remote-nodes`).
        counter "remote_hits_total" "Blocks read from the remote tier, verified" => st.hits;
        counter "remote_absent_total" "Remote reads that found no value (never written, or evicted by the store)" => st.absent;
        counter "remote_invalid_total" "Remote values that failed verification (another key, length, checksum, truncated): misses, never served" => st.invalid;
        counter "remote_skipped_total" "Remote requests not sent: the circuit breaker was open" => st.skipped;
        counter "remote_errors_total" "Remote requests that failed (deadline, connection, refusal)" => st.errors;
        counter "remote_puts_total" "Blocks written to the remote tier" => st.puts;
        counter "remote_read_bytes_total" "Payload bytes read from the remote tier" => st.bytes_read;
        counter "remote_written_bytes_total" "Payload bytes written to the remote tier" => st.bytes_written;
        counter "remote_breaker_opened_total" "Times the remote tier's circuit breaker opened" => st.breaker_opened;
        counter "remote_filled_blocks_total" "Blocks read from the remote tier into DRAM on a miss and committed" => rem.filled;
        counter "remote_queued_blocks_total" "Committed blocks queued for writing to the remote tier" => rem.queued;
        counter "remote_dropped_blocks_total" "Committed blocks not written: the remote write queue was full (--remote-write-queue)" => rem.dropped;
        counter "remote_gone_blocks_total" "Queued blocks evicted here before the writer reached them" => rem.gone;
        gauge "remote_queue_blocks" "Blocks waiting to be written to the remote tier" => rem.waiting;
        // The KV-event stream (zero without `--kv-events`).
        counter "kv_events_published_total" "Block changes (stored, removed) published on the KV-event stream" => ev(|e| &e.published);
        counter "kv_events_dropped_total" "Block changes not published: the publisher fell behind and its queue was full" => ev(|e| &e.dropped);
        counter "kv_events_batches_total" "KV-event batches sent (one sequence number each)" => ev(|e| &e.batches);
        counter "kv_events_replays_total" "Replay requests served on the KV-event replay socket" => ev(|e| &e.replays);
    }
}
