//! The parts of the Manager's shared state that a thread can be handed alone:
//! the cache lock ([`Cache`]), the arena ([`Arena`]), the quarantine
//! ([`Quarantine`]), the connection places and frame budget ([`Connections`]),
//! armed faults ([`Faults`]), the stop flag ([`Shutdown`]), the clock
//! ([`Clock`]) and the server counters ([`ServerCounters`], with their latency
//! histograms from `crate::latency`). They depend on neither the tiers nor the
//! peer tier (both use them); `Shared` holds one of each.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;
use std::time::Instant;

use orbitkv_core::{CacheState, SessionId};
use orbitkv_shm::Segment;
use orbitkv_shm::peer::ProcessHandle;

/// Server-level counters (the cache's own counters live in `CacheState`).
#[derive(Debug, Default)]
pub struct ServerCounters {
    pub sessions_opened: AtomicU64,
    pub sessions_closed_clean: AtomicU64,
    pub sessions_vanished: AtomicU64,
    pub auth_refused: AtomicU64,
    pub bad_frames: AtomicU64,
    pub restore_failures_injected: AtomicU64,
    pub commit_failures_injected: AtomicU64,
    pub leases_acquired: AtomicU64,
    pub connections_refused: AtomicU64,
    pub hello_timeouts: AtomicU64,
    pub frame_timeouts: AtomicU64,
    pub frame_buffer_refusals: AtomicU64,
    /// Leases named by `ReleaseQuiet` requests, and those the Manager could
    /// not release (already ended; nobody is waiting for an answer).
    pub quiet_releases: AtomicU64,
    pub quiet_release_failures: AtomicU64,
    /// Latency histograms of the request paths (`/metrics`, `orbitkv status --json`).
    pub latency: crate::latency::Latencies,
}

impl ServerCounters {
    /// Count one more; returns the new total (for [`crate::log::warn_sampled`]).
    pub fn inc(c: &AtomicU64) -> u64 {
        c.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// A session held in quarantine until its process is proven gone.
#[derive(Debug)]
pub struct Quarantined {
    pub session: SessionId,
    pub pid: i32,
    /// `None` when the pid could not be opened (e.g. another pid namespace):
    /// such holds stay until the Manager restarts; reported in metrics.
    pub process: Option<ProcessHandle>,
}

/// Sessions held in quarantine until their process is proven gone.
#[derive(Debug, Default)]
pub struct Quarantine(Mutex<Vec<Quarantined>>);

impl Quarantine {
    fn lock(&self) -> MutexGuard<'_, Vec<Quarantined>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hold a vanished session until its process is gone.
    pub fn hold(&self, q: Quarantined) {
        self.lock().push(q);
    }

    /// Let go of the sessions whose process has exited: (session, pid) of each.
    pub fn take_exited(&self) -> Vec<(SessionId, i32)> {
        let mut gone = Vec::new();
        self.lock().retain(|item| {
            let exited = item.process.as_ref().is_some_and(|p| p.exited().unwrap_or(false));
            if exited {
                gone.push((item.session, item.pid));
            }
            !exited
        });
        gone
    }

    /// Held sessions whose process cannot be watched (no pidfd).
    pub fn unprovable(&self) -> u64 {
        self.lock().iter().filter(|x| x.process.is_none()).count() as u64
    }

    /// The sessions held, in the order they came.
    #[cfg(test)]
    pub fn sessions(&self) -> Vec<SessionId> {
        self.lock().iter().map(|q| q.session).collect()
    }
}

/// The cache and its lock, with the signal of finished staging reads: what
/// every thread that reads or changes the cache shares.
pub struct Cache {
    /// Shared for the common case of lookup, acquire and release
    /// ([`Cache::read`]), exclusive for everything else ([`Cache::write`]).
    state: RwLock<CacheState>,
    /// Bumped and signalled whenever staging reads finish (acquires waiting
    /// on a block another lease is staging wake up); see [`Cache::wait_staged`].
    staged: (Mutex<u64>, Condvar),
}

impl Cache {
    pub fn new(state: CacheState) -> Cache {
        Cache {
            state: RwLock::new(state),
            staged: (Mutex::new(0), Condvar::new()),
        }
    }

    /// The cache lock, exclusive. The policy first catches up with the hits
    /// of lookups made under the shared lock (`CacheState::apply_touches`), so
    /// every decision made under this guard sees them. A panic while holding
    /// the lock is a Manager bug; the state is still consistent at every
    /// `CacheState` method boundary, so recover it.
    #[inline]
    pub fn write(&self) -> RwLockWriteGuard<'_, CacheState> {
        let mut g = self.state.write().unwrap_or_else(|p| p.into_inner());
        g.apply_touches();
        g
    }

    /// The cache lock, shared: only for `CacheState`'s `&self` operations
    /// (`lookup_shared`, `try_acquire_shared`, `try_release_shared`, status).
    /// Many sessions hold it at once; a preempted holder stalls no other reader.
    #[inline]
    pub fn read(&self) -> RwLockReadGuard<'_, CacheState> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Give up the exclusive guard and wait (up to 100 ms) until a staging
    /// read finishes. The epoch is read before the guard is dropped, and
    /// stagers bump it after updating the cache, so no wake-up is lost.
    pub fn wait_staged(&self, cache: RwLockWriteGuard<'_, CacheState>) {
        let (m, cv) = &self.staged;
        let seen = *m.lock().unwrap_or_else(|p| p.into_inner());
        drop(cache);
        let g = m.lock().unwrap_or_else(|p| p.into_inner());
        let _unused = cv.wait_timeout_while(g, Duration::from_millis(100), |epoch| *epoch == seen);
    }

    /// Staging reads finished (after their results are in the cache).
    pub fn notify_staged(&self) {
        let (m, cv) = &self.staged;
        *m.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        cv.notify_all();
    }
}

/// The DRAM arena's segments and the cache that decides who may touch which
/// of their slots: what moving blocks into or out of slots needs (staging,
/// spills, peer fills).
#[derive(Clone, Copy)]
pub struct Arena<'a> {
    pub cache: &'a Cache,
    pub segments: &'a [Segment],
}

/// The `--max-connections` places and the `--max-buffered-bytes` budget of
/// incomplete frame bodies (see `framing::PeerReader`), shared by all connections.
#[derive(Debug, Default)]
pub struct Connections {
    /// Connections with a live session thread (bounded by `max_connections`).
    live: AtomicUsize,
    /// Bytes of incomplete frame bodies charged to `--max-buffered-bytes`.
    frame_bytes: AtomicUsize,
}

impl Connections {
    /// Take one of `limit` places; `false` (nothing taken) when all are in use.
    pub fn try_take_place(&self, limit: usize) -> bool {
        if self.live.fetch_add(1, Ordering::AcqRel) >= limit {
            self.live.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        true
    }

    /// Give back a place taken by [`Connections::try_take_place`].
    pub fn give_back_place(&self) {
        self.live.fetch_sub(1, Ordering::AcqRel);
    }

    /// Connections with a live session thread.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// Charge `bytes` to the budget of `limit` bytes, or `Err` with the bytes
    /// in use when that would exceed it (nothing is charged then).
    pub fn charge_frame_bytes(&self, bytes: usize, limit: usize) -> Result<(), usize> {
        self.frame_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                cur.checked_add(bytes).filter(|n| *n <= limit)
            })
            .map(|_| ())
    }

    /// Return `bytes` charged by [`Connections::charge_frame_bytes`].
    pub fn refund_frame_bytes(&self, bytes: usize) {
        self.frame_bytes.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Bytes of incomplete frame bodies charged now.
    pub fn frame_bytes(&self) -> usize {
        self.frame_bytes.load(Ordering::Relaxed)
    }
}

/// Failures armed by `InjectFault` (`--enable-fault-injection`): how many of
/// the next restores and commits fail.
#[derive(Debug, Default)]
pub struct Faults {
    restore: AtomicU32,
    commit: AtomicU32,
}

impl Faults {
    pub fn arm(&self, restore_failures: u32, commit_failures: u32) {
        self.restore.store(restore_failures, Ordering::Release);
        self.commit.store(commit_failures, Ordering::Release);
    }

    /// Whether some restore failure is armed.
    #[inline]
    pub fn restore_armed(&self) -> bool {
        self.restore.load(Ordering::Acquire) != 0
    }

    /// Use up one armed restore failure: `true` when one was armed.
    #[inline]
    pub fn take_restore(&self) -> bool {
        Self::take(&self.restore)
    }

    /// Use up one armed commit failure: `true` when one was armed.
    #[inline]
    pub fn take_commit(&self) -> bool {
        Self::take(&self.commit)
    }

    #[inline]
    fn take(armed: &AtomicU32) -> bool {
        armed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// The Manager's stop flag: set once by `Manager::shutdown`, polled by every
/// service thread.
#[derive(Debug, Default)]
pub struct Shutdown(AtomicBool);

impl Shutdown {
    pub fn request(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn requested(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// The Manager's monotonic clock, started with it.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    started: Instant,
}

impl Clock {
    pub(super) fn start() -> Clock {
        Clock {
            started: Instant::now(),
        }
    }

    /// Milliseconds since start (the TP leases' deadlines).
    pub fn now_ms(self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Whole seconds since start.
    pub fn uptime_s(self) -> u64 {
        self.started.elapsed().as_secs()
    }
}
