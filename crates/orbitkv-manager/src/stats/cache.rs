//! Sections of the cache's counters and gauges (`orbitkv_core`), with the
//! server's counters of the same events: lookups, saves, sessions, DRAM, TP
//! leases and the cache's state.

use orbitkv_core::{Counters, Gauges, HintStats};

use super::{Metric, View, ld};
use crate::parts::ServerCounters;

/// Lookups and the leases they grant.
pub(super) fn lookups(c: &Counters, sc: &ServerCounters) -> Vec<Metric> {
    vec![
        ("lookups_total", "Lookup requests", "counter", c.lookups),
        (
            "lookup_blocks_total",
            "Blocks asked for by lookups",
            "counter",
            c.lookup_blocks,
        ),
        (
            "hit_blocks_total",
            "Blocks found (longest contiguous prefix)",
            "counter",
            c.hit_blocks,
        ),
        (
            "ssd_hit_blocks_total",
            "Of the hit blocks, those held on SSD only at lookup time",
            "counter",
            c.ssd_hit_blocks,
        ),
        (
            "leases_granted_total",
            "Leases granted (hit blocks pinned)",
            "counter",
            c.leases_granted,
        ),
        (
            "leases_acquired_total",
            "Leases whose sources were handed out for copying",
            "counter",
            ld(&sc.leases_acquired),
        ),
        (
            "leases_retired_total",
            "Leases retired (copies drained, pins released)",
            "counter",
            c.leases_retired,
        ),
        (
            "policy_touches_dropped_total",
            "Hits the eviction policy never saw: lookups outpaced its replay and found the touch log full",
            "counter",
            c.policy_touches_dropped,
        ),
    ]
}

/// Retention hints from applications (`Retain` requests).
pub(super) fn hints(h: &HintStats) -> Vec<Metric> {
    let r = &h.retention;
    vec![
        (
            "hint_requests_total",
            "Retention hints received",
            "counter",
            h.requests_total,
        ),
        (
            "hint_kept_blocks_total",
            "Blocks a keep hint applied to",
            "counter",
            r.kept_total,
        ),
        (
            "hint_done_blocks_total",
            "Blocks a done hint applied to",
            "counter",
            r.done_total,
        ),
        (
            "hint_refused_blocks_total",
            "Blocks a keep hint could not keep: the cap (--retain-share) was full with nothing of the same namespace expected back later",
            "counter",
            r.refused_total,
        ),
        (
            "hint_expired_blocks_total",
            "Kept blocks released by their deadline",
            "counter",
            r.expired_total,
        ),
        (
            "hint_displaced_blocks_total",
            "Kept blocks released for an earlier-due keep of the same namespace",
            "counter",
            r.displaced_total,
        ),
        (
            "hint_kept_evicted_total",
            "Kept blocks evicted from DRAM because nothing else was evictable",
            "counter",
            r.kept_evicted_total,
        ),
        (
            "hint_done_evicted_total",
            "Done blocks evicted from DRAM before anything else",
            "counter",
            r.done_evicted_total,
        ),
        (
            "hint_done_revived_total",
            "Done blocks hit again (returned to the policy)",
            "counter",
            r.done_revived_total,
        ),
        (
            "hint_pending_applied_total",
            "Hints applied when their block committed after the hint",
            "counter",
            h.pending_applied_total,
        ),
        (
            "hint_pending_dropped_total",
            "Hints on blocks that never committed before their deadline (or the oldest beyond 65,536 waiting)",
            "counter",
            h.pending_dropped_total,
        ),
        (
            "hint_kept_blocks",
            "Blocks kept by hints now",
            "gauge",
            r.kept_blocks,
        ),
        (
            "hint_kept_bytes",
            "Bytes kept by hints now",
            "gauge",
            r.kept_bytes,
        ),
        (
            "hint_cap_bytes",
            "Bytes hints may keep (--retain-share of DRAM)",
            "gauge",
            r.cap_bytes,
        ),
        (
            "hint_done_blocks",
            "Blocks marked done now",
            "gauge",
            r.done_blocks,
        ),
        (
            "hint_pending_blocks",
            "Hints waiting for their block to commit",
            "gauge",
            h.pending_blocks,
        ),
    ]
}

/// Saves, evictions and generation resets.
pub(super) fn saves(c: &Counters) -> Vec<Metric> {
    vec![
        ("saves_begun_total", "Save requests", "counter", c.saves_begun),
        (
            "blocks_committed_total",
            "Blocks made visible",
            "counter",
            c.blocks_committed,
        ),
        (
            "blocks_present_total",
            "Save blocks skipped because already visible",
            "counter",
            c.blocks_present,
        ),
        (
            "blocks_refused_total",
            "Save blocks refused by admission (no evictable space)",
            "counter",
            c.blocks_refused,
        ),
        (
            "blocks_aborted_total",
            "Allocated save blocks discarded without commit",
            "counter",
            c.blocks_aborted,
        ),
        (
            "blocks_duplicate_on_commit_total",
            "Committed blocks that lost a race to an equal key",
            "counter",
            c.blocks_duplicate_on_commit,
        ),
        (
            "evictions_total",
            "Blocks evicted from DRAM",
            "counter",
            c.evictions,
        ),
        (
            "evicted_bytes_total",
            "Bytes evicted from DRAM",
            "counter",
            c.evicted_bytes,
        ),
        (
            "generation_bumps_total",
            "Namespace generation resets",
            "counter",
            c.generation_bumps,
        ),
        (
            "generation_purged_blocks_total",
            "Blocks dropped by generation resets",
            "counter",
            c.generation_purged_blocks,
        ),
    ]
}

/// Sessions opened, ended and quarantined.
pub(super) fn sessions(c: &Counters, sc: &ServerCounters) -> Vec<Metric> {
    vec![
        (
            "sessions_opened_total",
            "Sessions opened",
            "counter",
            ld(&sc.sessions_opened),
        ),
        (
            "sessions_closed_clean_total",
            "Sessions closed after drain",
            "counter",
            ld(&sc.sessions_closed_clean),
        ),
        (
            "sessions_vanished_total",
            "Sessions whose connection dropped without Close",
            "counter",
            ld(&sc.sessions_vanished),
        ),
        (
            "sessions_quarantined_total",
            "Vanished sessions that held leases or slots",
            "counter",
            c.sessions_quarantined,
        ),
        (
            "sessions_unquarantined_total",
            "Quarantined sessions released after process exit",
            "counter",
            c.sessions_released_from_quarantine,
        ),
    ]
}

/// The DRAM arena and the leases on it.
pub(super) fn dram(g: &Gauges) -> Vec<Metric> {
    vec![
        (
            "dram_capacity_bytes",
            "DRAM arena capacity",
            "gauge",
            g.capacity_bytes,
        ),
        (
            "dram_free_bytes",
            "Unallocated DRAM arena bytes",
            "gauge",
            g.free_bytes,
        ),
        (
            "dram_visible_blocks",
            "Visible blocks in DRAM",
            "gauge",
            g.visible_blocks,
        ),
        (
            "dram_visible_bytes",
            "Bytes of visible blocks in DRAM",
            "gauge",
            g.visible_bytes,
        ),
        (
            "dram_pinned_blocks",
            "Visible blocks pinned by leases",
            "gauge",
            g.pinned_blocks,
        ),
        (
            "dram_pending_save_bytes",
            "Allocated, not yet committed save bytes",
            "gauge",
            g.pending_save_bytes,
        ),
        ("live_leases", "Leases not yet retired", "gauge", g.live_leases),
    ]
}

/// Tensor-parallel leases.
pub(super) fn tp(c: &Counters, g: &Gauges) -> Vec<Metric> {
    vec![
        (
            "live_tp_leases",
            "TP leases not yet ended (some rank has not reported done)",
            "gauge",
            g.live_tp_leases,
        ),
        (
            "tp_lookups_total",
            "TP lookups (one per request over every shard)",
            "counter",
            c.tp_lookups,
        ),
        (
            "tp_leases_granted_total",
            "TP leases granted (common prefix pinned in every shard)",
            "counter",
            c.tp_leases_granted,
        ),
        (
            "tp_parts_redeemed_total",
            "TP lease parts redeemed by rank workers",
            "counter",
            c.tp_parts_redeemed,
        ),
        (
            "tp_leases_completed_total",
            "TP leases ended because every rank reported done",
            "counter",
            c.tp_leases_completed,
        ),
        (
            "tp_leases_released_total",
            "TP leases ended by their owner",
            "counter",
            c.tp_leases_released,
        ),
        (
            "tp_leases_expired_total",
            "TP leases ended by --tp-lease-ttl-ms with parts never redeemed",
            "counter",
            c.tp_leases_expired,
        ),
    ]
}

/// Open saves, sessions and quarantine; namespaces, the arena's shape and uptime.
pub(super) fn state(v: &View<'_>, g: &Gauges, unprovable: u64) -> Vec<Metric> {
    vec![
        (
            "live_saves",
            "Saves not yet committed or aborted",
            "gauge",
            g.live_saves,
        ),
        (
            "sessions",
            "Sessions known to the cache (open or quarantined)",
            "gauge",
            g.sessions,
        ),
        (
            "quarantined_sessions",
            "Sessions held until their process is proven gone",
            "gauge",
            g.quarantined_sessions,
        ),
        (
            "quarantined_bytes",
            "Arena bytes held by quarantined saves",
            "gauge",
            g.quarantined_bytes,
        ),
        (
            "quarantined_unprovable_sessions",
            "Quarantined sessions whose process cannot be watched (no pidfd)",
            "gauge",
            unprovable,
        ),
        ("namespaces", "Registered namespaces", "gauge", g.namespaces),
        ("segments", "Arena segments", "gauge", v.segments.len() as u64),
        (
            "dram_page_bytes",
            "Page size backing the arena (4096, or a huge page size)",
            "gauge",
            v.config.page_size.bytes(),
        ),
        (
            "uptime_seconds",
            "Seconds since start",
            "gauge",
            v.clock.uptime_s(),
        ),
    ]
}
