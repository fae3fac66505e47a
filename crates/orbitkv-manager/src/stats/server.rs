//! The section of the server's own connection and frame counters.

use super::{Metric, ld};
use crate::parts::{Connections, ServerCounters};

/// Connections and their frames: limits, deadlines, quiet releases, refusals and
/// injected faults.
pub(super) fn connections(conns: &Connections, sc: &ServerCounters) -> Vec<Metric> {
    vec![
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
            conns.live() as u64,
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
            conns.frame_bytes() as u64,
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
    ]
}
