//! The circuit breaker in front of the remote store: after `threshold` failures in a
//! row (errors or missed deadlines) the store is not asked at all for a cool-down, so
//! an unreachable cluster costs a lookup one clock read instead of a timeout. When the
//! cool-down ends, one request probes the store (every other caller still skips it); a
//! success closes the breaker, a failure opens it again for twice as long, up to
//! `max_cooldown`.
//!
//! Callers pass the clock in (`now`), so the state machine is tested without sleeping.

use std::time::{Duration, Instant};

/// What a caller may do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The breaker is closed: ask the store.
    Go,
    /// The cool-down is over and this caller is the one probe: ask the store and report.
    Probe,
    /// Open: do not ask the store (a miss for a read, nothing written).
    Skip,
}

/// The breaker's state (see the module documentation).
#[derive(Debug, Clone)]
pub struct Breaker {
    threshold: u32,
    base_cooldown: Duration,
    max_cooldown: Duration,
    failures: u32,
    cooldown: Duration,
    open_until: Option<Instant>,
    probing: bool,
    opened: u64,
}

impl Breaker {
    /// A closed breaker that opens after `threshold` (at least 1) failures in a row, for
    /// `cooldown` at first, doubling per failed probe up to `max_cooldown`.
    pub fn new(threshold: u32, cooldown: Duration, max_cooldown: Duration) -> Self {
        Breaker {
            threshold: threshold.max(1),
            base_cooldown: cooldown,
            max_cooldown: max_cooldown.max(cooldown),
            failures: 0,
            cooldown,
            open_until: None,
            probing: false,
            opened: 0,
        }
    }

    /// Whether the caller may ask the store at `now`.
    pub fn admit(&mut self, now: Instant) -> Admission {
        match self.open_until {
            None => Admission::Go,
            Some(until) if now < until || self.probing => Admission::Skip,
            Some(_) => {
                self.probing = true;
                Admission::Probe
            }
        }
    }

    /// The outcome of a request that was admitted (`Go` or `Probe`) at about `now`.
    pub fn record(&mut self, ok: bool, now: Instant) {
        if ok {
            self.failures = 0;
            self.cooldown = self.base_cooldown;
            self.open_until = None;
            self.probing = false;
            return;
        }
        self.failures = self.failures.saturating_add(1);
        if self.probing {
            // The probe failed: open again, for longer.
            self.probing = false;
            self.cooldown = (self.cooldown * 2).min(self.max_cooldown);
            self.open_until = Some(now + self.cooldown);
        } else if self.open_until.is_none() && self.failures >= self.threshold {
            self.open_until = Some(now + self.cooldown);
            self.opened += 1;
        }
    }

    /// Open (requests skip the store), probing or not.
    pub fn is_open(&self) -> bool {
        self.open_until.is_some()
    }

    /// Times the breaker opened after being closed (for metrics).
    pub fn times_opened(&self) -> u64 {
        self.opened
    }

    /// The current cool-down (doubles per failed probe).
    pub fn cooldown(&self) -> Duration {
        self.cooldown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn opens_after_the_threshold_skips_until_the_cooldown_then_probes_once() {
        let t0 = Instant::now();
        let mut b = Breaker::new(3, 100 * MS, 1000 * MS);
        for _ in 0..2 {
            assert_eq!(b.admit(t0), Admission::Go);
            b.record(false, t0);
        }
        assert!(!b.is_open(), "two failures: still closed");
        assert_eq!(b.admit(t0), Admission::Go);
        b.record(false, t0);
        assert!(b.is_open());
        assert_eq!(b.times_opened(), 1);
        assert_eq!(b.admit(t0 + 99 * MS), Admission::Skip);
        assert_eq!(b.admit(t0 + 100 * MS), Admission::Probe);
        assert_eq!(b.admit(t0 + 100 * MS), Admission::Skip, "one probe at a time");
        b.record(true, t0 + 101 * MS);
        assert!(!b.is_open());
        assert_eq!(b.admit(t0 + 101 * MS), Admission::Go);
    }

    #[test]
    fn a_failed_probe_doubles_the_cooldown_up_to_the_cap_and_a_success_resets_it() {
        let t0 = Instant::now();
        let mut b = Breaker::new(1, 100 * MS, 300 * MS);
        b.record(false, t0);
        let mut now = t0;
        for want in [200 * MS, 300 * MS, 300 * MS] {
            now += b.cooldown();
            assert_eq!(b.admit(now), Admission::Probe);
            b.record(false, now);
            assert_eq!(b.cooldown(), want);
            assert_eq!(b.admit(now + want - MS), Admission::Skip);
        }
        now += b.cooldown();
        assert_eq!(b.admit(now), Admission::Probe);
        b.record(true, now);
        assert_eq!(b.cooldown(), 100 * MS);
        assert_eq!(b.times_opened(), 1, "probes failing do not count as new openings");
    }

    #[test]
    fn a_success_in_between_resets_the_count() {
        let t0 = Instant::now();
        let mut b = Breaker::new(2, 10 * MS, 10 * MS);
        b.record(false, t0);
        b.record(true, t0);
        b.record(false, t0);
        assert!(!b.is_open(), "failures must be in a row");
        b.record(false, t0);
        assert!(b.is_open());
    }
}
