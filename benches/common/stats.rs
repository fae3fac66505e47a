//! The figures the Manager-path benches report: medians of repeated trials and rates.

use std::time::Duration;

/// The median of `v` (the upper middle for an even count); `v` must not be empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `bytes` moved in `d`, in GB/s (10^9 bytes a second).
pub fn gbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}
