//! One snapshot of every counter and gauge, rendered as JSON (`orbitkv
//! status`, the Stats request) or Prometheus text (`/metrics`).

use std::sync::atomic::Ordering;

use crate::shared::Shared;

/// (name, help, kind, value). `kind` is "counter" or "gauge".
type Metric = (&'static str, &'static str, &'static str, u64);

pub fn snapshot(shared: &Shared) -> Vec<Metric> {
    let (c, g) = {
        let cache = shared.cache();
        (cache.counters().clone(), cache.gauges())
    };
    let q = shared.quarantine();
    let unprovable = q.iter().filter(|x| x.process.is_none()).count() as u64;
    drop(q);
    let sc = &shared.counters;
    let ssd = shared.tier.as_ref().map(|t| t.status().stats).unwrap_or_default();
    let ld = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let presence = shared.presence.as_ref().map(|p| p.stats());
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
        (
            "connections_refused_total",
            "Connections refused over --max-connections",
            "counter",
            ld(&sc.connections_refused),
        ),
        (
            "connections",
            "Connections with a live session thread",
            "gauge",
            shared.connections.load(Ordering::Relaxed) as u64,
        ),
        (
            "hello_timeouts_total",
            "Connections closed for not completing Hello within --hello-timeout-ms",
            "counter",
            ld(&sc.hello_timeouts),
        ),
        (
            "frame_timeouts_total",
            "Connections closed for not completing a started frame within --frame-timeout-ms",
            "counter",
            ld(&sc.frame_timeouts),
        ),
        (
            "frame_buffer_refusals_total",
            "Frames answered Busy (connection closed) because --max-buffered-bytes was reached",
            "counter",
            ld(&sc.frame_buffer_refusals),
        ),
        (
            "quiet_releases_total",
            "Leases released by ReleaseQuiet requests (no reply; the client did not wait)",
            "counter",
            ld(&sc.quiet_releases),
        ),
        (
            "quiet_release_failures_total",
            "Leases named by ReleaseQuiet that could not be released (unknown or another session's)",
            "counter",
            ld(&sc.quiet_release_failures),
        ),
        (
            "frame_buffer_bytes",
            "Bytes of incomplete frame bodies charged to --max-buffered-bytes",
            "gauge",
            shared.frame_buffer_bytes.load(Ordering::Relaxed) as u64,
        ),
        (
            "auth_refused_total",
            "Connections refused by uid or token checks",
            "counter",
            ld(&sc.auth_refused),
        ),
        (
            "bad_frames_total",
            "Malformed, truncated or oversized frames",
            "counter",
            ld(&sc.bad_frames),
        ),
        (
            "restore_failures_injected_total",
            "Restores failed by fault injection",
            "counter",
            ld(&sc.restore_failures_injected),
        ),
        (
            "commit_failures_injected_total",
            "Commits failed (saves aborted) by fault injection",
            "counter",
            ld(&sc.commit_failures_injected),
        ),
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
        (
            "segments",
            "Arena segments",
            "gauge",
            shared.segments.len() as u64,
        ),
        (
            "dram_page_bytes",
            "Page size backing the arena (4096, or a huge page size)",
            "gauge",
            shared.config.page_size.bytes(),
        ),
        (
            "uptime_seconds",
            "Seconds since start",
            "gauge",
            shared.started.elapsed().as_secs(),
        ),
        (
            "ssd_spilled_blocks_total",
            "Blocks copied to SSD (write-behind)",
            "counter",
            c.spilled_blocks,
        ),
        (
            "ssd_spill_failures_total",
            "Spills that failed (block stays DRAM-only)",
            "counter",
            c.spill_failures,
        ),
        (
            "ssd_staged_blocks_total",
            "SSD-only blocks read back into DRAM for a lease",
            "counter",
            c.staged_blocks,
        ),
        (
            "ssd_stage_failures_total",
            "Staging reads that failed integrity checks or I/O (dropped, a miss)",
            "counter",
            c.stage_failures,
        ),
        (
            "ssd_demotions_total",
            "DRAM slots freed while the SSD copy keeps the block",
            "counter",
            c.demotions,
        ),
        (
            "ssd_evicted_unspilled_blocks_total",
            "DRAM evictions of blocks the SSD tier would have kept, before their spill was written",
            "counter",
            c.evicted_unspilled,
        ),
        (
            "ssd_dropped_blocks_total",
            "SSD copies deleted to make room",
            "counter",
            c.ssd_dropped_blocks,
        ),
        (
            "ssd_adopted_blocks_total",
            "Recovered SSD blocks adopted by a registered namespace",
            "counter",
            c.ssd_adopted_blocks,
        ),
        (
            "ssd_rejected_blocks_total",
            "Recovered SSD blocks rejected (generation, namespace or size mismatch)",
            "counter",
            c.ssd_rejected_blocks,
        ),
        (
            "ssd_checksum_failures_total",
            "SSD reads rejected by the payload checksum",
            "counter",
            ssd.checksum_failures,
        ),
        (
            "ssd_header_failures_total",
            "SSD reads rejected by header, version, length or key checks",
            "counter",
            ssd.header_failures,
        ),
        (
            "ssd_header_check_blocks",
            "Recovered SSD blocks the header check after start-up has to check",
            "gauge",
            ssd.header_check_total,
        ),
        (
            "ssd_header_checked_blocks",
            "Recovered SSD blocks whose header the check after start-up has read",
            "gauge",
            ssd.header_check_checked,
        ),
        (
            "ssd_header_check_dropped_total",
            "Recovered SSD blocks dropped by the header check after start-up (torn or stale header)",
            "counter",
            ssd.header_check_dropped,
        ),
        (
            "ssd_read_errors_total",
            "SSD reads that failed with an I/O error",
            "counter",
            ssd.read_errors,
        ),
        (
            "ssd_write_errors_total",
            "SSD writes that failed with an I/O error",
            "counter",
            ssd.write_errors,
        ),
        (
            "ssd_bytes_written_total",
            "Payload bytes written to SSD",
            "counter",
            ssd.bytes_written,
        ),
        (
            "ssd_bytes_read_total",
            "Payload bytes read (and verified) from SSD",
            "counter",
            ssd.bytes_read,
        ),
        ("ssd_blocks", "Blocks stored on SSD", "gauge", ssd.blocks),
        (
            "ssd_used_bytes",
            "SSD data file bytes in use",
            "gauge",
            ssd.used_bytes,
        ),
        (
            "ssd_capacity_bytes",
            "SSD tier capacity",
            "gauge",
            ssd.capacity_bytes,
        ),
        (
            "ssd_only_blocks",
            "Visible blocks whose only copy is on SSD",
            "gauge",
            g.ssd_only_blocks,
        ),
        (
            "ssd_dormant_blocks",
            "Recovered SSD blocks waiting for their namespace to register",
            "gauge",
            g.dormant_ssd_blocks,
        ),
        (
            "presence_slots",
            "Slots of the presence table clients read (0: none published)",
            "gauge",
            presence.map_or(0, |p| p.slots),
        ),
        (
            "presence_entries",
            "Visible blocks in the presence table",
            "gauge",
            presence.map_or(0, |p| p.entries),
        ),
        (
            "presence_saturated",
            "1 once the presence table refused an insert (clients then ask the Manager for every lookup)",
            "gauge",
            presence.map_or(0, |p| u64::from(p.saturated)),
        ),
    ]
}

pub fn json(shared: &Shared) -> String {
    let mut m = serde_json::Map::new();
    for (name, _, _, v) in snapshot(shared) {
        m.insert(name.into(), v.into());
    }
    m.insert("socket".into(), shared.config.socket.display().to_string().into());
    let metrics = shared.metrics_addr.lock().ok().and_then(|a| *a);
    m.insert("metrics_addr".into(), metrics.map(|a| a.to_string()).into());
    m.insert("version".into(), env!("CARGO_PKG_VERSION").into());
    m.insert(
        "ssd".into(),
        match (&shared.config.ssd, shared.tier.as_ref().map(|t| t.status())) {
            (Some(cfg), Some(t)) => serde_json::json!({
                "enabled": true,
                "dir": cfg.dir.display().to_string(),
                "mode": if cfg.mode == orbitkv_ssd::IoMode::Direct { "direct" } else { "kernel" },
                "engine": t.engine,
                "fallback_reason": t.fallback_reason,
                "admit_hits": cfg.admit_hits,
                "write_policy": if cfg.write_policy == orbitkv_core::SpillPolicy::Eager { "eager" } else { "evict" },
            }),
            _ => serde_json::json!({ "enabled": false }),
        },
    );
    m.insert(
        "peers".into(),
        shared
            .peers
            .as_ref()
            .map_or_else(|| serde_json::json!({ "enabled": false }), |p| p.status_json()),
    );
    m.insert("pid".into(), std::process::id().into());
    m.insert(
        "segment_sizes".into(),
        shared
            .segments
            .iter()
            .map(|s| serde_json::Value::from(s.size()))
            .collect::<Vec<_>>()
            .into(),
    );
    serde_json::Value::Object(m).to_string()
}

pub fn prometheus(shared: &Shared) -> String {
    let mut out = String::new();
    for (name, help, kind, v) in snapshot(shared) {
        out.push_str(&format!(
            "# HELP orbitkv_{name} {help}\n# TYPE orbitkv_{name} {kind}\norbitkv_{name} {v}\n"
        ));
    }
    if let Some(p) = shared.peers.as_ref() {
        out.push_str(&p.prometheus());
    }
    out
}
