//! Deferred quiet releases: leases the caller has finished with, waiting to
//! ride on this connection's next request, or sent by the flusher thread
//! once they have waited `ORBITKV_RELEASE_DELAY_US`.
//!
//! A release needs no answer, and the Manager only has to see it before
//! anything this session sends later. So instead of one message (and one
//! wake-up of the Manager's session thread) per release, the connection
//! writes the queued releases in front of its next request, in the same
//! `write`; an engine that goes idle gets them flushed after the delay by a
//! thread of this connection (started on the first deferred release), so no
//! lease stays pinned longer than the delay. This module owns the queue;
//! `Conn` owns the socket and takes the queue under its write lock, so the
//! order of releases and requests on the wire is the order of the calls.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::ClientError;

/// Environment variable: the most microseconds a deferred release waits for a
/// request to carry it before the flusher sends it (0 to 100000; default 200;
/// 0 sends each release at once, in its own message).
pub const RELEASE_DELAY_ENV: &str = "ORBITKV_RELEASE_DELAY_US";

const DEFAULT_DELAY: Duration = Duration::from_micros(200);
const MAX_DELAY_US: u64 = 100_000;

pub(crate) fn delay_from_env() -> Result<Duration, ClientError> {
    let Some(v) = std::env::var_os(RELEASE_DELAY_ENV) else {
        return Ok(DEFAULT_DELAY);
    };
    v.to_str()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .filter(|us| *us <= MAX_DELAY_US)
        .map(Duration::from_micros)
        .ok_or_else(|| {
            ClientError::Invalid(format!(
                "{RELEASE_DELAY_ENV}={v:?} is not 0 to {MAX_DELAY_US} microseconds"
            ))
        })
}

#[derive(Debug, Default)]
struct State {
    leases: Vec<u64>,
    /// When the oldest queued lease was queued.
    oldest: Option<Instant>,
    /// A push happened since the flusher last looked.
    pushed: bool,
    /// The flusher sleeps until notified (nothing was pushed for a whole
    /// delay); a push wakes it. Otherwise it wakes once per delay on its own,
    /// so a busy client costs no wake-up per release.
    parked: bool,
    /// The flusher thread runs (started on the first deferred release).
    flusher: bool,
    /// The connection is closing: the flusher exits.
    closed: bool,
}

#[derive(Debug)]
pub(crate) struct ReleaseQueue {
    state: Mutex<State>,
    wake: Condvar,
    pub(crate) delay: Duration,
}

/// What [`ReleaseQueue::push`] asks of the caller.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// Queued; a flusher runs.
    Queued,
    /// Queued; no flusher runs yet: the caller starts one.
    StartFlusher,
}

impl ReleaseQueue {
    pub(crate) fn new(delay: Duration) -> ReleaseQueue {
        ReleaseQueue {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            delay,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queue `leases`. Errors once the connection is closing.
    pub(crate) fn push(&self, leases: &[u64]) -> Result<Pushed, ClientError> {
        let mut st = self.lock();
        if st.closed {
            return Err(ClientError::Closed);
        }
        st.leases.extend_from_slice(leases);
        st.oldest.get_or_insert_with(Instant::now);
        st.pushed = true;
        if !st.flusher {
            st.flusher = true;
            return Ok(Pushed::StartFlusher);
        }
        if st.parked {
            self.wake.notify_one();
        }
        Ok(Pushed::Queued)
    }

    /// Everything queued, in order (the caller writes it before its request).
    pub(crate) fn take(&self) -> Vec<u64> {
        let mut st = self.lock();
        st.oldest = None;
        std::mem::take(&mut st.leases)
    }

    /// The flusher could not be started: it must be started again next time.
    pub(crate) fn flusher_failed(&self) {
        self.lock().flusher = false;
    }

    /// Stop the flusher (the connection is closing); what is still queued is
    /// left to the caller's last request or to the Manager, which releases
    /// every lease of a session when it ends.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.wake.notify_all();
    }

    /// The flusher's wait: returns `true` once the oldest queued release has
    /// waited `delay` without a request carrying it (the flusher then takes
    /// and sends the queue), `false` when the connection is closing.
    pub(crate) fn wait_due(&self) -> bool {
        let mut st = self.lock();
        loop {
            if st.closed {
                return false;
            }
            let wait = match st.oldest {
                Some(t) if t.elapsed() >= self.delay => return true,
                Some(t) => self.delay - t.elapsed().min(self.delay),
                None if !st.pushed => {
                    // Idle for a whole delay: sleep until a push.
                    st.parked = true;
                    while st.leases.is_empty() && !st.closed {
                        st = self.wake.wait(st).unwrap_or_else(|p| p.into_inner());
                    }
                    st.parked = false;
                    continue;
                }
                None => self.delay,
            };
            st.pushed = false;
            st = self
                .wake
                .wait_timeout(st, wait)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn the_first_push_starts_the_flusher_and_take_keeps_order() {
        let q = ReleaseQueue::new(Duration::from_micros(10));
        assert_eq!(q.push(&[1, 2]).unwrap(), Pushed::StartFlusher);
        assert_eq!(q.push(&[3]).unwrap(), Pushed::Queued);
        assert_eq!(q.take(), vec![1, 2, 3]);
        assert!(q.take().is_empty());
        q.flusher_failed();
        assert_eq!(q.push(&[4]).unwrap(), Pushed::StartFlusher);
    }

    #[test]
    fn a_closed_queue_refuses_and_stops_the_wait() {
        let q = std::sync::Arc::new(ReleaseQueue::new(Duration::from_secs(10)));
        let w = {
            let q = q.clone();
            std::thread::spawn(move || q.wait_due())
        };
        q.push(&[1]).unwrap();
        q.close();
        assert!(!w.join().unwrap());
        assert!(matches!(q.push(&[2]), Err(ClientError::Closed)));
    }

    #[test]
    fn queued_releases_fall_due_after_the_delay() {
        let q = ReleaseQueue::new(Duration::from_millis(5));
        q.push(&[7]).unwrap();
        let t = std::time::Instant::now();
        assert!(q.wait_due());
        assert!(t.elapsed() >= Duration::from_millis(5));
        assert_eq!(q.take(), vec![7]);
    }
}
