//! Latency histograms: fixed buckets from 1 µs to 10 s (1-2-5 steps), recorded lock-free
//! from any thread and rendered as Prometheus histograms (`_bucket{le=…}` in seconds,
//! `_sum`, `_count`) and as p50/p99 estimates in `orbitkv status --json`.
//!
//! A record is one clock read by the caller and three relaxed atomic adds into one of
//! [`SHARDS`] cache-line-aligned shards (the shard is fixed per thread), so sessions on
//! different cores do not contend for one counter.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Upper bounds of the buckets, in microseconds (the last bucket, `+Inf`, is implicit).
pub const BOUNDS_US: [u64; 22] = [
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000,
    500_000, 1_000_000, 2_000_000, 5_000_000, 10_000_000,
];
const BUCKETS: usize = BOUNDS_US.len() + 1;
/// Shards per histogram (a power of two).
pub const SHARDS: usize = 8;

#[repr(align(128))]
#[derive(Default)]
struct Shard {
    buckets: [AtomicU64; BUCKETS],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

/// One latency distribution.
#[derive(Default)]
pub struct Histogram {
    shards: [Shard; SHARDS],
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.summary();
        f.debug_struct("Histogram").field("count", &s.count).finish()
    }
}

/// What a histogram holds, summed over its shards: per-bucket counts (not cumulative),
/// the count and the sum of the recorded durations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub buckets: [u64; BUCKETS],
    pub count: u64,
    pub sum_ns: u64,
}

fn shard_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local!(static MINE: Cell<usize> = const { Cell::new(usize::MAX) });
    MINE.with(|m| {
        if m.get() == usize::MAX {
            m.set(NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS);
        }
        m.get()
    })
}

fn bucket_of(d: Duration) -> usize {
    let us = d.as_micros();
    BOUNDS_US.partition_point(|&b| u128::from(b) < us)
}

impl Histogram {
    pub fn record(&self, d: Duration) {
        let s = &self.shards[shard_index()];
        s.buckets[bucket_of(d)].fetch_add(1, Ordering::Relaxed);
        s.count.fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        s.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Record the time since `start`.
    pub fn since(&self, start: Instant) {
        self.record(start.elapsed());
    }

    pub fn summary(&self) -> Summary {
        let mut out = Summary {
            buckets: [0; BUCKETS],
            count: 0,
            sum_ns: 0,
        };
        for s in &self.shards {
            for (o, b) in out.buckets.iter_mut().zip(&s.buckets) {
                *o += b.load(Ordering::Relaxed);
            }
            out.count += s.count.load(Ordering::Relaxed);
            out.sum_ns = out.sum_ns.saturating_add(s.sum_ns.load(Ordering::Relaxed));
        }
        out
    }
}

impl Summary {
    /// The upper bound (µs) of the bucket holding quantile `q` (0 < q ≤ 1); `None` when
    /// empty, `u64::MAX` when it lies above the last bound.
    pub fn quantile_us(&self, q: f64) -> Option<u64> {
        if self.count == 0 {
            return None;
        }
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(BOUNDS_US.get(i).copied().unwrap_or(u64::MAX));
            }
        }
        Some(u64::MAX)
    }

    /// Prometheus text of this histogram as `orbitkv_{name}_seconds`.
    pub fn prometheus(&self, name: &str, help: &str) -> String {
        let mut out =
            format!("# HELP orbitkv_{name}_seconds {help}\n# TYPE orbitkv_{name}_seconds histogram\n");
        let mut cumulative = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            cumulative += n;
            let le = match BOUNDS_US.get(i) {
                Some(us) => format!("{}", *us as f64 / 1e6),
                None => "+Inf".to_string(),
            };
            out.push_str(&format!(
                "orbitkv_{name}_seconds_bucket{{le=\"{le}\"}} {cumulative}\n"
            ));
        }
        out.push_str(&format!(
            "orbitkv_{name}_seconds_sum {}\norbitkv_{name}_seconds_count {}\n",
            self.sum_ns as f64 / 1e9,
            self.count
        ));
        out
    }
}

/// The Manager's latency histograms, one per path.
#[derive(Debug, Default)]
pub struct Latencies {
    /// `Lookup` and `LookupTp` requests, arrival to reply (misses, hits, and any SSD,
    /// peer or remote fill they wait for).
    pub lookup: Histogram,
    /// `Acquire` and `RedeemTp`: a lease's blocks pinned for a restore.
    pub acquire: Histogram,
    /// `BeginSave`: space allocated for a save.
    pub begin_save: Histogram,
    /// `CommitSave`: a save made visible.
    pub commit_save: Histogram,
    /// A lookup's fill from the remote tier (reads, checks, stores into DRAM).
    pub remote_fill: Histogram,
    /// A lookup's fill from peer Managers (fetches, checks, stores into DRAM).
    pub peer_fill: Histogram,
    /// The SSD reads staging one restore's SSD-only blocks into DRAM (one batch per acquire).
    pub ssd_read: Histogram,
    /// One write-behind batch of spills to SSD (up to 64 blocks, made durable).
    pub ssd_write: Histogram,
}

impl Latencies {
    /// (name, help, histogram) of every histogram, in the order they are rendered.
    pub fn all(&self) -> [(&'static str, &'static str, &Histogram); 8] {
        [
            ("lookup", "Lookup requests, arrival to reply", &self.lookup),
            (
                "acquire",
                "Acquire requests (blocks pinned for a restore), arrival to reply",
                &self.acquire,
            ),
            (
                "begin_save",
                "BeginSave requests (space allocated), arrival to reply",
                &self.begin_save,
            ),
            (
                "commit_save",
                "CommitSave requests (a save made visible), arrival to reply",
                &self.commit_save,
            ),
            (
                "remote_fill",
                "Fills of a lookup's missing blocks from the remote tier",
                &self.remote_fill,
            ),
            (
                "peer_fill",
                "Fills of a lookup's missing blocks from peer Managers",
                &self.peer_fill,
            ),
            (
                "ssd_read",
                "SSD reads staging one restore's SSD-only blocks into DRAM (a batch per acquire)",
                &self.ssd_read,
            ),
            (
                "ssd_write",
                "Write-behind spill batches to SSD (up to 64 blocks each, made durable)",
                &self.ssd_write,
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn durations_land_in_the_bucket_whose_bound_is_the_first_at_or_above_them() {
        assert_eq!(bucket_of(Duration::ZERO), 0);
        assert_eq!(bucket_of(US), 0);
        assert_eq!(bucket_of(2 * US), 1);
        assert_eq!(bucket_of(3 * US), 2);
        assert_eq!(bucket_of(Duration::from_secs(10)), BOUNDS_US.len() - 1);
        assert_eq!(bucket_of(Duration::from_secs(11)), BOUNDS_US.len());
    }

    #[test]
    fn records_from_many_threads_are_all_counted_and_quantiles_follow_the_buckets() {
        let h = Histogram::default();
        std::thread::scope(|s| {
            for t in 0..16 {
                let h = &h;
                s.spawn(move || {
                    for i in 0..1000 {
                        // 90 % at 3 µs (bucket ≤ 5), 10 % at 700 µs (bucket ≤ 1 ms)
                        h.record(if (i + t) % 10 == 0 { 700 * US } else { 3 * US });
                    }
                });
            }
        });
        let s = h.summary();
        assert_eq!(s.count, 16_000);
        assert_eq!(s.buckets.iter().sum::<u64>(), 16_000);
        assert_eq!(s.sum_ns, 14_400 * 3_000 + 1_600 * 700_000);
        assert_eq!(s.quantile_us(0.5), Some(5));
        assert_eq!(s.quantile_us(0.9), Some(5));
        assert_eq!(s.quantile_us(0.99), Some(1_000));
        assert_eq!(Histogram::default().summary().quantile_us(0.5), None);
    }

    #[test]
    fn prometheus_buckets_are_cumulative_in_seconds_and_end_with_inf() {
        let h = Histogram::default();
        h.record(3 * US);
        h.record(Duration::from_secs(20));
        let text = h.summary().prometheus("lookup", "help");
        assert!(text.contains("# TYPE orbitkv_lookup_seconds histogram\n"));
        assert!(
            text.contains("orbitkv_lookup_seconds_bucket{le=\"0.000002\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("orbitkv_lookup_seconds_bucket{le=\"0.000005\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("orbitkv_lookup_seconds_bucket{le=\"10\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("orbitkv_lookup_seconds_bucket{le=\"+Inf\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("orbitkv_lookup_seconds_count 2\n"), "{text}");
        assert!(text.contains("orbitkv_lookup_seconds_sum 20.000003\n"), "{text}");
    }
}
