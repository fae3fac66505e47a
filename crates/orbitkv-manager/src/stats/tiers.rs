//! Sections of what lies beside the DRAM arena: the SSD tier and the
//! presence table clients read.

use orbitkv_core::{Counters, Gauges};
use orbitkv_shm::presence::PresenceStats;
use orbitkv_ssd::SsdStats;

use super::Metric;

/// The SSD tier: spills, staging, recovery, integrity checks and I/O.
pub(super) fn ssd_tier(c: &Counters, g: &Gauges, ssd: &SsdStats) -> Vec<Metric> {
    vec![
        (
            "ssd_spilled_blocks_total",
            "Blocks copied to SSD (write-behind)",
            "counter",
            c.spilled_blocks,
        ),
        (
            "ssd_spill_plans_total",
            "Walks of DRAM's cold end that chose what to spill (evict policy)",
            "counter",
            c.spill_plans,
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
    ]
}

/// The presence table clients read.
pub(super) fn presence_table(presence: Option<PresenceStats>) -> Vec<Metric> {
    vec![
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

/// The KV-event stream (zero without `--kv-events`).
pub(super) fn kv_events(e: Option<&crate::events::EventCounters>) -> Vec<Metric> {
    let v = |f: fn(&crate::events::EventCounters) -> &std::sync::atomic::AtomicU64| {
        e.map_or(0, |e| super::ld(f(e)))
    };
    vec![
        (
            "kv_events_published_total",
            "Block changes (stored, removed) published on the KV-event stream",
            "counter",
            v(|e| &e.published),
        ),
        (
            "kv_events_dropped_total",
            "Block changes not published: the publisher fell behind and its queue was full",
            "counter",
            v(|e| &e.dropped),
        ),
        (
            "kv_events_batches_total",
            "KV-event batches sent (one sequence number each)",
            "counter",
            v(|e| &e.batches),
        ),
        (
            "kv_events_replays_total",
            "Replay requests served on the KV-event replay socket",
            "counter",
            v(|e| &e.replays),
        ),
    ]
}

/// The remote tier (zero without `--remote-nodes`).
pub(super) fn remote_tier(r: Option<crate::remote::RemoteStats>) -> Vec<Metric> {
    let r = r.unwrap_or_default();
    let st = r.store;
    vec![
        (
            "remote_hits_total",
            "Blocks read from the remote tier, verified",
            "counter",
            st.hits,
        ),
        (
            "remote_absent_total",
            "Remote reads that found no value (never written, or evicted by the store)",
            "counter",
            st.absent,
        ),
        (
            "remote_invalid_total",
            "Remote values that failed verification (another key, length, checksum, truncated): misses, never served",
            "counter",
            st.invalid,
        ),
        (
            "remote_skipped_total",
            "Remote requests not sent: the circuit breaker was open",
            "counter",
            st.skipped,
        ),
        (
            "remote_errors_total",
            "Remote requests that failed (deadline, connection, refusal)",
            "counter",
            st.errors,
        ),
        (
            "remote_puts_total",
            "Blocks written to the remote tier",
            "counter",
            st.puts,
        ),
        (
            "remote_read_bytes_total",
            "Payload bytes read from the remote tier",
            "counter",
            st.bytes_read,
        ),
        (
            "remote_written_bytes_total",
            "Payload bytes written to the remote tier",
            "counter",
            st.bytes_written,
        ),
        (
            "remote_breaker_opened_total",
            "Times the remote tier's circuit breaker opened",
            "counter",
            st.breaker_opened,
        ),
        (
            "remote_filled_blocks_total",
            "Blocks read from the remote tier into DRAM on a miss and committed",
            "counter",
            r.filled,
        ),
        (
            "remote_queued_blocks_total",
            "Committed blocks queued for writing to the remote tier",
            "counter",
            r.queued,
        ),
        (
            "remote_dropped_blocks_total",
            "Committed blocks not written: the remote write queue was full (--remote-write-queue)",
            "counter",
            r.dropped,
        ),
        (
            "remote_gone_blocks_total",
            "Queued blocks evicted here before the writer reached them",
            "counter",
            r.gone,
        ),
        (
            "remote_queue_blocks",
            "Blocks waiting to be written to the remote tier",
            "gauge",
            r.waiting,
        ),
    ]
}
